"""`tuner check` against the simulator on this machine and through a real sshd: all ok, then one
FAIL at a time; and `tuner tune` refusing to start the night (one line, nothing created)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.net import free_port
from tests.helpers.sshd import Sshd
from tests.helpers.studies import study_file, tuner
from tuner.check.lines import FAIL, OK, SKIP, WARN, CheckLine
from tuner.check.plan import run_checks

#: a stand-in for SGLang 0.5.23's launch_server: its --help is that version's flag table
FAKE_SGLANG = f"""#!{sys.executable}
import argparse
from tuner.sglang.flags import add_to_parser
p = argparse.ArgumentParser(prog="launch_server.py")
add_to_parser(p, "0.5.23")
p.parse_args()
"""
#: nvidia-smi on a host whose one GPU another process already holds
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, 81559, 11000" ;;
  *--query-compute-apps=*) echo "4242, python3, 70000" ;;
  *) exit 2 ;;
esac
"""


def edit(path: Path, **sections: dict) -> Path:
    """Update sections of a study file in place (`target={...}` merges into target:; a key
    set to None is dropped)."""
    data = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
        for key in [k for k, v in values.items() if v is None]:
            del data[section][key]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def ssh_target(sshd: Sshd, workdir: Path, **ssh: object) -> dict:
    """target: values for the test sshd, user files never read."""
    options = {
        "user": "root",
        "port": sshd.port,
        "identity_file": str(sshd.client_key),
        "known_hosts": str(sshd.known_hosts),
        "ssh_config": "",
        "use_agent": False,
        "look_for_keys": False,
        "connect_timeout_s": 5,
        **ssh,
    }
    return {"host": "127.0.0.1", "ssh": options, "workdir": str(workdir)}


def by_name(lines: list[CheckLine]) -> dict[str, CheckLine]:
    return {line.name: line for line in lines}


def fake_bin(tmp: Path, name: str, text: str) -> Path:
    """An executable `name` in tmp/bin; returns the directory (put it first on PATH)."""
    d = tmp / "bin"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    (d / name).chmod(0o755)
    return d


def only_fail(lines: list[CheckLine]) -> CheckLine:
    """The one FAIL line (the test's fault); every other line ok, warn or skip."""
    failed = [line for line in lines if line.status == FAIL]
    assert len(failed) == 1, [(x.name, x.detail) for x in failed]
    return failed[0]


def timed_check(study: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = tuner("check", str(study), timeout=120)
    return out, time.monotonic() - start


def assert_all_ok(out: subprocess.CompletedProcess, first_host_line: str) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    statuses = printed(out.stdout)
    assert FAIL not in statuses.values(), out.stdout
    for name in ("study", first_host_line, "shell", "sglang", "flags", "port", "http path"):
        assert statuses.get(name) == OK, out.stdout
    # the simulator's host lists its profile's GPUs through the simulated nvidia-smi
    assert statuses["gpus"] == OK and statuses["gpu processes"] == OK, out.stdout


def printed(stdout: str) -> dict[str, str]:
    """name -> status of `tuner check`'s aligned lines (a name may hold one space)."""
    rows = [re.match(r"^(\S+)\s+(.+?)\s{2,}", line) for line in stdout.splitlines()]
    assert all(rows), stdout
    return {m.group(2): m.group(1) for m in rows if m}


def test_check_local_all_ok(tmp_path: Path) -> None:
    out, seconds = timed_check(study_file(tmp_path, "check-local"))
    assert_all_ok(out, "host")
    assert seconds < 60, seconds
    print(f"tuner check, localhost: {seconds:.1f} s")


@pytest.mark.ssh
def test_check_over_ssh_all_ok(tmp_path: Path, sshd_server: Sshd) -> None:
    study = edit(study_file(tmp_path, "check-ssh"), target=ssh_target(sshd_server, tmp_path))
    out, seconds = timed_check(study)
    assert_all_ok(out, "ssh")
    assert "host key ssh-ed25519 SHA256:" in out.stdout
    assert "via an SSH tunnel" in out.stdout  # the endpoint the study will use
    # every SSH command costs a round trip (seconds on a loaded 2-core box): a hang guard only
    assert seconds < 180, seconds
    print(f"tuner check, over SSH: {seconds:.1f} s")


@pytest.mark.ssh
def test_unknown_host_key(tmp_path: Path, sshd_server: Sshd) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    study = edit(
        study_file(tmp_path, "check-key"),
        target=ssh_target(sshd_server, tmp_path, known_hosts=str(empty)),
    )
    out = tuner("check", str(study), timeout=120)
    assert out.returncode == 2
    line = next(x for x in out.stdout.splitlines() if x.split()[1] == "ssh")
    assert "not in known_hosts" in line and "ssh-keyscan" in line, line
    statuses = printed(out.stdout)
    assert statuses.pop("ssh") == FAIL and set(statuses.values()) <= {OK, SKIP}, out.stdout
    assert "skipped: ssh FAILed" in out.stdout


@pytest.mark.ssh
def test_unreachable_port(tmp_path: Path, sshd_server: Sshd) -> None:
    target = ssh_target(sshd_server, tmp_path, port=free_port(), reconnect_attempts=1)
    lines = run_checks(edit(study_file(tmp_path, "check-closed"), target=target))
    failed = only_fail(lines)
    assert failed.name == "ssh" and "cannot connect" in failed.detail, failed.detail
    assert by_name(lines)["flags"].status == SKIP


def test_typo_in_a_server_flag(tmp_path: Path) -> None:
    """tuner's table catches it in the study file; a name it lets through is the host's to judge."""
    study = study_file(tmp_path, "check-typo")
    data = yaml.safe_load(study.read_text())
    data["server"]["enable-metricz"] = True
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    failed = only_fail(run_checks(study))
    assert failed.name == "study" and "did you mean enable-metrics" in failed.detail

    edit(study, target={"unchecked_flags": ["enable-metricz"]})
    lines = run_checks(study)
    failed = only_fail(lines)
    assert failed.name == "flags", failed
    assert "server.enable-metricz" in failed.detail and "did you mean --enable-metrics" in (
        failed.detail
    )


def test_flag_missing_from_the_hosts_sglang(tmp_path: Path) -> None:
    """--stream-output is in tuner's table (0.5.6) but gone from the host's (0.5.23) --help."""
    bin_dir = fake_bin(tmp_path, "fake-sglang", FAKE_SGLANG)
    study = study_file(tmp_path, "check-gone")
    data = yaml.safe_load(study.read_text())
    data["server"]["stream-output"] = True
    data["target"]["launch"] = ["fake-sglang"]
    data["target"]["env"] = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    lines = run_checks(study)
    failed = only_fail(lines)
    assert failed.name == "flags" and "server.stream-output" in failed.detail
    assert "gone in SGLang 0.5.23" in failed.detail, failed.detail
    assert by_name(lines)["sglang"].status == WARN  # not `python -m`: no version probe


def test_not_enough_host_ram_for_hicache(tmp_path: Path) -> None:
    study = edit(
        study_file(tmp_path, "check-ram"), space={"hicache-size": {"low": 0, "high": 100000}}
    )
    # the simulator's host RAM is its profile's: this machine's says nothing of it
    assert by_name(run_checks(study))["host ram"].status == SKIP
    bin_dir = fake_bin(tmp_path, "fake-sglang", FAKE_SGLANG)  # a real server's host: judged
    edit(
        study,
        target={"launch": ["fake-sglang"], "env": {"PATH": f"{bin_dir}:{os.environ['PATH']}"}},
    )
    lines = run_checks(study)
    failed = by_name(lines)["host ram"]
    assert failed.status == FAIL and "lower space.hicache-size.high to" in failed.detail
    assert by_name(lines)["capacity"].status == WARN  # the pre-check will reject the far end


def test_model_path_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    study = edit(study_file(tmp_path, "check-model"), server={"model-path": str(missing)})
    failed = only_fail(run_checks(study))
    assert failed.name == "model path" and str(missing) in failed.detail


def test_port_in_use(tmp_path: Path) -> None:
    study = study_file(tmp_path, "check-port")
    port = yaml.safe_load(study.read_text())["target"]["port"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        lines = run_checks(study)
    failed = only_fail(lines)
    assert failed.name == "port" and f"PID {os.getpid()}" in failed.detail, failed.detail
    assert by_name(lines)["http path"].status == SKIP


def test_port_held_by_a_server_this_runs_folder_left(tmp_path: Path) -> None:
    """A server carrying the marker of this study, worker and runs folder is tune's own leftover
    (a warning: tune stops it); the same study run from another runs folder must not claim it."""
    from tuner.server.lifecycle import MARKER_VAR
    from tuner.study.loop import default_worker
    from tuner.study.worklock import marker_for

    study = study_file(tmp_path, "check-stray")
    target = yaml.safe_load(study.read_text())["target"]
    runs = tmp_path / "runs"
    marker = marker_for("check-stray", default_worker(target["host"]), runs / "check-stray")
    listen = (
        "import socket, sys, time; s = socket.socket(); "
        f"s.bind(('127.0.0.1', {target['port']})); s.listen(); print('up', flush=True); "
        "time.sleep(120)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", listen],
        env={**os.environ, MARKER_VAR: marker},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        keys = {"ssh", "shell", "port"}
        ours = by_name(run_checks(study, keys=keys, runs_dir=runs))["port"]
        assert ours.status == WARN and "an earlier `tuner tune`" in ours.detail, ours.detail
        theirs = by_name(run_checks(study, keys=keys, runs_dir=tmp_path / "other"))["port"]
        assert theirs.status == FAIL and f"PID {holder.pid}" in theirs.detail, theirs.detail
    finally:
        os.killpg(holder.pid, 9)
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()


@pytest.mark.parametrize("where", ["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def test_gpu_already_held(tmp_path: Path, where: str, request: pytest.FixtureRequest) -> None:
    """target.env's PATH reaches the probes (over SSH too): the fake nvidia-smi answers a
    GPU host's launch (a simulator launch reads the simulator's own: sim/smi.py)."""
    bin_dir = fake_bin(tmp_path, "nvidia-smi", FAKE_NVIDIA_SMI)
    study = study_file(tmp_path, "check-gpu")
    target: dict = {"env": {"PATH": f"{bin_dir}:{os.environ['PATH']}"}}
    target["launch"] = ["python3", "-m", "sglang.launch_server"]
    if where == "ssh":
        target.update(ssh_target(request.getfixturevalue("sshd_server"), tmp_path))
    lines = run_checks(edit(study, target=target), keys={"ssh", "shell", "gpus", "gpu processes"})
    failed = only_fail(lines)
    assert failed.name == "gpu processes" and "PID 4242 (python3, 70000 MiB)" in failed.detail
    gpus = by_name(lines)["gpus"]
    assert gpus.status == WARN and "NVIDIA H100" in gpus.detail  # 11000 of 81559 MiB free


def test_a_gpu_hosts_launch_without_nvidia_smi_warns(tmp_path: Path) -> None:
    """A launch that is not the simulator reads the host's nvidia-smi; none here: a warning."""
    assert shutil.which("nvidia-smi") is None  # this machine has no GPU
    study = edit(
        study_file(tmp_path, "check-cpu"),
        target={"launch": ["python3", "-m", "sglang.launch_server"]},
    )
    gpus = by_name(run_checks(study, keys={"ssh", "gpus"}))["gpus"]
    assert gpus.status == WARN and "no nvidia-smi" in gpus.detail, gpus.detail


# --- `tuner tune` refuses the night ------------------------------------------------------


def assert_refused(out: subprocess.CompletedProcess, code: int, check: str, runs: Path) -> None:
    assert out.returncode == code, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"before the first trial: {check}:" in out.stderr, out.stderr
    assert not runs.exists(), list(runs.rglob("*"))  # no study, no trial, no folder


@pytest.mark.ssh
def test_tune_refuses_an_unreachable_host(tmp_path: Path, sshd_server: Sshd) -> None:
    runs = tmp_path / "runs"
    target = ssh_target(sshd_server, tmp_path, port=free_port(), reconnect_attempts=1)
    study = edit(study_file(tmp_path, "tune-closed"), target=target)
    out = tuner("tune", str(study), "--runs-dir", str(runs), timeout=120)
    assert_refused(out, 1, "ssh", runs)  # the world's: exit 1, as InfraError


@pytest.mark.ssh
def test_tune_refuses_a_broken_remote_shell(tmp_path: Path, sshd_server: Sshd) -> None:
    """A key whose every command ends at once (as for a user without a working shell)."""
    key = tmp_path / "broken"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = sshd_server.dir / "authorized_keys"
    before = authorized.read_text()
    pub = (tmp_path / "broken.pub").read_text().strip()
    authorized.write_text(before + f'command="exit 1",restrict {pub}\n')
    try:
        runs = tmp_path / "runs"
        target = ssh_target(sshd_server, tmp_path, identity_file=str(key))
        study = edit(study_file(tmp_path, "tune-shell"), target=target)
        out = tuner("tune", str(study), "--runs-dir", str(runs), timeout=120)
    finally:
        authorized.write_text(before)
    assert_refused(out, 2, "shell", runs)  # the user's setup: exit 2


def test_tune_refuses_a_flag_the_host_lacks(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    bin_dir = fake_bin(tmp_path, "fake-sglang", FAKE_SGLANG)
    study = study_file(tmp_path, "tune-gone")
    data = yaml.safe_load(study.read_text())
    data["server"]["stream-output"] = True
    data["target"].update(launch=["fake-sglang"], env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tuner("tune", str(study), "--runs-dir", str(runs), timeout=120)
    assert_refused(out, 2, "flags", runs)
    assert "stream-output" in out.stderr


def test_a_garbage_dataset_fails_check_as_it_fails_tune(tmp_path: Path) -> None:
    """`check` reads the workload's dataset as `tune` does: a file `tune` refuses is a FAIL."""
    data = tmp_path / "requests.jsonl"
    data.write_text("not json\n")
    study = edit(
        study_file(tmp_path, "check-dataset"),
        workload={"kind": "jsonl", "dataset": str(data), "range_ratio": None},
    )
    failed = only_fail(run_checks(study))
    assert failed.name == "study" and f"{data}:1" in failed.detail and "JSON" in failed.detail


def test_a_storage_url_tune_refuses_fails_check(tmp_path: Path) -> None:
    study = study_file(tmp_path, "check-storage")
    data = yaml.safe_load(study.read_text())
    data["storage"] = "nonsense://x"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    failed = only_fail(run_checks(study))
    assert failed.name == "study" and "storage" in failed.detail and "nonsense" in failed.detail
