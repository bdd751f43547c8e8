"""Two workers, each driving its own (simulated) GPU host, share one study through PostgreSQL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.sshd import assert_group_gone
from tests.helpers.studies import REPO, TUNER, study_file, study_trials

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_two_workers_share_one_study(tmp_path: Path, postgres_url: str) -> None:
    n = 6
    procs = []
    for worker in ("host-a", "host-b"):
        # the same study (same name and fingerprint), a different host port per worker
        (tmp_path / worker).mkdir()
        study = study_file(tmp_path / worker, name="shared", n_trials=n)
        data = yaml.safe_load(study.read_text())
        data["baseline"] = None
        study.write_text(yaml.safe_dump(data, sort_keys=False))
        cmd = [
            *TUNER,
            "tune",
            str(study),
            "--storage",
            postgres_url,
            "--worker",
            worker,
            "--runs-dir",
            str(tmp_path / worker / "runs"),
            "--no-progress",
        ]
        procs.append(
            (
                worker,
                study,
                subprocess.Popen(
                    cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                ),
            )
        )
    for worker, _, proc in procs:
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, f"{worker}: {err[-2000:]}"
        assert (tmp_path / worker / "runs" / "shared" / "best.yaml").exists()
    study = procs[0][1]
    trials = study_trials(study, postgres_url)
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    # each worker stops once the shared count reaches n; both may finish one in the same moment
    assert n <= len(complete) <= n + 1
    assert {t["worker"] for t in complete} == {"host-a", "host-b"}  # both hosts measured
    assert not [t for t in trials if t["state"] == "RUNNING"]
    import optuna

    shared = optuna.load_study(study_name="shared", storage=postgres_url)
    for t in shared.trials:
        if t.user_attrs.get("server_pgid"):
            assert_group_gone(int(t.user_attrs["server_pgid"]))
