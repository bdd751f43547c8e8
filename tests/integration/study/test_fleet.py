"""A fleet from one command: `python -m tuner tune FLEET.yaml` runs one worker process per
`fleet:` entry (simulated servers on this machine, each its own port and "GPU") against one
study in one SQLite file, with one display and one best.yaml.

One command, three workers (one test: the suite's time is scarce): gpu-a and gpu-b finish the
study, each running trials; gpu-c's host is down (SSH to a loopback port nobody listens on: the
world's failure), so gpu-c stops with its own line while the others go on. The command ends
when all ended: exit 1 (a worker halted), one study in the storage, one best.yaml, one
notification, plain lines naming their worker. (Exit 0 when every worker ends well, a port held
by a foreign process and a worker that cannot start: tests/unit/study/test_fleet_run.py and
tests/unit/check/test_check_fleet.py.)
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.helpers.net import free_port
from tests.helpers.studies import study_file, tuner

pytestmark = pytest.mark.slow


def fleet_file(tmp: Path, ports: tuple[int, int, int], n_trials: int) -> Path:
    """The demo made small (tests/helpers/studies.py), as a fleet of three workers: two on this
    machine, one over SSH to 127.0.0.1 at `ports[2]`, where no sshd listens."""
    path = study_file(tmp, name="fleet", n_trials=n_trials)
    data = yaml.safe_load(path.read_text())
    data["budget"].update(confirm_top=0)  # the export reads the trials; confirmation is per worker
    data["workload"].update(duration_s=1.5)
    data["objective"]["slo"]["p99_ttft_ms"] = 1200
    # never the user's ~/.ssh: files of the test's own, no agent, no keys looked for
    (tmp / "known_hosts").write_text("")
    (tmp / "ssh_config").write_text("")
    down = {
        "port": ports[2],
        "known_hosts": str(tmp / "known_hosts"),
        "ssh_config": str(tmp / "ssh_config"),
        "use_agent": False,
        "look_for_keys": False,
        "reconnect_attempts": 1,
    }
    data["fleet"] = [
        {"worker": "gpu-a", "port": ports[0], "gpus": "0"},
        {"worker": "gpu-b", "port": ports[1], "gpus": "1"},
        {"worker": "gpu-c", "host": "127.0.0.1", "ssh": down},
    ]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trials_by_worker(runs: Path) -> tuple[list[str], Counter[str], Counter[str]]:
    """The studies in the fleet's SQLite file, and its COMPLETE and FAIL trials per worker."""
    url = f"sqlite:///{runs / 'fleet' / 'study.db'}"
    names = [s.study_name for s in optuna.get_all_study_summaries(url)]
    study = optuna.load_study(study_name="fleet", storage=url)
    trials = study.get_trials(deepcopy=False)
    worker = lambda t: str(t.user_attrs.get("worker"))  # noqa: E731
    complete = Counter(worker(t) for t in trials if t.state == TrialState.COMPLETE)
    failed = Counter(worker(t) for t in trials if t.state == TrialState.FAIL)
    return names, complete, failed


def test_a_fleet_finishes_one_study_with_one_command_while_a_broken_worker_stops_alone(
    tmp_path: Path,
) -> None:
    ports = (free_port(), free_port(), free_port())  # the third: a host down
    path = fleet_file(tmp_path, ports, n_trials=3)
    runs = tmp_path / "runs"
    summary = tmp_path / "summary.json"
    notify = f"cat > {summary}"  # the fleet's one notification, not one per worker
    args = ("--runs-dir", str(runs), "--no-progress", "--notify", notify)
    out = tuner("tune", str(path), *args, timeout=180)
    log = out.stderr[-4000:]
    assert out.returncode == 1, log  # a worker halted; the others finished
    names, complete, failed = trials_by_worker(runs)
    assert names == ["fleet"]
    assert complete["gpu-a"] >= 1 and complete["gpu-b"] >= 1, (complete, log)
    assert sum(complete.values()) >= 3 and complete["gpu-c"] == 0
    assert failed["gpu-c"] == 0  # it stopped before its first trial
    lines = out.stderr.splitlines()
    stopped = [ln for ln in lines if "fleet: worker gpu-c: stopped (exit 1)" in ln]
    assert stopped and f"ssh 127.0.0.1:{ports[2]}: cannot connect" in stopped[0], log
    for worker in ("gpu-a", "gpu-b"):
        assert any(ln.endswith(f"fleet: worker {worker}: ended (exit 0)") for ln in lines), log
        assert any(re.match(rf"^\S+ {worker}: trial #\d+ ", ln) for ln in lines), log
    best = runs / "fleet" / "best.yaml"
    assert best.is_file() and out.stdout == best.read_text()
    assert out.stderr.count("best launch config written to") == 1
    sent = json.loads(summary.read_text())
    assert (sent["exit_code"], sent["study"], sent["best_yaml"]) == (1, "fleet", str(best))
    assert sent["event"] == "stopped" and "worker gpu-c: stopped (exit 1)" in sent["message"]
