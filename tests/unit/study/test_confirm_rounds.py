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


# --- rounds for a shaky winner (budget.confirm_shaky) ----------------------------------------


def _shaky_setup(tmp_path: Path, shaky: int, steady_ms: float):
    """Three servers at one concurrency: 0.9 (1,000 tok/s) and 0.85 (990) run p99 TPOT at 49 ms
    of 50 on every start (odds ~0.7 that the next holds: shaky however often they run); 0.8
    (900) at `steady_ms`; trials in that order. Confirmation: the best alone once, no confirm_extra rounds."""
    from tests.unit.study.test_loop import TPOT_STUDY, _tpot_load, scripted

    data = {
        **TPOT_STUDY,
        "space": {
            "mem-fraction-static": {"choices": [0.8, 0.85, 0.9]},
            "concurrency": {"choices": [16]},
        },
        "budget": {
            "confirm_top": 1,
            "confirm_repeats": 1,
            "confirm_extra": 0,
            "confirm_shaky": shaky,
        },
    }
    cfg, study, server, tuning = setup(tmp_path, data)
    loads = {0.9: (1000, 49.0), 0.85: (990, 49.0), 0.8: (900, steady_ms)}
    scripted(
        tuning, {m: [_tpot_load(v, 100, 2, ms) for _ in range(20)] for m, (v, ms) in loads.items()}
    )
    for mfs in loads:
        study.enqueue_trial({"mem-fraction-static": mfs, "concurrency": 16})
    tuning.optimize(3, None)
    return study, server, tuning


@pytest.mark.parametrize("shaky", [0, 3])
def test_a_shaky_winner_runs_again_beside_a_fallback_until_one_is_steady(
    tmp_path: Path, shaky: int
) -> None:
    from tuner.verdict.winner import best_trial

    study, server, tuning = _shaky_setup(tmp_path, shaky, steady_ms=40.0)
    restarts = len(server.restarts)
    values = tuning.confirm(top=1, repeats=1)
    best, summary = best_trial(study)
    assert best is not None
    if not shaky:
        # the rounds of confirm_extra are none: the edge is exported, its odds said
        assert values == {"0": [1000.0]} and best.number == 0 and summary["hold_odds"] < 0.9
    else:
        # one round: the winner and the steady server below it (a fallback), which then
        # wins; a steady winner ends the rounds, two of the three left unspent
        assert values == {"0": [1000.0, 1000.0], "2": [900.0]}
        assert best.number == 2 and "hold_odds" not in summary
    assert len(server.restarts) - restarts == sum(len(v) for v in values.values())


def test_rounds_for_a_shaky_winner_end_at_their_budget(tmp_path: Path) -> None:
    # every server at the edge: no round can settle it, and only `confirm_shaky` run
    study, server, tuning = _shaky_setup(tmp_path, 2, steady_ms=49.0)
    values = tuning.confirm(top=1, repeats=1)
    assert sum(len(v) for v in values.values()) == 1 + 2 * 2  # the repeat, then 2 rounds of 2
    # the study keeps the rounds it ran: confirming again (a re-run) runs none
    assert tuning.confirm(top=1, repeats=1) == values
