"""Queries over a study's trials: completed, feasible, the best, confirmations. No writes.

`tuner status`, `export`, `report` and the loop read the study through these, so "feasible",
"best" and "measured before" mean the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.space import canonical
from tuner.trial import Attr, is_feasible

#: study attribute prefix of one worker's confirmation runs (+ ":" + worker)
CONFIRM_ATTR = "tuner:confirmations"


def completed(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Completed, feasible trials that measured (duplicates answer from an earlier trial)."""
    return [
        t
        for t in completed(study)
        if t.values is not None
        and is_feasible(t.constraints)
        and Attr.DUPLICATE_OF not in t.user_attrs
    ]


def measured_before(
    study: optuna.Study, params: Mapping[str, Any], number: int
) -> FrozenTrial | None:
    """A completed trial other than `number` with the same configuration, if any."""
    key = canonical(params)
    for t in completed(study):
        if t.number != number and canonical(t.params) == key and t.values is not None:
            return t
    return None


def top_trials(study: optuna.Study, top: int) -> list[FrozenTrial]:
    """The best `top` feasible trials by the first objective, one per distinct configuration."""
    seen: set[str] = set()
    out = []
    for t in sorted(feasible_trials(study), key=lambda t: t.values[0], reverse=True):
        key = canonical(t.params)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:top]


def all_confirmations(study: optuna.Study) -> dict[str, list[float]]:
    """Confirmation runs by trial number, merged over every worker's record."""
    merged: dict[str, list[float]] = {}
    for key, runs in study.user_attrs.items():
        if key.startswith(CONFIRM_ATTR + ":"):
            for trial, values in (runs or {}).items():
                merged.setdefault(trial, []).extend(values)
    return merged


def best_trial(study: optuna.Study) -> tuple[FrozenTrial | None, dict[str, Any]]:
    """The winner: highest mean of first measurement and confirmations; with the spread."""
    confirmations = all_confirmations(study)
    best, summary = None, {}
    for t in top_trials(study, max(len(confirmations), 1)):
        runs = [t.values[0], *confirmations.get(str(t.number), [])]
        mean = sum(runs) / len(runs)
        if best is None or mean > summary["mean"]:
            best = t
            summary = {
                "mean": mean,
                "runs": runs,
                "spread_pct": 100 * (max(runs) - min(runs)) / mean if mean else 0.0,
            }
    return best, summary


def server_info_of(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """Server info of a trial, or of the trial that started the server it reused."""
    if trial.user_attrs.get(Attr.SERVER_INFO):
        return dict(trial.user_attrs[Attr.SERVER_INFO])
    for t in reversed(completed(study)[: trial.number]):
        if t.user_attrs.get(Attr.SERVER_INFO):
            return dict(t.user_attrs[Attr.SERVER_INFO])
    return {}
