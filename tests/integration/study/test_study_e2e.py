"""`tuner tune` end to end on the simulator: real subprocesses, real HTTP, real SQLite, real sshd.

Each test writes a small study file (free port, short load runs) into a temp dir and drives the
real console entry point, as a user would. Each test's study has a name of its own (its runs
folder, study.db and logs are then plainly its own, whatever else two tests share).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers.procs import kill_marked
from tests.helpers.simproc import sim_server
from tests.helpers.sshd import Sshd, assert_group_gone
from tests.helpers.studies import REPO, TUNER, study_file, tuner
from tuner.server.launch import server_log_path
from tuner.study.worklock import marker_for

pytestmark = pytest.mark.slow


def status(study: Path, runs: Path) -> dict:
    out = tuner("status", str(study), "--runs-dir", str(runs), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def server_groups(st: dict, runs: Path, name: str) -> set[int]:
    """Every server process group the study recorded (trials' user attributes)."""
    import optuna

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{runs / name / 'study.db'}")
    return {
        int(t.user_attrs["server_pgid"]) for t in study.trials if t.user_attrs.get("server_pgid")
    }


def spawn_tune(args: list[str]) -> subprocess.Popen:
    """`tuner tune ARGS` in its own session (killable as a group), stderr kept."""
    return subprocess.Popen(
        [*TUNER, "tune", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )


def check_best_yaml_starts(best: Path) -> None:
    """SGLang's --config accepts the export as is: the simulator (SGLang's flags) starts from it."""
    flags = yaml.safe_load(best.read_text())
    assert all(isinstance(k, str) and "_" not in k for k in flags)
    with sim_server("--config", str(best), "--sim-profile", "llama-3.1-8b-h100") as sim:
        with urllib.request.urlopen(f"{sim.url}/get_server_info", timeout=10) as resp:
            info = json.load(resp)
        assert info["mem_fraction_static"] == pytest.approx(flags["mem-fraction-static"])


def test_demo_study_local(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    study = study_file(tmp_path, "e2e", n_trials=5)
    out = tuner("tune", str(study), "--runs-dir", str(runs))
    assert out.returncode == 0, out.stderr[-3000:]
    best = runs / "e2e" / "best.yaml"
    assert best.exists() and "mem-fraction-static" in best.read_text()
    assert out.stdout == best.read_text()  # the command ends by printing the export
    st = status(study, runs)
    done = [t for t in st["trials"] if t["state"] == "COMPLETE"]
    assert len(done) == 5
    trial0 = st["trials"][0]
    assert trial0["params"]["mem-fraction-static"] == 0.98 and trial0["feasible"] is False
    assert "cuda" in trial0["reason"].lower()  # infeasible configs carry their reason
    assert st["best"] is not None and st["best"]["params"]["mem-fraction-static"] < 0.98
    for t in done:
        d = runs / "e2e" / "trials" / str(t["trial"])
        if t["duplicate_of"] is None and t["status"] != "rejected":
            assert (d / "launch.txt").exists() or t["restarted"] is False
    # the failed start's evidence copied beside its record, not only its last lines
    assert "CUDA" in (runs / "e2e" / "trials" / "0" / "server.log").read_text()
    for pgid in server_groups(st, runs, "e2e"):
        assert_group_gone(pgid)
    check_best_yaml_starts(best)
    cmd = tuner("export", str(study), "--runs-dir", str(runs), "--format", "cmd")
    assert cmd.returncode == 0 and cmd.stdout.startswith(
        "python -m sglang.launch_server --model-path"
    )


def test_without_a_workdir_the_host_s_tmp_is_left_as_found(tmp_path: Path) -> None:
    """No target.workdir: the servers log to the host's /tmp (tuner chose the place), and each
    log, .pid and .exit file is removed once copied to the trial's folder, also those a killed
    run left (the resumed run removes them once their servers are stopped)."""
    name = f"e2e-notmp-{os.getpid()}-{time.monotonic_ns()}"  # its files in /tmp are its own
    runs = tmp_path / "runs"
    study = study_file(tmp_path, name, n_trials=3, target__workdir=None)
    host_files = lambda: sorted(Path("/tmp").glob(f"tuner-{name}-trial*"))  # noqa: E731
    try:
        # a run killed while trial 1's server runs leaves its files; the resumed run sweeps them
        trial1 = str((runs / name / "trials" / "1").resolve())
        log1 = Path(server_log_path(None, name, 1, trial1))  # where trial 1's server logs
        interrupt_tune(study, runs, log1, signal.SIGKILL, 0.2)
        assert log1 in host_files()
        out = tuner("tune", str(study), "--runs-dir", str(runs))
        assert out.returncode == 0, out.stderr[-3000:]
        assert host_files() == []
        logs = {p.parent.name: p.read_text() for p in (runs / name / "trials").glob("*/server.log")}
        assert "CUDA" in logs["0"]  # the baseline's failed start (mfs 0.98)
        assert any("The server is fired up and ready to roll!" in t for t in logs.values())
    finally:
        for path in host_files():
            path.unlink()


def test_changed_study_refused_on_resume(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    study = study_file(tmp_path, "e2e-changed", n_trials=1)
    assert tuner("tune", str(study), "--runs-dir", str(runs)).returncode in (0, 1)
    data = yaml.safe_load(study.read_text())
    data["workload"]["input_len"] = 300
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    before = sorted(p.name for p in (runs / "e2e-changed").rglob("*"))
    out = tuner("tune", str(study), "--runs-dir", str(runs))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "different workload" in out.stderr
    assert sorted(p.name for p in (runs / "e2e-changed").rglob("*")) == before


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "tuner ended before the point the test kills it at"
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def interrupt_tune(
    study: Path, runs: Path, wait_for: Path, sig: int, settle_s: float
) -> tuple[int, str]:
    """Run `tuner tune` until `wait_for` exists, wait `settle_s`, send `sig` to the tuner alone
    (its server lives in its own session); returns the exit code and stderr."""
    proc = spawn_tune([str(study), "--runs-dir", str(runs), "--no-progress"])
    try:
        _wait_for(wait_for, proc)
        time.sleep(settle_s)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


@pytest.mark.parametrize("when", ["mid-trial", "between-trials"])
def test_resume_after_sigkill(tmp_path: Path, when: str) -> None:
    runs = tmp_path / "runs"
    name = f"e2e-resume-{when}"
    study = study_file(tmp_path, name, n_trials=4)
    trial = runs / name / "trials" / "1"
    mid = when == "mid-trial"  # the server is starting or the load running, else between trials
    wait_for = trial / ("launch.txt" if mid else "metrics.json")
    interrupt_tune(study, runs, wait_for, signal.SIGKILL, 1.0 if mid else 0.0)
    out = tuner("tune", str(study), "--runs-dir", str(runs))
    assert out.returncode == 0, out.stderr[-3000:]
    st = status(study, runs)
    complete = [t for t in st["trials"] if t["state"] == "COMPLETE"]
    assert len(complete) == 4
    measured = [
        json.dumps(t["params"], sort_keys=True) for t in complete if t["duplicate_of"] is None
    ]
    assert len(measured) == len(set(measured)), "a configuration was measured twice"
    if when == "mid-trial":
        assert any(t["state"] == "FAIL" for t in st["trials"]), "the killed trial must be failed"
    for pgid in server_groups(st, runs, name):
        assert_group_gone(pgid)  # no orphan servers, including the one the killed run left


@pytest.mark.ssh
def test_demo_study_over_ssh(tmp_path: Path, sshd_server: Sshd) -> None:
    runs = tmp_path / "runs"
    ssh = {
        "user": "root",
        "port": sshd_server.port,
        "identity_file": str(sshd_server.client_key),
        "known_hosts": str(sshd_server.known_hosts),
        "ssh_config": "",
        "use_agent": False,
        "look_for_keys": False,
    }
    study = study_file(tmp_path, "e2e-ssh", n_trials=3)
    data = yaml.safe_load(study.read_text())
    data["target"].update(host="127.0.0.1", ssh=ssh, workdir=str(tmp_path))
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    sshd_log = sshd_server.dir / "sshd.log"
    logins_before = sshd_log.read_text().count("Accepted publickey")
    out = tuner("tune", str(study), "--runs-dir", str(runs))
    assert out.returncode == 0, out.stderr[-3000:]
    assert sshd_log.read_text().count("Accepted publickey") > logins_before  # it went over SSH
    st = status(study, runs)
    assert len([t for t in st["trials"] if t["state"] == "COMPLETE"]) == 3
    assert (runs / "e2e-ssh" / "best.yaml").exists()
    logs = list((runs / "e2e-ssh" / "trials").glob("*/server.log"))
    assert logs and any("fired up" in p.read_text() for p in logs)  # fetched over SFTP
    for pgid in server_groups(st, runs, "e2e-ssh"):
        assert_group_gone(pgid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_fails_trial_cleanly_and_exits_130(tmp_path: Path, sig: int) -> None:
    runs = tmp_path / "runs"
    name = f"e2e-signal-{int(sig)}"
    study = study_file(tmp_path, name, n_trials=3)
    code, err = interrupt_tune(study, runs, runs / name / "trials" / "1" / "launch.txt", sig, 1.0)
    assert code == 130, err
    assert "Traceback" not in err
    st = status(study, runs)
    assert [t["state"] for t in st["trials"]][:2] == ["COMPLETE", "FAIL"]
    assert all(t["state"] != "RUNNING" for t in st["trials"])  # the study is consistent
    for pgid in server_groups(st, runs, name):
        assert_group_gone(pgid)  # its server was stopped, not left behind
    out = tuner("tune", str(study), "--runs-dir", str(runs))
    assert out.returncode == 0, out.stderr[-2000:]


def test_api_key_is_used_and_never_written(tmp_path: Path) -> None:
    """The server requires the key; SGLang logs it in server_args; no file under runs/ holds it."""
    secret = "sk-tuner-test-" + os.urandom(8).hex()
    runs = tmp_path / "runs"
    study = study_file(tmp_path, "e2e-api-key", n_trials=2)
    data = yaml.safe_load(study.read_text())
    data["target"]["api_key_env"] = "TUNER_TEST_API_KEY"
    data["baseline"] = {"mem-fraction-static": 0.85, "concurrency": 16}
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tuner("tune", str(study), "--runs-dir", str(runs), env={"TUNER_TEST_API_KEY": secret})
    assert out.returncode == 0, out.stderr[-2000:]
    assert secret not in out.stdout + out.stderr
    logs = list(runs.rglob("server.log"))
    assert logs and any("api_key" in p.read_text() for p in logs)  # SGLang-style args were logged
    for path in runs.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"{path} holds the API key"
    st = status(study, runs)
    assert st["trials"][0]["output_throughput"]  # requests were authorised
    unset = {"TUNER_TEST_API_KEY": None}
    missing = tuner("tune", str(study), "--runs-dir", str(runs), timeout=60, env=unset)
    assert missing.returncode == 2 and "TUNER_TEST_API_KEY is not set" in missing.stderr


def test_unknown_flag_stops_the_study_in_one_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    study = study_file(tmp_path, "e2e-unknown-flag", n_trials=4)
    data = yaml.safe_load(study.read_text())
    data["server"]["enable-turbo-mode"] = True  # no such SGLang flag
    data["baseline"] = {"mem-fraction-static": 0.85, "concurrency": 16}
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tuner("tune", str(study), "--runs-dir", str(runs), "--no-progress")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "enable-turbo-mode" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_two_runs_dirs_of_one_study_leave_each_other_s_servers_alone(tmp_path: Path) -> None:
    """Same study name and worker, two runs folders (two checkouts on one host): the second's
    start must not take the first's live server for one an earlier run left behind."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    # A's first trial holds its server for a 20 s load run; B starts while it runs
    first = {"mem-fraction-static": 0.85, "concurrency": 8}
    # no confirmation: its runs would only lengthen A's 20 s windows past what B needs
    quick = {"baseline": first, "budget__confirm_top": 0}
    study_a = study_file(a, "twin", n_trials=2, workload__duration_s=20, **quick)
    study_b = study_file(b, "twin", n_trials=1, **quick)
    port_a = yaml.safe_load(study_a.read_text())["target"]["port"]
    args = ["--worker", "w", "--no-progress"]
    proc = spawn_tune([*args, str(study_a), "--runs-dir", str(a / "runs")])
    try:
        deadline = time.monotonic() + 120
        while not _listening(port_a):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "A's first server never listened"
            time.sleep(0.2)
        out_b = tuner("tune", *args, str(study_b), "--runs-dir", str(b / "runs"))
        assert out_b.returncode == 0, out_b.stderr[-3000:]
        assert "left behind" not in out_b.stderr, out_b.stderr[-3000:]
        _, err_a = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        # a failed run (the bug this test guards against) leaves servers: stop them by marker
        for runs in (a / "runs", b / "runs"):
            kill_marked(marker_for("twin", "w", runs / "twin"))
    assert proc.returncode == 0, err_a[-3000:]
    st = status(study_a, a / "runs")
    assert [t["state"] for t in st["trials"]][:2] == ["COMPLETE", "COMPLETE"], err_a[-3000:]
    assert (st["trials"][0]["score"] or 0) > 0, "A's measured trial lost its server"
