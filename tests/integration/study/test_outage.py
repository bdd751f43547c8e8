"""An unattended night survives its host's sshd going away for a while (a restart, a reboot's
first seconds; 12 s here, to keep the suite short; a 25 s one measured the same way cost 4
failed trials and pauses of 5, 10 and 20 s): the trials in it fail at once for the world's
reasons, the loop pauses (budget.outage_tolerance) instead of halting after three, and the
study completes.

Real parts: `tuner tune` as a subprocess, the real sshd behind a loopback relay that refuses
every connection for the outage, the simulated server started and stopped over SSH.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers.procs import kill_marked
from tests.helpers.relay import Relay
from tests.helpers.sshd import Sshd
from tests.helpers.studies import REPO, TUNER, study_file
from tuner.study.loop import default_worker
from tuner.study.worklock import marker_for

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

OUTAGE_S = 12.0
DEADLINE_S = 300.0


def _study(tmp: Path, sshd: Sshd, relay_port: int, **budget: object) -> Path:
    path = study_file(tmp, "outage", n_trials=4)
    data = yaml.safe_load(path.read_text())
    data["target"].update(
        host="127.0.0.1",
        workdir=str(tmp),
        ssh={
            "user": "root",
            "port": relay_port,
            "identity_file": str(sshd.client_key),
            "known_hosts": str(sshd.known_hosts_at(relay_port, tmp)),
            "ssh_config": "",
            "use_agent": False,
            "look_for_keys": False,
            "connect_timeout_s": 3,
        },
    )
    data["budget"].update(budget)
    data.pop("baseline")  # trial 0 starts a server: the host is known to work
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run_through_outage(tmp: Path, sshd: Sshd, **budget: object) -> tuple[int, str, list]:
    """`tuner tune` through a relay that refuses every connection for OUTAGE_S once trial 0
    measured; (exit code, stderr, the study's trials)."""
    runs = tmp / "runs"
    with Relay(sshd.port) as relay:
        study = _study(tmp, sshd, relay.port, **budget)
        err = tmp / "tune.err"
        with err.open("w") as out:
            proc = subprocess.Popen(
                [*TUNER, "tune", str(study), "--runs-dir", str(runs)],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=out,
                start_new_session=True,
            )
        try:
            measured = runs / "outage" / "trials" / "0" / "metrics.json"
            end = time.monotonic() + DEADLINE_S
            while not measured.exists() and proc.poll() is None and time.monotonic() < end:
                time.sleep(0.1)
            assert measured.exists(), err.read_text()[-3000:]
            relay.refuse(OUTAGE_S)  # sshd is gone: every new connection closes on accept
            relay.cut()  # and the connections the run holds drop
            code = proc.wait(timeout=DEADLINE_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            kill_marked(marker_for("outage", default_worker("127.0.0.1"), runs / "outage"))
    db = f"sqlite:///{runs / 'outage' / 'study.db'}"
    trials = optuna.load_study(study_name="outage", storage=db).trials
    return code, err.read_text(), trials


def test_a_short_sshd_outage_is_ridden_out(tmp_path: Path, sshd_server: Sshd) -> None:
    code, err, trials = _run_through_outage(tmp_path, sshd_server)
    assert code == 0, err[-3000:]
    states = [t.state for t in trials]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert states.count(optuna.trial.TrialState.COMPLETE) >= 4
    assert failed and all("infra_error" in t.user_attrs for t in failed)
    assert "waiting:" in err and "outage_tolerance" in err and "Traceback" not in err
    assert not any(t.user_attrs.get("reproduced") for t in trials)  # no cliff from an outage


def test_without_tolerance_the_same_outage_stops_the_study_with_the_resume_line(
    tmp_path: Path, sshd_server: Sshd
) -> None:
    code, err, trials = _run_through_outage(
        tmp_path, sshd_server, outage_tolerance=0, infra_retries=5
    )
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("tuner: stopped: 3 trials in a row"), last
    assert last.endswith("(run the same command again to resume)"), last
    assert "Traceback" not in err
