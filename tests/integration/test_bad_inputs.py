"""A corpus of bad inputs: each is one line naming the file and key (or the argument), exit 2,
no traceback, nothing written and nothing started.

Every case gets its own temp dir as the working directory (so the default ./runs would land
there) and is checked for the four criteria: the exit code is 2; stderr is exactly one line
holding the expected fragments (the file, the key or flag, what is expected); no "Traceback";
the dir's file tree (names, sizes, mtimes) is unchanged, so no runs dir was created and no file
replaced; and the study's port is still free (no server was started).

Cases prone to tracebacks (encodings, storage URLs, paths, every subcommand's arguments) run as
processes of their own, four at a time: the first of each subcommand (and the read-only ones,
under setpriv) as a fresh `python -m tuner`, the rest forked by a server that imported tuner
once (tests/helpers/forkcli.py: the same `__main__`, its own session, cwd, environment and
stderr, the interpreter's own exit; ~0.1-0.5 s of CPU a case instead of 1-2 s). The study-file
content cases, which all go through the same `load_study`, run in-process through
`tuner.cli.main` (their key fragments keep a wrong early error from passing). The module prints
the corpus size and the pass count.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import io
import os
import queue
import resource
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.forkcli import ForkCLI
from tests.helpers.net import free_port
from tests.helpers.studies import REPO, TUNER, tuner_env
from tuner.cli import main as tuner_main
from tuner.config.workload import KINDS_OF_KEY

#: the password planted in storage URLs: it must never be printed
PASSWORD = "hunter2-planted-secret"
#: root ignores file modes: read-only cases run without the capabilities that bypass them
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
#: a password with the characters that defeat naive masking (`/`, `@`)
ODD_PASSWORD = "hun/ter@2-planted"
#: a case that runs longer has hung (each takes ~1-3 s, ~10 s on a busy machine)
CASE_TIMEOUT_S = 60
MEMORY_LIMIT = 3 << 30
#: every case reads one module fixture that runs all the subprocess cases (0.1-2 s of CPU each):
#: keep the module on one xdist worker (pyproject's `--dist loadgroup`), so it runs them once
pytestmark = pytest.mark.xdist_group("bad-inputs")
#: a YAML alias bomb: 10 lists of 10 ... (9 levels) is 10**9 items by reference
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
)


def base_study() -> dict[str, Any]:
    """A valid small study (the demo's shape) on a free port."""
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["study"] = "bad"
    data["target"]["port"] = free_port()
    return data


@dataclass
class Case:
    """One bad input: `args` after `tuner`, the fragments its one line must hold."""

    id: str
    args: list[str]
    expect: tuple[str, ...]
    #: writes the case's files into its working directory (the study as s.yaml by default)
    setup: Callable[[Path, dict[str, Any]], None] | None = None
    subprocess: bool = True
    no_dac: bool = False  # run without root's permission override (read-only cases)
    forbid: tuple[str, ...] = ()  # fragments that must NOT appear (secrets)
    env: dict[str, str] = field(default_factory=dict)


def as_kind(data: dict[str, Any], kind: str, **workload: Any) -> None:
    """The demo's workload as traffic of `kind`, without the keys that kind refuses (the
    demo's input_len and range_ratio shape a random workload only)."""
    for key, kinds in KINDS_OF_KEY.items():
        if kind not in kinds:
            data["workload"].pop(key, None)
    data["workload"].update(kind=kind, **workload)


def shared_prefix(data: dict[str, Any], **workload: Any) -> None:
    """The demo's workload as shared-prefix traffic."""
    as_kind(data, "shared-prefix", **workload)


def write_study(mutate: Callable[[dict[str, Any]], None] | None = None, name: str = "s.yaml"):
    """A setup that writes the base study, changed by `mutate`, as `name`."""

    def setup(cwd: Path, data: dict[str, Any]) -> None:
        if mutate:
            mutate(data)
        (cwd / name).write_text(yaml.safe_dump(data, sort_keys=False))

    return setup


def raw_file(content: bytes, name: str = "s.yaml"):
    def setup(cwd: Path, data: dict[str, Any]) -> None:
        (cwd / name).write_bytes(content)

    return setup


def both(*setups: Callable[[Path, dict[str, Any]], None]):
    def setup(cwd: Path, data: dict[str, Any]) -> None:
        for s in setups:
            s(cwd, data)

    return setup


def put(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a dotted key of the study (`workload.duration_s`); a value of DROP removes it."""

    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split("/") if "/" in path else path.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        if parents == ["server"]:
            # a fixed flag must not also be searched: that error would come first
            data["space"].pop(last, None)
            (data.get("baseline") or {}).pop(last, None)
        if value is DROP:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)

    return mutate


DROP = object()


def study_case(
    id: str, path: str, value: Any, *expect: str, sub: bool = False, cmd: str = "status"
) -> Case:
    """A study-file case: the key `path` set to `value` (keys with dots use `/` as separator)."""
    return Case(id, [cmd, "s.yaml"], ("s.yaml", *expect), write_study(put(path, value)), sub)


def mkdir(*names: str, mode: int | None = None):
    def setup(cwd: Path, data: dict[str, Any]) -> None:
        for n in names:
            (cwd / n).mkdir(parents=True, exist_ok=True)
            if mode is not None:
                (cwd / n).chmod(mode)

    return setup


def touch(name: str, content: bytes = b""):
    def setup(cwd: Path, data: dict[str, Any]) -> None:
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_bytes(content)

    return setup


def fifo(name: str):
    """A named pipe where a file is expected: opening it to read blocks until a writer comes."""

    def setup(cwd: Path, data: dict[str, Any]) -> None:
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(cwd / name)

    return setup


def _pg_url() -> str:
    return f"postgresql+psycopg2://tuner:{PASSWORD}@127.0.0.1:{free_port()}/optuna"


S = write_study()
MFS = "space.mem-fraction-static"
CONC = "space.concurrency"
JSONL = "workload.kind"


def cases() -> list[Case]:
    c: list[Case] = []
    add = c.append
    # --- study files: existence, encoding, syntax (subprocesses: tracebacks hide here) ---
    add(Case("missing-file", ["tune", "nosuch.yaml"], ("nosuch.yaml", "no such file")))
    add(Case("dir-as-study", ["tune", "d"], ("d", "cannot read"), mkdir("d")))
    add(
        Case(
            "latin1",
            ["tune", "s.yaml"],
            ("s.yaml", "UTF-8"),
            raw_file("study: caf\xe9\n".encode("latin-1")),
        )
    )
    add(
        Case(
            "utf16",
            ["tune", "s.yaml"],
            ("s.yaml", "UTF-8"),
            raw_file("study: x\n".encode("utf-16")),
        )
    )
    add(Case("binary", ["tune", "s.yaml"], ("s.yaml",), raw_file(bytes(range(256)))))
    add(Case("empty-file", ["tune", "s.yaml"], ("s.yaml", "empty"), raw_file(b"")))
    add(Case("blank-file", ["status", "s.yaml"], ("s.yaml", "empty"), raw_file(b"\n  \n")))
    add(
        Case(
            "yaml-syntax", ["tune", "s.yaml"], ("s.yaml:", "invalid YAML"), raw_file(b"study: [\n")
        )
    )
    add(
        Case(
            "yaml-tab",
            ["tune", "s.yaml"],
            ("s.yaml:", "invalid YAML"),
            raw_file(b"study: x\n\tserver: 1\n"),
        )
    )
    add(
        Case(
            "yaml-dup-key",
            ["tune", "s.yaml"],
            ("s.yaml:", "duplicate key"),
            raw_file(b"study: a\nstudy: b\n"),
        )
    )
    add(
        Case(
            "yaml-python-tag",
            ["tune", "s.yaml"],
            ("s.yaml:", "invalid YAML"),
            raw_file(b"study: !!python/object:os.system x\n"),
        )
    )
    add(Case("top-list", ["tune", "s.yaml"], ("s.yaml", "mapping"), raw_file(b"- a\n- b\n")))
    add(Case("top-scalar", ["status", "s.yaml"], ("s.yaml", "mapping"), raw_file(b"42\n")))
    # --- study files: types and schema (in-process, through load_study) ---
    add(
        study_case(
            "n-trials-true", "budget.n_trials", True, "budget.n_trials", sub=True, cmd="tune"
        )
    )
    add(study_case("n-trials-str", "budget.n_trials", "20", "budget.n_trials"))
    add(study_case("n-trials-float", "budget.n_trials", 2.5, "budget.n_trials"))
    add(study_case("port-str", "target.port", "30000", "target.port"))
    add(study_case("port-zero", "target.port", 0, "target.port"))
    add(study_case("port-big", "target.port", 70000, "target.port", sub=True, cmd="tune"))
    add(study_case("study-slash", "study", "a/b", "study"))
    add(study_case("study-missing", "study", DROP, "study", "required"))
    add(study_case("server-missing", "server", DROP, "server", "required"))
    add(study_case("space-missing", "space", DROP, "space", "required"))
    add(study_case("server-list", "server", ["model-path"], "server"))
    add(study_case("space-scalar", "space.mem-fraction-static", 0.9, MFS))
    add(study_case("unknown-top", "colour", "blue", "colour", "unknown key"))
    add(study_case("unknown-workload", "workload.inputlen", 5, "workload.inputlen", "unknown key"))
    add(study_case("unknown-ssh", "target.ssh.passwd", "x", "target.ssh.passwd", "unknown key"))
    add(study_case("sampler-name", "sampler.name", "cmaes", "sampler.name"))
    add(study_case("metric", "objective.metric", "speed", "objective.metric"))
    add(study_case("workload-kind", "workload.kind", "zipf", "workload.kind"))
    add(study_case("stream-str", "workload.stream", "yes", "workload.stream"))
    add(study_case("ready-str", "target.timeouts.ready_s", "fast", "target.timeouts.ready_s"))
    add(study_case("timeout-words", "budget.timeout", "eight hours", "budget.timeout"))
    add(study_case("timeout-zero", "budget.timeout", 0, "budget.timeout"))
    add(study_case("timeout-30d", "budget.timeout", "30d", "budget.timeout", "7d"))
    add(
        study_case(
            "trial-timeout-inf", "budget.trial_timeout", float("inf"), "budget.trial_timeout"
        )
    )
    add(study_case("trial-timeout-neg", "budget.trial_timeout", -5, "budget.trial_timeout"))
    add(study_case("server-port", "server.port", 1, "server.port", "target.port"))
    add(study_case("outage-neg", "budget.outage_tolerance", "-5m", "budget.outage_tolerance"))
    add(study_case("outage-8d", "budget.outage_tolerance", "8d", "budget.outage_tolerance", "7d"))
    add(study_case("seed-neg", "sampler.seed", -1, "sampler.seed"))
    add(study_case("seed-huge", "sampler.seed", 2**40, "sampler.seed"))
    add(study_case("confirm-neg", "budget.confirm_top", -1, "budget.confirm_top"))
    add(
        study_case(
            "runaway-zero",
            "budget.max_consecutive_infra_failures",
            0,
            "budget.max_consecutive_infra_failures",
        )
    )
    add(study_case("launch-empty", "target.launch", [], "target.launch"))
    add(study_case("env-name", "target.env", {"A-B": "1"}, "target.env"))
    add(
        study_case(
            "ssh-timeout-nan",
            "target.ssh.connect_timeout_s",
            float("nan"),
            "target.ssh.connect_timeout_s",
        )
    )
    add(study_case("gpu-mem-neg", "hardware.gpu_mem_mib", -1, "hardware.gpu_mem_mib"))
    add(
        study_case(
            "slo-error-rate", "objective.slo.max_error_rate", 1.5, "objective.slo.max_error_rate"
        )
    )
    # --- search ranges ---
    add(
        study_case(
            "mfs-nan",
            "space.mem-fraction-static",
            {"low": float("nan"), "high": 0.9},
            MFS,
            sub=True,
            cmd="tune",
        )
    )
    add(study_case("mfs-inf", "space.mem-fraction-static", {"low": 0.8, "high": float("inf")}, MFS))
    add(
        study_case(
            "mfs-neg",
            "space.mem-fraction-static",
            {"low": -0.1, "high": 0.9},
            MFS,
            "fraction",
            sub=True,
            cmd="tune",
        )
    )
    add(
        study_case(
            "mfs-above-1", "space.mem-fraction-static", {"low": 0.8, "high": 1.5}, MFS, "fraction"
        )
    )
    add(
        study_case(
            "mfs-reversed", "space.mem-fraction-static", {"low": 0.95, "high": 0.9}, MFS, "below"
        )
    )
    add(study_case("mfs-equal", "space.mem-fraction-static", {"low": 0.9, "high": 0.9}, MFS))
    add(
        study_case(
            "mfs-step-zero", "space.mem-fraction-static", {"low": 0.8, "high": 0.9, "step": 0}, MFS
        )
    )
    add(
        study_case(
            "mfs-step-neg",
            "space.mem-fraction-static",
            {"low": 0.8, "high": 0.9, "step": -0.01},
            MFS,
        )
    )
    add(
        study_case(
            "conc-neg", "space.concurrency", {"low": -4, "high": 8}, CONC, sub=True, cmd="tune"
        )
    )
    add(study_case("conc-zero-log", "space.concurrency", {"low": 0, "high": 8, "log": True}, CONC))
    add(study_case("conc-huge", "space.concurrency", {"low": 1, "high": 10**6}, CONC))
    add(study_case("conc-fraction", "space.concurrency", {"low": 1.5, "high": 8}, CONC))
    add(study_case("rate-zero", "space.request-rate", {"low": 0, "high": 8}, "space.request-rate"))
    add(
        study_case(
            "hicache-fraction",
            "space.hicache-size",
            {"low": 0, "high": 10.5},
            "space.hicache-size",
            "int",
            sub=True,
            cmd="tune",
        )
    )
    add(
        study_case(
            "hicache-neg", "space.hicache-size", {"low": -8, "high": 8}, "space.hicache-size"
        )
    )
    add(
        study_case(
            "hicache-choice-frac", "space.hicache-size", {"choices": [0, 1.5]}, "space.hicache-size"
        )
    )
    add(
        study_case(
            "policy-choice",
            "space.schedule-policy",
            {"choices": ["fcfs", "bogus"]},
            "space.schedule-policy",
            "lpm",
        )
    )
    add(
        study_case(
            "switch-range",
            "space.disable-radix-cache",
            {"low": 0, "high": 1},
            "space.disable-radix-cache",
            "switch",
        )
    )
    add(
        study_case(
            "choices-empty", "space.schedule-policy", {"choices": []}, "space.schedule-policy"
        )
    )
    add(
        study_case(
            "when-unknown",
            "space.mem-fraction-static",
            {"low": 0.8, "high": 0.9, "when": {"nothing": 1}},
            MFS,
        )
    )

    def circular(d: dict[str, Any]) -> None:
        # two server flags (a server flag may not depend on the client's concurrency at all)
        d["space"]["mem-fraction-static"]["when"] = {"chunked-prefill-size": {"gt": 1}}
        d["space"]["chunked-prefill-size"] = {
            "choices": [4096, 8192],
            "when": {"mem-fraction-static": {"gt": 0.5}},
        }
        d.pop("baseline")

    add(
        Case(
            "when-circular",
            ["status", "s.yaml"],
            ("s.yaml", "space", "circular"),
            write_study(circular),
            False,
        )
    )
    # --- server flags: names, values, secrets ---
    add(
        study_case(
            "srv-mfs-1.5",
            "server.mem-fraction-static",
            1.5,
            "server.mem-fraction-static",
            sub=True,
            cmd="tune",
        )
    )
    add(
        study_case(
            "srv-mfs-nan", "server.mem-fraction-static", float("nan"), "server.mem-fraction-static"
        )
    )
    add(
        study_case(
            "srv-hicache-frac",
            "server.hicache-size",
            1.5,
            "server.hicache-size",
            "int",
            sub=True,
            cmd="tune",
        )
    )
    add(study_case("srv-tp-true", "server.tp", True, "server.tp"))
    add(
        study_case(
            "srv-unknown",
            "server.bogus-flag",
            1,
            "server.bogus-flag",
            "unknown",
            sub=True,
            cmd="tune",
        )
    )
    add(
        study_case(
            "space-near-miss",
            "space.mem-fractoin-static",
            {"low": 0.8, "high": 0.9},
            "space.mem-fractoin-static",
            "did you mean mem-fraction-static",
            sub=True,
            cmd="tune",
        )
    )
    add(
        study_case(
            "srv-near-miss",
            "server.enable-metircs",
            True,
            "server.enable-metircs",
            "did you mean enable-metrics",
        )
    )
    add(
        study_case(
            "srv-choice", "server.schedule-policy", "bogus", "server.schedule-policy", "fcfs"
        )
    )
    add(
        study_case(
            "srv-switch-str",
            "server.enable-metrics",
            "yes",
            "server.enable-metrics",
            "true or false",
        )
    )
    add(study_case("srv-port", "server.port", 99999, "server.port"))
    add(study_case("srv-underscore", "server.mem_fraction_static", 0.8, "server", "dashed"))
    add(study_case("srv-dashes", "server.--tp", 2, "server", "dashes"))
    add(study_case("srv-dict", "server.tp", {"a": 1}, "server.tp"))
    add(study_case("srv-null", "server.tp", None, "server.tp"))
    add(study_case("srv-list-frac", "server.cuda-graph-bs", [1, 2.5], "server.cuda-graph-bs"))
    add(study_case("srv-list-single", "server.tp", [1, 2], "server.tp", "one value"))
    add(study_case("srv-mrr-neg", "server.max-running-requests", -5, "server.max-running-requests"))
    add(study_case("srv-chunked", "server.chunked-prefill-size", -2, "server.chunked-prefill-size"))
    add(study_case("srv-concurrency", "server.concurrency", 8, "server.concurrency", "space"))
    add(
        Case(
            "srv-dup",
            ["status", "s.yaml"],
            ("s.yaml", "server", "same flag"),
            write_study(lambda d: d["server"].update({"tp": 1, "tensor-parallel-size": 1})),
            False,
        )
    )
    add(study_case("srv-no-model", "server.model-path", DROP, "server", "model-path"))
    add(
        Case(
            "space-and-server",
            ["status", "s.yaml"],
            ("s.yaml", "space", "one place"),
            write_study(lambda d: d["server"].update({"mem-fraction-static": 0.8})),
            False,
        )
    )
    secret = "plantedvalue123"
    for name in ("api-key", "admin-api-key", "hf-token", "db-password", "client-secret"):
        add(
            Case(
                f"secret-{name}",
                ["tune", "s.yaml"],
                ("s.yaml", f"server.{name}", "api_key_env"),
                write_study(put(f"server.{name}", secret)),
                name in ("api-key", "hf-token"),
                forbid=(secret,),
            )
        )
    add(
        study_case(
            "secret-space", "space.api-key", {"choices": ["a", "b"]}, "space.api-key", "api_key_env"
        )
    )
    # --- baselines ---
    add(
        study_case(
            "base-mfs-out",
            "baseline.mem-fraction-static",
            1.2,
            "baseline.mem-fraction-static",
            "outside",
            sub=True,
            cmd="tune",
        )
    )
    add(
        study_case(
            "base-mfs-grid",
            "baseline.mem-fraction-static",
            0.835,
            "baseline.mem-fraction-static",
            "grid",
        )
    )
    add(study_case("base-conc-frac", "baseline.concurrency", 3.5, "baseline.concurrency", "whole"))
    add(
        study_case(
            "base-conc-high", "baseline.concurrency", 1000, "baseline.concurrency", "outside"
        )
    )
    add(study_case("base-str", "baseline.concurrency", "high", "baseline.concurrency"))
    add(study_case("base-unknown", "baseline.tp", 2, "baseline", "not a searched"))
    add(
        Case(
            "base-choice",
            ["status", "s.yaml"],
            ("s.yaml", "baseline.schedule-policy", "choices"),
            write_study(
                lambda d: (
                    d["space"].update({"schedule-policy": {"choices": ["fcfs", "lpm"]}}),
                    d["baseline"].update({"schedule-policy": "random"}),
                )
            ),
            False,
        )
    )
    # --- workload ---
    add(
        study_case(
            "dur-inf",
            "workload.duration_s",
            float("inf"),
            "workload.duration_s",
            sub=True,
            cmd="tune",
        )
    )
    add(study_case("dur-neg", "workload.duration_s", -1, "workload.duration_s"))
    add(study_case("dur-huge", "workload.duration_s", 1e9, "workload.duration_s"))
    add(
        study_case(
            "dur-over-trial", "workload.duration_s", 600, "workload.duration_s", "trial_timeout"
        )
    )
    add(
        study_case(
            "input-1e9", "workload.input_len", 10**9, "workload.input_len", sub=True, cmd="tune"
        )
    )
    add(study_case("input-context", "workload.input_len", 200_000, "workload.input_len", "context"))
    add(study_case("output-zero", "workload.output_len", 0, "workload.output_len"))
    add(study_case("num-req-zero", "workload.num_requests", 0, "workload.num_requests"))
    add(
        Case(
            "pool-tokens",
            ["tune", "s.yaml"],
            ("s.yaml", "workload.input_len", "memory"),
            write_study(lambda d: d["workload"].update(num_requests=1_000_000, input_len=100_000)),
        )
    )
    add(
        Case(
            "prefix-pool",
            ["status", "s.yaml"],
            ("s.yaml", "workload.prefix_len"),
            write_study(lambda d: shared_prefix(d, prefix_len=100_000, num_groups=512)),
            False,
        )
    )
    add(
        Case(
            "multi-turn-context",
            ["status", "s.yaml"],
            ("s.yaml", "workload.turns", "context"),
            write_study(
                lambda d: d["workload"].update(kind="multi-turn", turns=1000, output_len=1000)
            ),
            False,
        )
    )
    add(study_case("range-ratio", "workload.range_ratio", 1.5, "workload.range_ratio"))
    add(study_case("rate-nan", "workload.request_rate", float("nan"), "workload.request_rate"))
    add(study_case("rate-neg", "workload.request_rate", -1, "workload.request_rate"))
    add(study_case("error-rate", "workload.max_error_rate", 2, "workload.max_error_rate"))
    add(study_case("sharegpt-no-file", "workload.kind", "sharegpt", "workload", "dataset"))
    add(
        study_case(
            "ttft-window", "objective.slo.p99_ttft_ms", 9000, "objective", "cannot be observed"
        )
    )
    add(
        study_case(
            "model-config-missing",
            "hardware.model_config",
            "nosuch-model",
            "nosuch-model",
            sub=True,
            cmd="tune",
        )
    )

    def dataset(content: bytes, name: str = "data.jsonl"):
        def mutate(d: dict[str, Any]) -> None:
            as_kind(d, "jsonl", dataset=name)

        return both(touch(name, content), write_study(mutate))

    add(
        Case(
            "ds-missing",
            ["tune", "s.yaml"],
            ("nope.jsonl",),
            write_study(lambda d: as_kind(d, "jsonl", dataset="nope.jsonl")),
        )
    )
    add(
        Case(
            "ds-latin1",
            ["tune", "s.yaml"],
            ("data.jsonl", "UTF-8"),
            dataset('{"prompt": "caf\xe9"}\n'.encode("latin-1")),
        )
    )
    add(
        Case(
            "ds-bad-json",
            ["tune", "s.yaml"],
            ("data.jsonl:2", "JSON"),
            dataset(b'{"prompt": "a"}\n{oops\n'),
        )
    )
    add(
        Case(
            "ds-no-prompt",
            ["tune", "s.yaml"],
            ("data.jsonl:1", "prompt"),
            dataset(b'{"text": "a"}\n'),
        )
    )
    add(Case("ds-empty", ["tune", "s.yaml"], ("data.jsonl", "no records"), dataset(b"")))
    add(
        Case(
            "ds-dir",
            ["tune", "s.yaml"],
            ("ddir", "cannot read"),
            both(
                mkdir("ddir"),
                write_study(lambda d: as_kind(d, "jsonl", dataset="ddir")),
            ),
        )
    )
    # --- storage URLs (the password never printed) ---
    for cid, url, frag in (
        ("st-dialect", "mongodb://u@127.0.0.1/x", "unknown database kind"),
        ("st-unparsable", "not a url at all", "cannot parse"),
        ("st-empty-scheme", "://x", "cannot parse"),
        ("st-pg-down", "PG", "cannot open"),
        ("st-mysql-driver", f"mysql://u:{PASSWORD}@127.0.0.1/x", "--storage"),
        ("st-memory", "sqlite:///:memory:", "in-memory"),
        ("st-sqlite-dir", "sqlite:///adir", "directory"),
        ("st-sqlite-empty", "sqlite:///e.db", "empty"),
    ):
        setup = both(S, mkdir("adir"), touch("e.db"))
        add(
            Case(
                cid,
                ["tune", "s.yaml", "--storage", url],
                ("--storage", frag),
                setup,
                forbid=(PASSWORD,),
            )
        )
    add(
        Case(
            "st-pg-status",
            ["status", "s.yaml", "--storage", "PG"],
            ("--storage", "cannot open"),
            S,
            forbid=(PASSWORD,),
        )
    )
    add(
        Case(
            "st-file-key",
            ["tune", "s.yaml"],
            ("s.yaml", "storage", "unknown database kind"),
            write_study(put("storage", f"bogus://u:{PASSWORD}@h/x")),
            forbid=(PASSWORD,),
        )
    )
    add(
        Case(
            "db-empty",
            ["tune", "s.yaml"],
            ("runs/bad/study.db", "empty"),
            both(S, touch("runs/bad/study.db")),
        )
    )
    add(
        Case(
            "db-empty-status",
            ["status", "s.yaml"],
            ("study.db", "empty"),
            both(S, touch("runs/bad/study.db")),
        )
    )
    add(
        Case(
            "db-text",
            ["tune", "s.yaml"],
            ("study.db", "not a SQLite"),
            both(S, touch("runs/bad/study.db", b"hello\n" * 100)),
        )
    )
    add(
        Case(
            "db-damaged",
            ["tune", "s.yaml"],
            ("study.db", "not a database"),
            both(S, touch("runs/bad/study.db", b"SQLite format 3\x00" + bytes(range(256)) * 20)),
        )
    )
    add(
        Case(
            "db-is-dir",
            ["tune", "s.yaml"],
            ("study.db", "directory"),
            both(S, mkdir("runs/bad/study.db")),
        )
    )
    # --- runs dirs ---
    add(
        Case(
            "runs-file",
            ["tune", "s.yaml", "--runs-dir", "f"],
            ("--runs-dir", "not a directory"),
            both(S, touch("f")),
        )
    )
    add(
        Case(
            "runs-under-file",
            ["tune", "s.yaml", "--runs-dir", "f/runs"],
            ("--runs-dir",),
            both(S, touch("f")),
        )
    )
    add(
        Case(
            "runs-study-file",
            ["tune", "s.yaml"],
            ("--runs-dir", "not a directory"),
            both(S, touch("runs/bad")),
        )
    )
    add(
        Case(
            "runs-readonly",
            ["tune", "s.yaml", "--runs-dir", "ro"],
            ("--runs-dir", "not writable"),
            both(S, mkdir("ro", mode=0o555)),
            no_dac=True,
        )
    )
    add(
        Case(
            "runs-under-readonly",
            ["tune", "s.yaml", "--runs-dir", "ro/runs"],
            ("--runs-dir", "not writable"),
            both(S, mkdir("ro", mode=0o555)),
            no_dac=True,
        )
    )
    add(
        Case(
            "status-runs-file",
            ["status", "s.yaml", "--runs-dir", "f"],
            ("--runs-dir", "not a directory"),
            both(S, touch("f")),
        )
    )
    # --- every subcommand's arguments ---
    for cid, args, frag in (
        ("tune-n-zero", ["--n-trials", "0"], "--n-trials"),
        ("tune-n-neg", ["--n-trials", "-3"], "--n-trials"),
        ("tune-n-abc", ["--n-trials", "abc"], "--n-trials"),
        ("tune-timeout-zero", ["--timeout", "0"], "--timeout"),
        ("tune-timeout-words", ["--timeout", "forever"], "--timeout"),
        ("tune-timeout-30d", ["--timeout", "30d"], "--timeout"),
        ("tune-seed-neg", ["--seed", "-1"], "--seed"),
        ("tune-worker-empty", ["--worker", ""], "--worker"),
        ("tune-unknown-flag", ["--bogus"], "--bogus"),
    ):
        add(Case(cid, ["tune", "s.yaml", *args], (frag,), S))
    add(Case("tune-no-file-arg", ["tune"], ("STUDY.yaml",)))
    add(Case("status-extra-arg", ["status", "s.yaml", "extra"], ("extra",), S))
    add(Case("export-o-nodir", ["export", "s.yaml", "-o", "nodir/x.yaml"], ("-o", "nodir"), S))
    add(
        Case(
            "export-o-dir",
            ["export", "s.yaml", "-o", "adir"],
            ("-o", "directory"),
            both(S, mkdir("adir")),
        )
    )
    add(
        Case(
            "export-o-readonly",
            ["export", "s.yaml", "-o", "ro/x.yaml"],
            ("-o", "not writable"),
            both(S, mkdir("ro", mode=0o555)),
            no_dac=True,
        )
    )
    add(Case("export-format", ["export", "s.yaml", "--format", "xml"], ("--format", "xml"), S))
    add(Case("report-o-nodir", ["report", "s.yaml", "-o", "nodir/r.html"], ("-o", "nodir"), S))
    add(
        Case(
            "report-o-dir",
            ["report", "s.yaml", "-o", "adir"],
            ("-o", "directory"),
            both(S, mkdir("adir")),
        )
    )
    cap = ["capacity", "--model-config", "llama-3.1-8b"]
    for cid, args, frag in (
        ("cap-no-model", ["capacity"], "--model-config"),
        ("cap-model-missing", ["capacity", "--model-config", "nosuch"], "nosuch"),
        ("cap-tp-zero", [*cap, "--tp", "0"], "--tp"),
        ("cap-mfs-above", [*cap, "--mfs", "1.5"], "--mfs"),
        ("cap-mfs-nan", [*cap, "--mfs", "nan"], "--mfs"),
        ("cap-gpu-inf", [*cap, "--gpu-mem-mib", "inf"], "--gpu-mem-mib"),
        ("cap-gpu-1e308", [*cap, "--gpu-mem-mib", "1e308"], "--gpu-mem-mib"),
        ("cap-tp-huge", [*cap, "--tp", "9" * 400], "--tp"),
        ("cap-hicache-frac", [*cap, "--hicache-size", "1.5"], "--hicache-size"),
        (
            "cap-weights-exceed-gpu",
            [*cap, "--gpu-mem-mib", "1000", "--weights-gib", "500"],
            "--weights-gib",
        ),
        (
            "cap-observed-exceeds-gpu",
            [
                *cap,
                "--gpu-mem-mib",
                "1000",
                "--observed-tokens",
                "999999999",
                "--observed-mfs",
                "0.5",
            ],
            "--observed-tokens",
        ),
        ("cap-model-latin1", ["capacity", "--model-config", "m.json"], "m.json"),
        ("cap-model-list", ["capacity", "--model-config", "l.json"], "l.json"),
    ):
        setup = both(touch("m.json", '{"x": "caf\xe9"}'.encode("latin-1")), touch("l.json", b"[1]"))
        add(Case(cid, args, (frag,), setup))
    url = ["--url", "http://127.0.0.1:1"]
    for cid, args, frag in (
        ("bench-url-ftp", ["--url", "ftp://x", "--concurrency", "1"], "--url"),
        ("bench-url-port", ["--url", "http://127.0.0.1:99999", "--concurrency", "1"], "--url"),
        ("bench-conc-zero", [*url, "--concurrency", "0"], "--concurrency"),
        ("bench-conc-neg", [*url, "--concurrency", "-5"], "--concurrency"),
        ("bench-dur-inf", [*url, "--concurrency", "1", "--duration", "inf"], "--duration"),
        ("bench-dur-neg", [*url, "--concurrency", "1", "--duration", "-1"], "--duration"),
        (
            "bench-input-huge",
            [*url, "--concurrency", "1", "--input-len", "1000000000"],
            "--input-len",
        ),
        ("bench-pool", [*url, "--concurrency", "1", "--input-len", "500000"], "--input-len"),
        ("bench-json-nodir", [*url, "--concurrency", "1", "--json", "nodir/x.json"], "--json"),
        ("bench-json-dir", [*url, "--concurrency", "1", "--json", "adir"], "--json"),
        ("bench-rate-nan", [*url, "--concurrency", "1", "--request-rate", "nan"], "--request-rate"),
        ("bench-jsonl-no-ds", [*url, "--concurrency", "1", "--workload", "jsonl"], "--dataset"),
        (
            "bench-key-unset",
            [*url, "--concurrency", "1", "--api-key-env", "TUNER_NO_SUCH_VAR"],
            "--api-key-env",
        ),
        (
            "bench-exclusive",
            [*url, "--concurrency", "1", "--duration", "5", "--num-requests", "5"],
            "--num-requests",
        ),
        ("bench-range-ratio", [*url, "--concurrency", "1", "--range-ratio", "2"], "--range-ratio"),
    ):
        add(Case(cid, ["bench", *args], (frag,), mkdir("adir")))
    add(Case("sim-port", ["sim", "--model-path", "m", "--port", "99999"], ("--port",)))
    add(Case("sim-unknown", ["sim", "--model-path", "m", "--bogus-flag"], ("--bogus-flag",)))
    add(
        Case(
            "sim-mfs-abc",
            ["sim", "--model-path", "m", "--mem-fraction-static", "abc"],
            ("--mem-fraction-static",),
        )
    )
    # --- files that are not files: a FIFO blocks, /dev/zero never ends; alias bombs, depth ---
    add(Case("study-fifo", ["status", "s.yaml"], ("s.yaml", "FIFO"), fifo("s.yaml")))
    add(Case("study-devzero", ["tune", "/dev/zero"], ("/dev/zero", "not a regular file")))
    add(
        Case(
            "study-too-big",
            ["tune", "s.yaml"],
            ("s.yaml", "1 MiB"),
            raw_file(b"# padding\n" * 120_000),
        )
    )
    add(
        Case(
            "yaml-deep",
            ["status", "s.yaml"],
            ("s.yaml", "nested too deeply"),
            raw_file(b"study: " + b"[" * 3000 + b"]" * 3000 + b"\n"),
        )
    )
    add(
        Case(
            "yaml-alias-bomb",
            ["status", "s.yaml"],
            ("s.yaml", "study"),
            raw_file((ALIAS_BOMB + "study: *a8\n").encode()),
        )
    )
    add(
        Case(
            "yaml-alias-bomb-choices",
            ["tune", "s.yaml"],
            ("s.yaml", "space.concurrency"),
            raw_file(
                (
                    ALIAS_BOMB + "study: x\nserver: {model-path: m}\n"
                    "space: {concurrency: {choices: *a8}}\n"
                ).encode()
            ),
        )
    )
    add(
        Case(
            "srv-int-key",
            ["status", "s.yaml"],
            ("s.yaml", "server"),
            write_study(lambda d: d["server"].update({1: 2})),
            False,
        )
    )
    add(study_case("study-date", "study", datetime.date(2024, 1, 1), "study", "string"))
    add(
        Case(
            "st-fifo",
            ["status", "s.yaml", "--storage", "sqlite:///f.db"],
            ("--storage", "FIFO"),
            both(S, fifo("f.db")),
        )
    )
    add(
        Case(
            "db-fifo", ["tune", "s.yaml"], ("study.db", "FIFO"), both(S, fifo("runs/bad/study.db"))
        )
    )
    add(
        Case(
            "st-odd-password",
            ["status", "s.yaml", "--storage", f"postgresql://u:{ODD_PASSWORD}@127.0.0.1:x/db"],
            ("--storage", "cannot parse"),
            S,
            forbid=(ODD_PASSWORD, "ter@2"),
        )
    )
    add(Case("st-empty-arg", ["tune", "s.yaml", "--storage", ""], ("--storage", "empty"), S))
    add(Case("runs-empty-arg", ["tune", "s.yaml", "--runs-dir", ""], ("--runs-dir", "empty"), S))
    model = lambda name: put("hardware.model_config", name)  # noqa: E731
    add(
        study_case(
            "mc-devzero", "hardware.model_config", "/dev/zero", "hardware.model_config", "device"
        )
    )
    add(
        Case(
            "mc-fifo",
            ["tune", "s.yaml"],
            ("s.yaml", "hardware.model_config", "FIFO"),
            both(fifo("m.json"), write_study(model("m.json"))),
        )
    )
    add(
        Case(
            "mc-dir-fifo",
            ["status", "s.yaml"],
            ("s.yaml", "hardware.model_config", "md/config.json", "FIFO"),
            both(fifo("md/config.json"), write_study(model("md"))),
        )
    )
    jsonl = lambda name: lambda d: as_kind(d, "jsonl", dataset=name)  # noqa: E731
    add(
        Case(
            "ds-devzero",
            ["tune", "s.yaml"],
            ("/dev/zero", "not a regular file"),
            write_study(jsonl("/dev/zero")),
        )
    )
    add(
        Case(
            "ds-fifo",
            ["tune", "s.yaml"],
            ("d.jsonl", "FIFO"),
            both(fifo("d.jsonl"), write_study(jsonl("d.jsonl"))),
        )
    )
    add(
        Case(
            "cap-devzero",
            ["capacity", "--model-config", "/dev/zero"],
            ("--model-config", "device"),
        )
    )
    add(
        Case(
            "cap-fifo", ["capacity", "--model-config", "m.json"], ("m.json", "FIFO"), fifo("m.json")
        )
    )
    add(
        Case(
            "devzero-bench-dataset",
            ["bench", *url, "--concurrency", "1", "--workload", "jsonl", "--dataset", "/dev/zero"],
            ("/dev/zero", "not a regular file"),
        )
    )
    # --- found by fuzzing the study file: each was a traceback or a run started on nonsense ---
    huge = 10**400  # no float holds it: arithmetic on it overflows
    add(study_case("timeout-list", "budget.timeout", [1, 2], "budget.timeout", "duration"))
    add(study_case("timeout-date", "budget.timeout", datetime.date(2026, 1, 1), "budget.timeout"))
    add(study_case("timeout-arabic-digits", "budget.timeout", "\u0663\u0660m", "budget.timeout"))
    add(study_case("trial-timeout-huge", "budget.trial_timeout", huge, "budget.trial_timeout"))
    add(study_case("baseline-huge", "baseline.concurrency", huge, "baseline.concurrency", "2**53"))
    add(study_case("port-huge", "target.port", huge, "target.port"))
    add(study_case("hicache-huge", "server.hicache-size", huge, "server.hicache-size"))
    add(study_case("confirm-repeats-big", "budget.confirm_repeats", 10**6, "confirm_repeats"))
    add(study_case("n-trials-huge", "budget.n_trials", 2**53, "budget.n_trials"))
    add(study_case("warmup-huge", "workload.warmup_requests", 10**6, "warmup_requests"))
    add(study_case("gpu-mem-1e308", "hardware.gpu_mem_mib", 1e308, "hardware.gpu_mem_mib"))
    add(study_case("weights-1e308", "hardware.weights_gib", 1e308, "hardware.weights_gib"))
    add(study_case("storage-empty", "storage", "", "storage"))
    tiny_step = {"low": 0.8, "high": 0.9, "step": 1e-300}
    add(study_case("step-tiny", MFS, tiny_step, MFS, "points"))
    on_conc = {"low": 0.8, "high": 0.9, "when": {"concurrency": {"gt": 10}}}
    add(study_case("when-on-concurrency", MFS, on_conc, f"{MFS}.when", "inner search"))
    never = {"type": "bool", "when": {"mem-fraction-static": "high"}}
    add(study_case("when-never-holds", "space.enable-mixed-chunk", never, "when", "outside"))
    add(study_case("choices-with-step", CONC, {"choices": [8, 16], "step": 2}, CONC, "step"))
    add(study_case("concurrency-fraction", CONC, {"choices": [1.5, 3]}, CONC, "whole"))

    def lognormal(data: dict[str, Any]) -> None:
        data["workload"].update(length_dist="lognormal", lognormal_sigma=1e308)

    add(
        Case(
            "sigma-1e308",
            ["status", "s.yaml"],
            ("s.yaml", "lognormal_sigma"),
            write_study(lognormal),
            False,
        )
    )

    def big_grid(data: dict[str, Any]) -> None:
        data["sampler"].update(name="grid", grid_points=1000)
        data["space"].update(
            {
                "chunked-prefill-size": {"low": 1024, "high": 16384},
                "max-running-requests": {"low": 8, "high": 1024},
                "schedule-conservativeness": {"low": 0.1, "high": 2.0},
            }
        )

    add(
        Case(
            "grid-huge",
            ["status", "s.yaml"],
            ("s.yaml", "sampler.grid_points", "100,000"),
            write_study(big_grid),
            False,
        )
    )

    def many_groups(data: dict[str, Any]) -> None:
        shared_prefix(data, num_groups=10**7)

    add(
        Case(
            "groups-huge",
            ["status", "s.yaml"],
            ("s.yaml", "workload.num_groups"),
            write_study(many_groups),
            False,
        )
    )
    add(study_case("key-with-escapes", "workload/a\nb\x1b[31m", 1, "a\\nb\\x1b[31m", "unknown key"))
    add(
        Case(
            "yaml-complex-key",
            ["tune", "s.yaml"],
            ("s.yaml:1:", "plain key"),
            raw_file(b"? [a, b]\n: 1\n"),
        )
    )
    long_int = b"study: 1" + b"1" * 5000 + b"\n"
    add(
        Case(
            "yaml-int-5000-digits",
            ["tune", "s.yaml"],
            ("s.yaml:1:", "too long"),
            raw_file(long_int),
        )
    )

    def foreign_db(cwd: Path, data: dict[str, Any]) -> None:
        import sqlite3

        (cwd / "runs" / "bad").mkdir(parents=True)
        with contextlib.closing(sqlite3.connect(cwd / "runs" / "bad" / "study.db")) as db:
            db.execute("CREATE TABLE studies (x INT)")
            db.commit()

    add(
        Case(
            "study-db-foreign",
            ["tune", "s.yaml"],
            ("study.db", "not an optuna study"),
            both(S, foreign_db),
        )
    )
    add(
        Case(
            "trials-is-a-file",
            ["tune", "s.yaml"],
            ("trials", "--runs-dir"),
            both(S, touch("runs/bad/trials")),
        )
    )
    add(
        Case(
            "best-is-a-folder",
            ["tune", "s.yaml"],
            ("best.yaml", "folder"),
            both(S, mkdir("runs/bad/best.yaml")),
        )
    )

    # SSH files: a FIFO hung the night's first connect, binary known_hosts was a traceback
    def ssh_with(**files: str):
        def mutate(data: dict[str, Any]) -> None:
            data["target"].update(host="127.0.0.1", ssh={"port": free_port(), **files})

        return mutate

    for cid, key, make, expect in (
        ("ssh-known-hosts-fifo", "known_hosts", fifo("kh"), "FIFO"),
        ("ssh-known-hosts-binary", "known_hosts", touch("kh", b"x \xff\x00\n"), "UTF-8"),
        ("ssh-config-fifo", "ssh_config", fifo("kh"), "FIFO"),
        ("ssh-config-bad-port", "ssh_config", touch("kh", b"Host *\n  Port many\n"), "Port"),
        ("ssh-identity-dir", "identity_file", mkdir("kh"), "directory"),
        (
            "ssh-known-hosts-device",
            "known_hosts",
            lambda cwd, d: (cwd / "kh").symlink_to("/dev/zero"),
            "device",
        ),
    ):
        files = {key: "kh"}
        if key != "ssh_config":
            files["ssh_config"] = ""  # never the user's own ~/.ssh/config
        add(
            Case(
                cid,
                ["tune", "s.yaml"],
                ("s.yaml", "kh", expect),
                both(make, write_study(ssh_with(**files))),
            )
        )
    unset = {"TUNER_TEST_NO_SUCH_KEY": ""}
    add(
        Case(
            "api-key-env-unset",
            ["tune", "s.yaml"],
            ("s.yaml", "target.api_key_env", "NO_SUCH_KEY_VAR"),
            write_study(put("target.api_key_env", "NO_SUCH_KEY_VAR")),
            env=unset,
        )
    )
    add(Case("no-command", [], ("COMMAND",)))
    add(Case("bad-command", ["bogus"], ("bogus",)))
    return c


#: cheap to run in-process, and safe there: if their check failed to fire they would end in
#: another exit-2 error (no study yet) or a refused connection, never a long run
IN_PROCESS = ("bench-", "cap-tp", "cap-mfs", "cap-gpu", "cap-hicache", "cap-no-model", "report-o-")
IN_PROCESS_IDS = {"export-o-nodir", "export-o-dir", "export-format", "status-extra-arg"}
CASES = [
    replace(c, subprocess=False) if c.id.startswith(IN_PROCESS) or c.id in IN_PROCESS_IDS else c
    for c in cases()
]


# ------------------------------------------------------------------------------------------
# running and judging


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under root -> (mode, size, mtime_ns): any write, creation or removal shows."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Outcome:
    code: int | None
    stderr: str
    before: dict[str, tuple[int, int, int]]
    after: dict[str, tuple[int, int, int]]
    port_free: bool
    raised: str | None = None


def prepare(case: Case, root: Path) -> tuple[Path, int]:
    cwd = root / case.id
    cwd.mkdir(parents=True)
    data = base_study()
    port = data["target"]["port"]  # before a case changes it
    if case.setup:
        case.setup(cwd, data)
    return cwd, port


def run_subprocess(case: Case, root: Path) -> Outcome:
    cwd, port = prepare(case, root)
    args = [a if a != "PG" else _pg_url() for a in case.args]
    prefix = NO_DAC if case.no_dac and os.geteuid() == 0 and shutil.which("setpriv") else []
    before = tree(cwd)
    env = tuner_env(case.env)  # this checkout on PYTHONPATH, as `tuner()` runs it
    proc = subprocess.Popen(
        [*prefix, *TUNER, *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        errors="replace",
        start_new_session=True,  # its own group: a hung case is stopped whole
        preexec_fn=_limit_memory,
    )
    try:
        _, stderr = proc.communicate(timeout=CASE_TIMEOUT_S)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:  # a FIFO read, an endless file: the hang is the finding
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        code, stderr = None, f"timed out after {CASE_TIMEOUT_S} s\n{stderr}"
    return Outcome(code, stderr, before, tree(cwd), port_free(port))


def run_forked(case: Case, root: Path, server: ForkCLI) -> Outcome:
    """The case as `run_subprocess` runs it, forked by a server that imported tuner.cli once."""
    cwd, port = prepare(case, root)
    args = [a if a != "PG" else _pg_url() for a in case.args]
    before = tree(cwd)
    err = root / "_stderr" / f"{case.id}.txt"  # beside the case's dir, not in its tree
    err.parent.mkdir(exist_ok=True)
    code = server.run(args, cwd, tuner_env(case.env), err, CASE_TIMEOUT_S, MEMORY_LIMIT)
    stderr = err.read_text(errors="replace")
    if code is None:  # a FIFO read, an endless file: the hang is the finding
        stderr = f"timed out after {CASE_TIMEOUT_S} s\n{stderr}"
    return Outcome(code, stderr, before, tree(cwd), port_free(port))


def _limit_memory() -> None:
    # reading /dev/zero whole must fail this case, not swap the shared machine
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_in_process(case: Case, root: Path) -> Outcome:
    cwd, port = prepare(case, root)
    before = tree(cwd)
    err = io.StringIO()
    raised = None
    code: int | None
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = tuner_main(case.args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # a traceback in the CLI is exactly what this test looks for
        code, raised = None, f"{type(exc).__name__}: {exc}"
    finally:
        os.chdir(old)
    return Outcome(code, err.getvalue(), before, tree(cwd), port_free(port), raised)


def problems(case: Case, out: Outcome) -> list[str]:
    """Which of the four criteria the outcome breaks (empty: the case passes)."""
    found = []
    if out.raised:
        found.append(f"raised {out.raised}")
    if out.code != 2:
        found.append(f"exit {out.code}, expected 2")
    lines = out.stderr.rstrip("\n").split("\n") if out.stderr.strip() else []
    if len(lines) != 1:
        found.append(f"{len(lines)} stderr lines, expected 1")
    if "Traceback" in out.stderr:
        found.append("a traceback")
    missing = [f for f in case.expect if f not in out.stderr]
    if missing:
        found.append(f"line lacks {missing}")
    leaked = [f for f in case.forbid if f in out.stderr]
    if leaked:
        found.append(f"line shows a secret {leaked}")
    if out.before != out.after:
        changed = sorted(set(out.before.items()) ^ set(out.after.items()))
        found.append(f"files changed: {sorted({k for k, _ in changed})}")
    if not out.port_free:
        found.append("the study's port is held (something was started)")
    return found


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    yield root
    # read-only dirs would stop the temp dir's cleanup
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            (Path(dirpath) / d).chmod(0o755)


#: where the fresh cases' forked twins run, and their key in subprocess_outcomes
TWIN = "forked"


def fresh_ids(cases: list[Case]) -> set[str]:
    """The subprocess cases that run as a fresh `python -m tuner` (the rest are forked): the
    first of each subcommand (an interpreter's start and tuner's import, once per entry
    point), and those that need a wrapper's prefix (read-only: setpriv)."""
    first: dict[str, str] = {}
    for c in cases:
        if c.subprocess:
            first.setdefault(c.args[0] if c.args else "", c.id)
    return set(first.values()) | {c.id for c in cases if c.subprocess and c.no_dac}


@pytest.fixture(scope="module")
def subprocess_outcomes(corpus_root: Path) -> dict[str, Outcome]:
    """Every subprocess case, four at a time: a few as fresh interpreters (~1 s of CPU each),
    the rest forked by four servers that imported tuner once (tests/helpers/forkcli.py). The
    fresh ones are forked too, under TWIN (in a dir of their own), for
    test_a_forked_case_is_a_fresh_one."""
    subs = [c for c in CASES if c.subprocess]
    fresh = fresh_ids(subs)
    twins = [c for c in subs if c.id in fresh and not c.no_dac]
    servers: queue.Queue[ForkCLI] = queue.Queue()
    started = [ForkCLI(tuner_env(), REPO) for _ in range(4)]
    for s in started:
        servers.put(s)

    def run(case: Case, twin: bool = False) -> Outcome:
        if case.id in fresh and not twin:
            return run_subprocess(case, corpus_root)
        server = servers.get()
        try:
            return run_forked(case, corpus_root / TWIN if twin else corpus_root, server)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            outcomes = list(pool.map(run, subs))
            twinned = list(pool.map(lambda c: run(c, twin=True), twins))
    finally:
        for s in started:
            s.close()
    out = {c.id: o for c, o in zip(subs, outcomes, strict=True)}
    return out | {f"{c.id}@{TWIN}": o for c, o in zip(twins, twinned, strict=True)}


RESULTS: dict[str, list[str]] = {}


def test_corpus_size() -> None:
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, corpus_root: Path, subprocess_outcomes: dict[str, Outcome]) -> None:
    out = subprocess_outcomes[case.id] if case.subprocess else run_in_process(case, corpus_root)
    found = problems(case, out)
    RESULTS[case.id] = found
    assert not found, f"{case.args}: {found}; stderr: {out.stderr[-600:]!r}"


def test_the_judge_can_fail(corpus_root: Path) -> None:
    """A good input through the same judge breaks the criteria: the checks are not vacuous."""
    case = Case("judge-valid", ["capacity", "--model-config", "llama-3.1-8b", "--json"], ("x",))
    out = run_subprocess(case, corpus_root)
    assert out.code == 0
    assert problems(case, out)


def test_a_forked_case_is_a_fresh_one(
    corpus_root: Path, subprocess_outcomes: dict[str, Outcome]
) -> None:
    """The cases run as a fresh `python -m tuner` (one per subcommand), forked by the server
    instead, end the same: the same exit code and stderr."""
    fresh = [c for c in CASES if c.id in fresh_ids(CASES) and not c.no_dac]
    assert len({c.args[0] if c.args else "" for c in fresh}) >= 7  # tune, status, ... none
    root = str(corpus_root / TWIN)
    for case in fresh:
        was, forked = subprocess_outcomes[case.id], subprocess_outcomes[f"{case.id}@{TWIN}"]
        assert forked.code == was.code == 2, case.id
        same = forked.stderr.replace(root, "ROOT")
        assert same == was.stderr.replace(str(corpus_root), "ROOT"), case.id


def test_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Last in the file: print the corpus size and the pass count (shown even under -q)."""
    passed = sum(1 for found in RESULTS.values() if not found)
    with capsys.disabled():
        print(f"\nbad-input corpus: {len(CASES)} cases, {passed} of {len(RESULTS)} run passed")
    assert len(CASES) >= 100
