"""The winner and its margin over the runner-up, against the run-to-run noise (results.py),
and how the export says it."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from tuner.export import _versus
from tuner.results import CONFIRM_ATTR, best_trial, versus_runner_up
from tuner.trial import CONSTRAINT_KEYS


def _study(first: dict[float, float], confirmations: dict[str, list[float]]) -> optuna.Study:
    """One feasible trial per mfs (its first measurement), and one worker's confirmations."""
    study = optuna.create_study(direction="maximize")
    for mfs, value in first.items():
        study.add_trial(
            create_trial(
                params={"mem-fraction-static": mfs},
                distributions={"mem-fraction-static": FloatDistribution(0.8, 0.95)},
                value=value,
                system_attrs={"constraints": [-1.0] * len(CONSTRAINT_KEYS)},
            )
        )
    study.set_user_attr(f"{CONFIRM_ATTR}:w", confirmations)
    return study


def test_a_gap_beyond_the_noise_is_separated() -> None:
    study = _study({0.9: 1000, 0.85: 900}, {"0": [1010, 990], "1": [905, 895]})
    best, summary = best_trial(study)
    assert best is not None and best.number == 0 and summary["mean"] == pytest.approx(1000)
    v = versus_runner_up(study)
    assert v is not None and v["runner_up"] == 1 and v["gap_pct"] == pytest.approx(10.0)
    # pooled relative sd of both: sqrt((2 x 1% ^2 + 2 x 0.56% ^2) / 4 dof) = 0.81%
    assert v["noise_pct"] == pytest.approx(0.809, abs=0.005) and v["separated"] is True
    assert "beyond the noise" in _versus(v)


def test_a_gap_inside_the_noise_is_not() -> None:
    # 2% apart, but each configuration's own runs differ by ~10%
    study = _study({0.9: 1100, 0.85: 1080}, {"0": [900, 1060], "1": [880, 1020]})
    v = versus_runner_up(study)
    assert v is not None and 0 < v["gap_pct"] < 3 and v["separated"] is False
    assert "within the noise" in _versus(v)


def test_one_run_each_says_the_noise_is_unknown() -> None:
    study = _study({0.9: 1000, 0.85: 900}, {"0": [], "1": []})
    v = versus_runner_up(study)
    assert v is not None and v["separated"] is None and "noise unknown" in _versus(v)
    # a single candidate has no runner-up to compare with
    assert versus_runner_up(_study({0.9: 1000}, {})) is None
