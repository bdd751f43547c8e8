"""Bisect mem-fraction-static toward its cliff, on the best server's other flags.

The KV pool grows with mfs until a cliff: CUDA-graph capture fails at start, then a band where
the server starts but a prefill runs out of memory under load (sglang-reference section 2).
Where the pool binds, the best server sits just below that cliff, and a sampler that draws mfs
at random needs many restarts to land on the one or two grid points there (Kimi TP8: mfs 0.91
serves 4% more than 0.90 and 0.92 dies under load). So after each trial the best feasible
configuration's mfs is raised halfway toward the nearest mfs above it that failed with the same
flags (or past the range's top when none did): each probe either becomes the best or lowers the
failure's mfs, so the gap halves with each restart, and ends when no grid point is left in it.

A probe only climbs toward a failure: where a feasible server above the best measured less, the
pool no longer binds there and climbing buys nothing. Failures of another server count when
SGLang's memory flags are the same (`precheck.memory_key`: a death or a graph failure is about
GPU memory, which hicache-size does not change); the pre-check rejects a probe it knows will
fail, which costs no restart and narrows the gap the same way.

`edge_probe` is pure (trials in, params out); `ProbeEdge` is the optuna callback that queues it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.config import StudyConfig
from tuner.innertrial import sampled_space
from tuner.precheck import memory_key
from tuner.sglang.failures import FailureClass
from tuner.space import canonical, distributions
from tuner.trial import Attr, Status, is_feasible

MFS = "mem-fraction-static"
#: the grid a range without a step is bisected on (SGLang reads mfs to any precision; a hundredth
#: of the GPU is ~1 GB on an 80-100 GB card, below the run-to-run noise of the pool it buys)
DEFAULT_STEP = 0.01
#: start failures that say the GPU's memory ran out at this mfs (not the host's, not the world's)
GPU_FAILURES = (FailureClass.OOM_CUDA_GRAPH,)

Flags = Mapping[str, Any]


def ladder(dist: BaseDistribution) -> list[float]:
    """The mfs values a probe may take: the choices, or the range's grid (optuna's values)."""
    if isinstance(dist, CategoricalDistribution):
        return sorted(float(c) for c in dist.choices if isinstance(c, int | float))
    if not isinstance(dist, FloatDistribution) or dist.log:
        return []
    step = dist.step or DEFAULT_STEP
    n = math.floor((dist.high - dist.low) / step + 1e-9)
    return [round(dist.low + k * step, 10) for k in range(n + 1)]


def _mfs(t: FrozenTrial) -> float | None:
    v = t.params.get(MFS)
    return float(v) if isinstance(v, int | float) else None


def _others(params: Flags) -> str:
    return canonical({k: v for k, v in params.items() if k != MFS})


def _fails_on_gpu(t: FrozenTrial) -> bool:
    """Died under load, or failed CUDA-graph capture: the GPU's memory, whatever hicache."""
    status = t.user_attrs.get(Attr.STATUS)
    return status == Status.DIED or (
        status == Status.START_FAILED and t.user_attrs.get(Attr.FAILURE) in GPU_FAILURES
    )


def _best(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    ok = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.values is not None
        and is_feasible(t.constraints)
        and Attr.DUPLICATE_OF not in t.user_attrs
        and _mfs(t) is not None
    ]
    return max(ok, key=lambda t: (t.values[0], -t.number), default=None)


def edge_probe(
    trials: Sequence[FrozenTrial], dist: BaseDistribution, flags_for: Callable[[Flags], Flags]
) -> dict[str, Any] | None:
    """The params of the next probe toward mfs's cliff, or None (nothing left to bisect).

    `trials`: the study's; `dist`: mfs's distribution; `flags_for`: params -> server flags."""
    best = _best(trials)
    grid = ladder(dist)
    if best is None or not grid:
        return None
    m_b, others = _mfs(best), _others(best.params)
    assert m_b is not None
    key = memory_key(flags_for(best.params))
    above: list[tuple[float, bool]] = []  # (mfs, failed) of what ran or was judged above m_b
    for t in trials:
        m = _mfs(t)
        if t.state != TrialState.COMPLETE or m is None or m <= m_b + 1e-9:
            continue
        if _others(t.params) == others:
            above.append((m, not is_feasible(t.constraints)))
        elif _fails_on_gpu(t) and memory_key(flags_for(t.params)) == key:
            above.append((m, True))
    hi, failed = min(above, default=(math.inf, True))
    if not failed:
        return None  # a feasible server above measured less: the pool does not bind up there
    inside = [m for m in grid if m_b + 1e-9 < m < hi - 1e-9]
    if not inside:
        return None
    # none failed above: the range's top counts as failed one step past it, so it is reachable
    ceiling = hi if hi < math.inf else grid[-1] + (grid[-1] - grid[0]) / max(1, len(grid) - 1)
    mid = (m_b + ceiling) / 2
    pick = min(inside, key=lambda m: (abs(m - mid), m))
    return {**best.params, MFS: pick}


class ProbeEdge:
    """After each trial, queue `edge_probe`'s params unless they are tried, queued or running,
    or another trial waits (a probe chain runs one restart at a time)."""

    def __init__(
        self,
        dist: BaseDistribution | None,
        flags_for: Callable[[Flags], Flags],
        n_trials: int | None = None,
    ):
        self.dist, self.flags_for, self.n_trials = dist, flags_for, n_trials

    @classmethod
    def of(
        cls, cfg: StudyConfig, flags_for: Callable[[Flags], Flags], n_trials: int | None = None
    ) -> ProbeEdge:
        """The study's probe: on mfs as the sampler proposes it; none when mfs is not searched
        or `sampler.mfs_edge` is off."""
        dist = distributions(sampled_space(cfg)).get(MFS) if cfg.sampler.mfs_edge else None
        return cls(dist, flags_for, n_trials)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.dist is None or trial.state != TrialState.COMPLETE:
            return
        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        if self.n_trials is not None and len(done) >= self.n_trials:
            return
        if any(t.state == TrialState.WAITING for t in trials):
            return
        params = edge_probe(done, self.dist, self.flags_for)
        if params is None:
            return
        key = canonical(params)
        if any(canonical(t.params) == key for t in trials if t.state != TrialState.FAIL):
            return
        best = _best(done)
        study.enqueue_trial(params, user_attrs={Attr.EDGE_OF: best.number if best else None})
