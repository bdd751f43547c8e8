"""Queries over a study's trials: completed, feasible, measured before, the top few, every
worker's confirmation runs. No writes.

`tuner status`, `export`, `report` and the loop read the study through these, so "feasible" and
"measured before" mean the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.outcome import Attr, Status, is_feasible
from tuner.search.space import canonical


def completed(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Completed, feasible trials that measured (duplicates answer from an earlier trial; a
    server whose runs were all cut holds a projection, not a score: trial/inner.py)."""
    return [
        t
        for t in completed(study)
        if t.values is not None
        and is_feasible(t.constraints)
        and Attr.DUPLICATE_OF not in t.user_attrs
        and t.user_attrs.get(Attr.STATUS) != Status.CUT
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


def aligned(values: Sequence[float], tails: Sequence[Any] | None) -> list[Any]:
    """One worker's tails of one trial, index by index with its values: None for a run that kept
    none (a death, a study before tails); a tail written just before a kill, without its value,
    is dropped (the run is run again)."""
    return [*(tails or ()), *[None] * len(values)][: len(values)]


def all_confirm_tails(study: optuna.Study) -> dict[str, list[dict[str, Any] | None]]:
    """Confirmation runs' tails by trial number, aligned with `all_confirmations`' values."""
    attrs = study.user_attrs
    merged: dict[str, list[dict[str, Any] | None]] = {}
    for key, runs in attrs.items():
        if key.startswith(CONFIRM_ATTR + ":"):
            tails = attrs.get(CONFIRM_TAILS_ATTR + key.removeprefix(CONFIRM_ATTR)) or {}
            for trial, values in (runs or {}).items():
                merged.setdefault(trial, []).extend(aligned(values, tails.get(trial)))
    return merged


def server_info_of(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """Server info of a trial, or of the trial that started the server it reused."""
    if trial.user_attrs.get(Attr.SERVER_INFO):
        return dict(trial.user_attrs[Attr.SERVER_INFO])
    for t in reversed(completed(study)[: trial.number]):
        if t.user_attrs.get(Attr.SERVER_INFO):
            return dict(t.user_attrs[Attr.SERVER_INFO])
    return {}


#: study attribute prefix of one worker's confirmation runs (+ ":" + worker)
CONFIRM_ATTR = "tuner:confirmations"


#: ... and of their latency tails, {trial: [tails or None, ...]} index by index with the values
CONFIRM_TAILS_ATTR = "tuner:confirm_tails"
