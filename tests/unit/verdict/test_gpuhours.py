"""GPU time as the study's measure: a trial's time by phase on the runner's clock
(trial/spent.py) and the study's GPU-hours, by phase and to the first config within 2% of the
winner (verdict/gpuhours.py). Pure: a fake clock and trials made with optuna's create_trial."""

from __future__ import annotations

from typing import Any

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.outcome import CONSTRAINT_KEYS, Attr, Status
from tuner.trial.spent import PhaseTimes
from tuner.verdict.gpuhours import CONFIRM_SPENT_ATTR, gpu_hours, gpu_time


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_trial_records_each_phase_on_its_clock() -> None:
    clock = Clock()
    spent = PhaseTimes(clock, gpus=8)
    for phase, seconds in (("restart", 2), ("spawn", 603), ("ready", 1), ("warmup", 9)):
        spent.enter(phase)
        clock.now += seconds
    spent.stopped(4.0)  # the server before took 4 s of the restart phase to stop
    for phase, seconds in (("load", 300), ("scoring", 0.5), ("warmup", 6), ("load", 300)):
        spent.enter(phase)  # an inner search's second point
        clock.now += seconds
    spent.enter("done")
    clock.now += 50  # after done: not the trial's
    rec = spent.record()
    assert rec == {
        "startup_s": 601.0,
        "warmup_s": 15.0,
        "load_s": 600.0,
        "stop_s": 4.0,
        "other_s": 1.5,
        "server_s": 1221.5,
        "gpus": 8,
    }
    assert gpu_hours(rec) == pytest.approx(1221.5 * 8 / 3600)


def test_a_record_mid_phase_counts_up_to_now() -> None:
    """A trial that timed out during its load run: the time it held the GPUs still counts."""
    clock = Clock()
    spent = PhaseTimes(clock)
    spent.enter("load")
    clock.now += 42
    assert spent.record()["load_s"] == 42.0 and spent.record()["server_s"] == 42.0


SPACE = {"mem-fraction-static": FloatDistribution(0.5, 0.95)}


def _trial(
    mfs: float,
    value: float | None,
    server_s: float | None,
    *,
    feasible: bool = True,
    state: TrialState = TrialState.COMPLETE,
    **attrs: Any,
) -> FrozenTrial:
    if server_s is not None:
        attrs[Attr.SPENT] = {"startup_s": 600.0, "load_s": server_s - 600.0, "server_s": server_s}
        attrs[Attr.SPENT]["gpus"] = 8
    c = -1.0 if feasible else 1.0
    return create_trial(
        state=state,
        params={"mem-fraction-static": mfs},
        distributions=SPACE,
        value=value if state == TrialState.COMPLETE else None,
        user_attrs=attrs,
        system_attrs={"constraints": [c] * len(CONSTRAINT_KEYS)},
    )


def _numbered(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    for i, t in enumerate(trials):
        t.number = i
    return trials


def test_the_study_counts_gpu_hours_to_the_first_config_within_two_percent() -> None:
    trials = _numbered(
        [
            _trial(0.75, 995.0, 900, status=Status.CUT),  # 2: a projection, never a held score
            _trial(0.9, 900.0, 1800),  # 4 GPU-hours, 10% short of the winner
            _trial(0.5, 0.0, 900, feasible=False, status=Status.START_FAILED),  # 2
            _trial(0.6, None, 450, state=TrialState.FAIL),  # a world failure: 1, spent all the same
            _trial(0.7, 2000.0, 900, feasible=False),  # beyond, but missed its SLOs: 2
            _trial(0.8, 985.0, 1800),  # 4: within 2% of 1000 -> held at 15 GPU-hours
            _trial(0.8, 985.0, None, duplicate_of=5),  # answered from #4: nothing ran
            _trial(0.85, 1010.0, 1800),  # 4: the best, later
            _trial(0.55, 0.0, None, status=Status.REJECTED),  # the pre-check: nothing ran
        ]
    )
    attrs = {
        f"{CONFIRM_SPENT_ATTR}:w1": {"6": [{"server_s": 900, "gpus": 8, "load_s": 300}]},
        f"{CONFIRM_SPENT_ATTR}:w2": {"4": [{"server_s": 450, "gpus": 8}]},
        "unrelated": {"6": [1.0]},
    }
    spent = gpu_time(trials, attrs, score=1000.0)
    assert spent.search == pytest.approx(19.0) and spent.confirm == pytest.approx(3.0)
    assert spent.total == pytest.approx(22.0) and spent.unrecorded == 0
    assert spent.first_within == (5, 15.0)
    assert spent.phases["startup_s"] == pytest.approx(7 * 600 * 8 / 3600)
    assert spent.phases["load_s"] == pytest.approx((19 - 7 * 600 * 8 / 3600) + 300 * 8 / 3600)
    out = spent.as_json()
    assert out["first_within"] == {"trial": 5, "gpu_hours": 15.0, "server_hours": 1.875}
    assert out["total"] == 22.0
    # the same seconds, not multiplied by the 8 GPUs: 9,900 s in all, 6,750 s by trial 5
    assert spent.hours == pytest.approx(2.75) and out["server_hours"] == 2.75
    assert "GPU-hours: 22.00 in 2.75 server-hours (search 19.00" in spent.text()
    assert (
        "first within 2% of the winner's score at 15.00 GPU-hours, 1.88 server-hours (trial #5)"
        in spent.text()
    )
    # nothing feasible came within 2% of 1200 (only the infeasible 2000 did); no winner: none
    assert gpu_time(trials, attrs, score=1200.0).first_within is None
    assert gpu_time(trials, attrs, score=None).first_within is None


def test_trials_from_before_the_records_are_counted_apart() -> None:
    trials = _numbered([_trial(0.9, 940.0, None), _trial(0.8, 950.0, 3600)])
    spent = gpu_time(trials, {}, score=950.0)
    assert spent.unrecorded == 1 and spent.search == pytest.approx(8.0)
    assert spent.first_within == (0, 0.0)  # held it before anything was recorded
    assert "1 trial(s) ran before time was recorded" in spent.text()


def test_the_report_and_status_say_it_beside_the_winner() -> None:
    import optuna

    from tests.helpers.studies import study_dict
    from tuner.config.load import parse_study
    from tuner.report.page import verdict

    study = optuna.create_study(direction="maximize")
    for t in _numbered([_trial(0.9, 900.0, 1800), _trial(0.8, 1000.0, 1800)]):
        study.add_trial(t)
    study.set_user_attr(f"{CONFIRM_SPENT_ATTR}:w", {"1": [{"server_s": 1800, "gpus": 8}]})
    cfg = parse_study(study_dict(space={"mem-fraction-static": {"low": 0.5, "high": 0.95}}))
    page = verdict(cfg, study)
    assert "Winner: trial 1" in page
    assert "GPU-hours: 12.00 in 1.50 server-hours (search 8.00, confirmation 4.00" in page
    assert "score at 8.00 GPU-hours, 1.00 server-hours (trial #1)" in page
