"""Study files and the `tuner` entry point for end-to-end tests (real subprocesses, real files)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.net import free_port
from tests.helpers.paths import REPO

#: `python -m tuner`: this checkout's tuner as a command line, for what `tuner()` cannot run
#: (a background `tuner tune` under Popen, a wrapper's prefix, a CLI form beside another)
TUNER = (sys.executable, "-m", "tuner")

#: the smallest study file parse_study accepts: a name, a model, one searched parameter
MINIMAL_STUDY: dict[str, Any] = {
    "study": "s",
    "server": {"model-path": "m"},
    "space": {"concurrency": {"low": 1, "high": 8}},
}


def study_file(tmp: Path, name: str = "e2e", n_trials: int = 5, **over: object) -> Path:
    """A copy of the demo, made small: short runs, a free port, its own name."""
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["study"] = name
    data["target"]["port"] = free_port()
    data["target"]["launch"] = [
        "{python}",
        "-m",
        "tuner.sim",
        "--sim-profile",
        "llama-3.1-8b-h100",
        "--sim-startup-seconds",
        "0.3",
    ]
    # the server's cwd and its log, pid and exit files: the test's own dir, not the host's /tmp
    data["target"]["workdir"] = str(tmp)
    data["workload"].update(input_len=256, output_len=48, duration_s=2.5, warmup_requests=1)
    data["objective"]["slo"]["p99_ttft_ms"] = 2000
    data["budget"].update(n_trials=n_trials, confirm_top=1, confirm_repeats=1)
    data["baseline"] = {"mem-fraction-static": 0.98, "concurrency": 16}  # certain CUDA-graph OOM
    # these tests follow one load run per trial (phases, kills, probes): concurrency sampled
    data["space"]["concurrency"]["search"] = "joint"
    # up to 64 streams, not 256: a study's load client sharing a busy 2-core machine with
    # another test keeps up (at ~120 streams its event loop lagged past the 250 ms that flags a
    # run as not trusted, and three such trials in a row halt a study)
    data["space"]["concurrency"].update(low=8, high=64)
    _override(data, over)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def study_dict(**over: Any) -> dict[str, Any]:
    """A study file's mapping, as parse_study reads it: MINIMAL_STUDY (study `s`, model `m`,
    concurrency 1-8 searched) with `over` applied, a fresh copy each call.

    `section=value` sets a whole top-level key (`space={...}`, `objective={...}`, `bogus=1`),
    `section__field=value` one field of a section (`budget__n_trials=4`), as `study_file` does;
    a key keeps its place in MINIMAL_STUDY's order, a new one comes after."""
    data = copy.deepcopy(MINIMAL_STUDY)
    _override(data, copy.deepcopy(over))
    return data


def _override(data: dict[str, Any], over: Mapping[str, Any]) -> None:
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[section] = value


def tuner_env(env: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The environment of a `tuner` subprocess: this process's, `env` on top of it (a None value
    unsets that variable), and PYTHONPATH this checkout (its tuner whatever is installed)."""
    out = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    out["PYTHONPATH"] = str(REPO)
    return out


def tuner(
    *args: str,
    timeout: float = 300,
    cwd: Path | str = REPO,
    env: Mapping[str, str | None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m tuner ARGS` run to its end (this checkout's tuner, from any `cwd`): its exit
    code, stdout and stderr as text. `env`: variables set (None: unset) for this run only."""
    return subprocess.run(
        [*TUNER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=tuner_env(env),
    )


def study_trials(study: Path, storage: str) -> list[dict]:
    """`tuner status STUDY --storage URL --json`'s trials (the study as every worker sees it)."""
    out = tuner("status", str(study), "--storage", storage, "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["trials"]


def phase_reached(runs: Path, phase: str) -> bool:
    """Some trial under `runs` logged `phase` (its phases.log: `TIME PHASE` lines)."""
    return any(
        line.split(" ", 1)[-1].strip() == phase
        for log in runs.glob("*/trials/*/phases.log")
        for line in log.read_text().splitlines()
    )


def kill9_when(argv: list[str], err: Path, ready: Callable[[], bool], what: str) -> None:
    """Run `argv` (a `tuner tune`) in its own session, its stderr to `err`; SIGKILL its group
    once `ready()` holds (within 120 s, or the test fails with its stderr's tail)."""
    with open(err, "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=out, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None, f"the first run ended: {err.read_text()[-1500:]}"
            assert time.monotonic() < deadline, f"no {what} within 120 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
