"""A server whose runs were all cut holds a projection (trial/inner.py): never a winner, a
confirmation candidate or the best the next server must beat."""

from __future__ import annotations

import optuna

from tests.unit.verdict.test_gpuhours import _trial
from tuner.outcome import Attr, Status
from tuner.verdict.trials import feasible_trials, top_trials


def test_a_cut_trial_is_never_a_candidate() -> None:
    study = optuna.create_study(direction="maximize")
    study.add_trial(_trial(0.9, 900.0, 1800, status=Status.OK, **{Attr.CLIENT: {"c": 64}}))
    # a projection above it (it may run high: the rule cut it only below the best of its time)
    study.add_trial(_trial(0.8, 950.0, 900, status=Status.CUT))
    assert [t.values[0] for t in feasible_trials(study)] == [900.0]
    assert [t.values[0] for t in top_trials(study, 3)] == [900.0]
