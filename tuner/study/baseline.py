"""Trial 0, what runs today: the params it is queued with and the concurrency it measures.

The study file's `baseline:` gives the searched server flags it sets; a flag it leaves out is
the sampler's, and a baseline that sets no server flag at all (only the client's concurrency)
runs SGLang's defaults, as a study without a baseline does. Under the inner search the sampler
proposes no concurrency, so the baseline's is where trial 0's inner search starts: measured
and kept among its points (`trials/0/points.json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.config.schema import StudyConfig
from tuner.config.space import CLIENT_PARAMS
from tuner.outcome import Attr
from tuner.search.mode import NAME, inner_mode, sampled_space
from tuner.search.space import active_params, condition_holds, sglang_defaults


def baseline_params(
    cfg: StudyConfig, gpu_mem_mib: float | None, sampler: optuna.samplers.BaseSampler | None = None
) -> dict[str, Any]:
    """What trial 0 is queued with (empty: nothing to queue)."""
    space = sampled_space(cfg)
    params = active_params(cfg.baseline, space) if cfg.baseline else {}
    if all(k in CLIENT_PARAMS for k in params):  # no server flag given: SGLang's own defaults
        params = {**sglang_defaults(cfg, gpu_mem_mib), **params}
    partial = any(n not in params and condition_holds(s.when, params) for n, s in space.items())
    if partial and isinstance(sampler, optuna.samplers.GridSampler):
        return {}  # the grid sampler takes an enqueued trial only whole: its own cells run
    return params


def baseline_start(cfg: StudyConfig) -> int | None:
    """The concurrency trial 0's inner search starts at (None: not the inner search, or the
    baseline names none)."""
    value = (cfg.baseline or {}).get(NAME)
    if not inner_mode(cfg) or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def aim_baseline(
    cfg: StudyConfig, runner: Any, attrs: Mapping[str, Any], study: optuna.Study
) -> None:
    """Before a trial runs: the runner recalls what the study's trials taught so far (every
    worker's, and a resumed run's: the pre-check's failures, the inner search's curve), and
    the baseline's search starts at its concurrency."""
    recall = getattr(runner, "recall", None)
    if recall is not None:
        recall(
            study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), attrs.get(Attr.WORKER)
        )
    inner = getattr(runner, "inner", None)
    if inner is not None:  # reset too: a baseline rejected before its search leaves none
        inner.start_next = baseline_start(cfg) if attrs.get(Attr.BASELINE) else None


def fixed_client(cfg: StudyConfig, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A measured trial of a study that does not search concurrency: its client as run
    (`workload.concurrency`), which the export recommends; {} otherwise."""
    fixed = cfg.workload.concurrency
    if fixed is None or NAME in cfg.space or Attr.METRICS not in attrs or attrs.get(Attr.CLIENT):
        return {}
    return {Attr.CLIENT: {NAME: fixed}}
