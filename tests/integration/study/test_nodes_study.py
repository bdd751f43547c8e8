"""`tuner tune` with a server across two "nodes" (two real sshd on 127.0.0.1): a follower rank
killed -9 mid-load is the world's failure and the next trial starts clean; the tuner killed -9
and rerun finds both ranks of the server it lost and finishes with none left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers.net import free_port
from tests.helpers.procs import kill_marked, marked_groups
from tests.helpers.sshd import Sshd
from tests.helpers.studies import REPO, TUNER, study_file
from tuner.outcome import Attr
from tuner.study.worklock import marker_for

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

WORKER = "nodes"


def _node(server: Sshd) -> dict:
    ssh = {
        "port": server.port,
        "identity_file": str(server.client_key),
        "known_hosts": str(server.known_hosts),
    }
    return {"host": "127.0.0.1", "ssh": ssh}


def _phase_seen(trials: Path, phase: str, since: float, nth: int = 1) -> bool:
    hits = 0
    for log in trials.glob("*/phases.log"):
        for line in log.read_text().splitlines():
            stamp, _, name = line.partition(" ")
            if name.strip() == phase and float(stamp) >= since:
                hits += 1
    return hits >= nth


def _wait_phase(proc: subprocess.Popen, trials: Path, phase: str, since: float, nth: int = 1):
    deadline = time.monotonic() + 60
    while not _phase_seen(trials, phase, since, nth):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, f"phase {phase} not reached"
        time.sleep(0.02)


def _rank(marker: str, rank: int) -> int:
    """The process group of the live server rank `rank` (by its --node-rank argument)."""
    for pgid, cmd in marked_groups(marker).items():
        if f"--node-rank {rank} " in cmd + " ":
            return pgid
    raise AssertionError(f"no rank {rank} among {marked_groups(marker)}")


def test_a_lost_rank_is_the_worlds_and_a_killed_tuner_resumes(
    tmp_path: Path, sshd_server: Sshd, second_sshd: Sshd
) -> None:
    study = study_file(tmp_path, name="nodes", n_trials=3, budget__confirm_top=0)
    data = yaml.safe_load(study.read_text())
    target = data["target"]
    del target["host"]  # the target's host is nodes[0]
    target.update(
        nodes=[_node(sshd_server), _node(second_sshd)],
        dist_init_port=free_port(),
        env={"PYTHONPATH": str(REPO)},  # the remote shell runs this checkout's simulator
        ssh={"user": "root", "use_agent": False, "look_for_keys": False, "ssh_config": ""},
    )
    target["timeouts"].update(stop_s=5, poll_s=0.1)
    data["server"]["tp"] = 2  # one GPU per node
    data["workload"]["duration_s"] = 1.5
    data["objective"]["slo"]["p99_ttft_ms"] = 1000
    data["baseline"]["mem-fraction-static"] = 0.85  # starts: the first trial is measured
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    runs = tmp_path / "runs"
    trials = runs / "nodes" / "trials"
    marker = marker_for("nodes", WORKER, runs / "nodes")
    argv = [*TUNER, "tune", str(study), "--runs-dir", str(runs), "--worker", WORKER]
    argv.append("--no-progress")
    try:
        since = time.time()
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            # trial 0 under load: its follower killed -9 (a node lost to the world)
            _wait_phase(proc, trials, "load", since)
            os.killpg(_rank(marker, 1), signal.SIGKILL)
            # the next trial's ranks launched: the tuner itself killed -9, both left running
            _wait_phase(proc, trials, "spawn", since, nth=2)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            if proc.stderr is not None:
                proc.stderr.close()
        lost = marked_groups(marker)
        assert len(lost) == 2, lost  # both ranks outlived the tuner
        # the rerun: one trial (the recovered one) is enough to prove the resume
        rerun = [*argv, "--n-trials", "1"]
        final = subprocess.run(rerun, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr[-3000:]
        assert marked_groups(marker) == {}, "a rank outlived the study"
        assert "stopped a server an earlier run left behind" in final.stdout + final.stderr

        st = optuna.load_study(study_name="nodes", storage=f"sqlite:///{runs}/nodes/study.db")
        first = st.trials[0]
        assert first.state == optuna.trial.TrialState.FAIL  # the world's: never learned from
        assert "node-rank 1 (127.0.0.1) lost" in first.user_attrs[Attr.INFRA_ERROR]
        logs = trials / "0"  # rank 0 ended on NCCL's watchdog; the follower's log came too
        assert "Process group watchdog thread terminated" in (logs / "server.log").read_text()
        assert "Init torch distributed ends." in (logs / "server.rank1.log").read_text()
        assert "spawn" in (trials / "1" / "phases.log").read_text()  # the next trial launched
        done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert len(done) == 1
        for t in done:  # every rank's log came home
            folder = trials / str(t.number)
            assert (folder / "server.log").exists() and (folder / "server.rank1.log").exists()
    finally:
        kill_marked(marker)
