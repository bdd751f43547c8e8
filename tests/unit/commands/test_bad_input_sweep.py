"""A sweep of bad inputs each found misbehaving (a traceback, exit 1 for the user's mistake, a
night started on nonsense, a value silently replaced): now one line naming the file or flag and
the key, exit 2, no traceback, nothing written.

Each case runs `tuner.cli.main` in-process in a fresh working directory (the default ./runs
would land there) and is judged as tests/integration/test_bad_inputs.py judges its corpus: the
exit code, stderr as exactly one line holding the expected fragments, no "Traceback", and the
directory's tree unchanged (names, sizes, mtimes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.paths import REPO
from tuner import cli


def demo(**target: Any) -> dict[str, Any]:
    """The demo study, named `bad`, its target's keys updated by `target`."""
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["study"] = "bad"
    data["target"].update(target)
    return data


def write(cwd: Path, data: dict[str, Any]) -> None:
    (cwd / "s.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under root -> (mode, size, mtime_ns): any write, creation or removal shows."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = (Path(dirpath) / name).lstat()
            out[str((Path(dirpath) / name).relative_to(root))] = (
                st.st_mode,
                st.st_size,
                st.st_mtime_ns,
            )
    return out


def refused(
    cwd: Path,
    args: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *expect: str,
    forbid: tuple[str, ...] = (),
) -> str:
    """Run `tuner ARGS` in `cwd`; assert exit 2, one stderr line holding `expect` (and none of
    `forbid`), no traceback, nothing written. Returns the line."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    before = tree(cwd)
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    err = capsys.readouterr().err
    lines = err.rstrip("\n").split("\n") if err.strip() else []
    assert code == 2, f"exit {code}: {err[-800:]!r}"
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in expect:
        assert fragment in err, (fragment, err)
    for fragment in forbid:
        assert fragment not in err, (fragment, err)
    assert tree(cwd) == before, "something was written"
    return lines[0]


# 1. target: hosts and addresses a night would only fail on -----------------------------------

#: each of these was taken, then failed at the first connection as the world's failure (exit 1,
#: "cannot connect after 3 attempts") or, as http_host, on every trial of a night that wrote runs/
BAD_HOSTS = [
    ("host", "", "got ''"),
    ("host", "gpu 1", "got 'gpu 1'"),
    ("host", "-oProxyCommand=x", "option"),
    ("host", "ssh://gpu-1", "not a URL"),
    ("host", "root@gpu-1", "target.ssh.user"),
    ("host", "gpu-1:2222", "target.ssh.port"),
    ("host", "1.2.3", "not an IPv4 address"),
    ("http_host", "http://127.0.0.1", "not a URL"),
    ("http_host", "127.0.0.1:30000", "target.port"),
    ("http_host", "999.1.1.1", "not an IPv4 address"),
    ("http_host", "[::1]", "without brackets"),
    ("http_host", "", "SSH tunnel"),  # was silently the tunnel
    ("workdir", " ", "/tmp"),  # was silently the host's /tmp
    ("gpus", "0,x", "GPU indexes"),  # CUDA stops reading at 'x': one GPU, not two
    ("gpus", "", "every GPU"),  # was silently every GPU; CUDA reads "" as none
]


@pytest.mark.parametrize(
    ("key", "value", "why"), BAD_HOSTS, ids=[f"{k}={v!r}" for k, v, _ in BAD_HOSTS]
)
def test_a_target_value_that_cannot_work_is_refused_when_read(
    tmp_path: Path, capsys, monkeypatch, key: str, value: str, why: str
) -> None:
    write(tmp_path, demo(**{key: value}))
    # `status` reads the file as `tune` does (config.load), and starts nothing if it did not
    refused(tmp_path, ["status", "s.yaml"], capsys, monkeypatch, "s.yaml", f"target.{key}", why)


def test_a_node_or_a_worker_host_follows_the_same_rule(tmp_path: Path, capsys, monkeypatch) -> None:
    data = demo()
    data["fleet"] = [{"worker": "a", "host": "root@gpu-1"}]
    write(tmp_path, data)
    refused(tmp_path, ["status", "s.yaml"], capsys, monkeypatch, "fleet[0].host", "ssh.user")
    write(tmp_path, demo(nodes=["http://gpu-a", "gpu-b"]))
    refused(tmp_path, ["status", "s.yaml"], capsys, monkeypatch, "target.nodes.0.host", "URL")


GOOD_HOSTS = [
    ("host", "127.0.0.1"),
    ("host", "gpu-1.example.com"),
    ("http_host", "::1"),
    ("http_host", "gpu-1"),
    ("gpus", "0, 1"),
    ("gpus", "GPU-8f6a3c2e-1b2c,MIG-GPU-5c1e/1/0"),
]


@pytest.mark.parametrize(("key", "value"), GOOD_HOSTS, ids=[f"{k}={v!r}" for k, v in GOOD_HOSTS])
def test_real_hosts_and_gpus_still_pass(
    tmp_path: Path, capsys, monkeypatch, key: str, value: str
) -> None:
    """The rule refuses nothing a host or CUDA takes: these reach the storage (no study yet)."""
    write(tmp_path, demo(**{key: value}))
    refused(tmp_path, ["status", "s.yaml"], capsys, monkeypatch, "no study 'bad' yet")


def test_tune_refuses_a_user_at_host_before_connecting(tmp_path: Path, capsys, monkeypatch) -> None:
    """Was exit 1 after three SSH attempts ("cannot connect ... Name or service not known")."""
    write(tmp_path, demo(host="root@gpu-1"))
    refused(tmp_path, ["tune", "s.yaml"], capsys, monkeypatch, "target.host", "target.ssh.user")


# 2. model configs and datasets: JSON that Python refuses to parse, fields of the wrong kind ---

LLAMA = (
    '"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, '
    '"num_key_value_heads": 8'
)
#: each was a traceback (RecursionError, ValueError: 4300 digits, TypeError, OverflowError), or
#: blamed --speculative-num-steps for the model's context length
BAD_CONFIGS = [
    ("deep", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("long-int", '{"num_hidden_layers": ' + "9" * 5000 + "}", "integer too long"),
    ("context-list", "{" + LLAMA + ', "max_position_embeddings": [1]}', "max_position_embeddings"),
    ("context-inf", "{" + LLAMA + ', "max_position_embeddings": 1e400}', "max_position_embeddings"),
    ("context-text", "{" + LLAMA + ', "max_position_embeddings": "x"}', "max_position_embeddings"),
]


@pytest.mark.parametrize(
    ("content", "why"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_capacity_names_a_bad_model_config(
    tmp_path: Path, capsys, monkeypatch, content: str, why: str
) -> None:
    (tmp_path / "m.json").write_text(content)
    line = refused(
        tmp_path, ["capacity", "--model-config", "m.json"], capsys, monkeypatch, "m.json", why
    )
    assert "--speculative-num-steps" not in line


@pytest.mark.parametrize(
    ("content", "why"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_a_study_names_its_bad_model_config(
    tmp_path: Path, capsys, monkeypatch, content: str, why: str
) -> None:
    (tmp_path / "m.json").write_text(content)
    data = demo()
    data["hardware"]["model_config"] = "m.json"
    write(tmp_path, data)
    refused(
        tmp_path, ["status", "s.yaml"], capsys, monkeypatch, "hardware.model_config", "m.json", why
    )


def test_weights_named_as_the_model_config_are_not_read_whole(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A weights file given by mistake was read whole into memory (GBs) before JSON failed."""
    weights = tmp_path / "model.safetensors"
    with weights.open("wb") as f:
        f.truncate(64 << 20)  # sparse: no disk used
    refused(
        tmp_path,
        ["capacity", "--model-config", "model.safetensors"],
        capsys,
        monkeypatch,
        "--model-config",
        "model.safetensors",
        "not a config.json",
    )


@pytest.mark.parametrize("kind", ["jsonl", "sharegpt"])
def test_a_dataset_with_a_too_long_integer_is_one_line(
    tmp_path: Path, capsys, monkeypatch, kind: str
) -> None:
    """Was a traceback (ValueError: Exceeds the limit (4300 digits)) from `tuner tune`; `bench`
    reads the file before connecting, so the port it names never matters."""
    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "max_tokens": ' + "9" * 5000 + "}\n")
    args = ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--no-progress"]
    refused(
        tmp_path,
        [*args, "--workload", kind, "--dataset", "d.jsonl"],
        capsys,
        monkeypatch,
        "d.jsonl:1",
        "integer too long",
    )


# 3. bench: server addresses that failed as "cannot reach" (exit 1), measured nothing (exit 0),
#    printed a password, or were silently replaced by the default ------------------------------

BENCH = ["bench", "--concurrency", "1", "--no-progress"]
BAD_BENCH = [
    ("url-space", ["--url", "http://127.0.0.1 :9"], "--url", "space"),
    ("url-leading-space", ["--url", " http://127.0.0.1:9"], "--url", "space"),
    ("url-query", ["--url", "http://127.0.0.1:9/?x=1"], "--url", "query"),
    ("url-not-ipv4", ["--url", "http://999.0.0.1:9"], "--url", "not an IPv4 address"),
    ("url-and-host", ["--url", "http://127.0.0.1:9", "--host", "127.0.0.1"], "--url", "not both"),
    ("host-url", ["--host", "http://127.0.0.1"], "--host", "not a URL"),
    ("host-empty", ["--host", ""], "--host", "got ''"),
    ("port-zero", ["--port", "0"], "--port", "1..65535"),
    (
        "api-key-env-empty",
        ["--url", "http://127.0.0.1:9", "--api-key-env", ""],
        "--api-key-env",
        "empty",
    ),
    ("model-empty", ["--url", "http://127.0.0.1:9", "--model", ""], "--model", "empty"),
]


@pytest.mark.parametrize(
    ("args", "flag", "why"), [c[1:] for c in BAD_BENCH], ids=[c[0] for c in BAD_BENCH]
)
def test_bench_refuses_an_address_it_cannot_use(
    tmp_path: Path, capsys, monkeypatch, args: list[str], flag: str, why: str
) -> None:
    refused(tmp_path, [*BENCH, *args], capsys, monkeypatch, flag, why)


def test_bench_never_prints_a_password_from_the_url(tmp_path: Path, capsys, monkeypatch) -> None:
    """Was "tuner: failed: cannot reach http://u:hunter2@127.0.0.1:9" (exit 1)."""
    url = "http://u:hunter2-planted@127.0.0.1:9"
    refused(
        tmp_path,
        [*BENCH, "--url", url],
        capsys,
        monkeypatch,
        "--url",
        "--api-key-env",
        forbid=("hunter2",),
    )


# 4. the rest: a database of another optuna, an empty --notify, an endless simulated start ------


def test_a_database_of_another_optuna_version_is_one_line(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Was optuna's RuntimeError as a traceback ("no longer compatible with the table schema")."""
    import sqlite3

    import optuna

    write(tmp_path, demo())
    db = tmp_path / "runs" / "bad" / "study.db"
    db.parent.mkdir(parents=True)
    optuna.storages.RDBStorage(f"sqlite:///{db}").engine.dispose()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'v9.9.9.a'")
    con.close()
    refused(tmp_path, ["status", "s.yaml"], capsys, monkeypatch, "--storage", "study.db", "optuna")


def test_an_empty_notify_command_is_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    """Was taken as no --notify: the file's notify.command (or none) ran, and the night began."""
    write(tmp_path, demo())
    refused(tmp_path, ["tune", "s.yaml", "--notify", ""], capsys, monkeypatch, "--notify", "empty")


@pytest.mark.parametrize("seconds", ["nan", "inf"])
def test_the_simulator_refuses_an_endless_start_up(
    tmp_path: Path, capsys, monkeypatch, seconds: str
) -> None:
    """`tuner sim --sim-startup-seconds nan` started a server that never became ready."""
    args = ["sim", "--model-path", "m", "--port", "9", "--sim-startup-seconds", seconds]
    refused(tmp_path, args, capsys, monkeypatch, "--sim-startup-seconds", "finite")
