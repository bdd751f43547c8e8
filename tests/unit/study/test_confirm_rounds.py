"""Confirmation round by round (study/confirm.py): with budget.early_stop, a candidate out of
reach of a steady winner after a round (verdict.winner.out_of_reach) runs no more repeats; the
winner runs every one; with early_stop off every candidate does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.loop import STUDY, setup


@pytest.mark.parametrize("early_stop", [True, False])
def test_candidates_out_of_reach_skip_the_rounds_left(tmp_path: Path, early_stop: bool) -> None:
    # one concurrency above every pool: each mfs serves its own throughput, exactly repeatable
    # (the scripted load has no noise: any gap is beyond it)
    data = {
        **STUDY,
        "space": {**STUDY["space"], "concurrency": {"choices": [256]}},
        "objective": {"slo": {"p99_ttft_ms": 20000}},
        "budget": {"confirm_top": 3, "confirm_repeats": 3, "confirm_extra": 0},
    }
    data["budget"]["early_stop"] = early_stop
    cfg, study, server, tuning = setup(tmp_path, data)
    tuning.optimize(8, None)
    restarts = len(server.restarts)
    values = tuning.confirm(top=3, repeats=3)
    assert tuning.confirm_error is None
    runs = {int(k): len(v) for k, v in values.items()}
    assert len(runs) == 3
    winner = max(runs, key=lambda n: study.trials[n].values[0])
    if early_stop:
        # the winner all 3; the others 1 each (the first round measured them apart)
        assert runs.pop(winner) == 3 and set(runs.values()) == {1}
    else:
        assert set(runs.values()) == {3}
    assert len(server.restarts) - restarts == sum(len(v) for v in values.values())
