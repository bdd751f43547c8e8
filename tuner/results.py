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


def _ranked(study: optuna.Study) -> list[tuple[FrozenTrial, list[float], float]]:
    """The candidates (the confirmed configurations, or the best one) as (trial, runs, mean),
    best mean first: runs are the first measurement and every confirmation."""
    confirmations = all_confirmations(study)
    out = []
    for t in top_trials(study, max(len(confirmations), 1)):
        runs = [t.values[0], *confirmations.get(str(t.number), [])]
        out.append((t, runs, sum(runs) / len(runs)))
    return sorted(out, key=lambda c: c[2], reverse=True)


def best_trial(study: optuna.Study) -> tuple[FrozenTrial | None, dict[str, Any]]:
    """The winner: highest mean of first measurement and confirmations; with the spread."""
    ranked = _ranked(study)
    if not ranked:
        return None, {}
    best, runs, mean = ranked[0]
    spread = 100 * (max(runs) - min(runs)) / mean if mean else 0.0
    return best, {"mean": mean, "runs": runs, "spread_pct": spread}


def versus_runner_up(study: optuna.Study) -> dict[str, Any] | None:
    """How far the winner's mean is ahead of the runner-up's, against the run-to-run noise.

    The noise is the relative standard deviation pooled over every candidate with two runs or
    more (one configuration's runs differ by a few %: bench_search's noise table); the gap is
    real ("separated") when it exceeds twice the standard error of the difference of the two
    means (~95%). None with fewer than two candidates; `separated` None when no candidate ran
    twice (nothing to judge the noise by).
    """
    ranked = _ranked(study)
    if len(ranked) < 2:
        return None
    (_, w_runs, w_mean), (second, r_runs, r_mean) = ranked[0], ranked[1]
    squares, dof = 0.0, 0
    for _, runs, mean in ranked:
        if len(runs) > 1 and mean > 0:
            squares += sum(((x - mean) / mean) ** 2 for x in runs)
            dof += len(runs) - 1
    gap = 100 * (w_mean - r_mean) / w_mean if w_mean else 0.0
    out: dict[str, Any] = {"runner_up": second.number, "runner_up_mean": r_mean, "gap_pct": gap}
    if dof == 0:
        return {**out, "noise_pct": None, "two_sigma_pct": None, "separated": None}
    cv = (squares / dof) ** 0.5
    two_sigma = 200 * cv * (1 / len(w_runs) + 1 / len(r_runs)) ** 0.5
    return {**out, "noise_pct": 100 * cv, "two_sigma_pct": two_sigma, "separated": gap > two_sigma}


def server_info_of(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """Server info of a trial, or of the trial that started the server it reused."""
    if trial.user_attrs.get(Attr.SERVER_INFO):
        return dict(trial.user_attrs[Attr.SERVER_INFO])
    for t in reversed(completed(study)[: trial.number]):
        if t.user_attrs.get(Attr.SERVER_INFO):
            return dict(t.user_attrs[Attr.SERVER_INFO])
    return {}
