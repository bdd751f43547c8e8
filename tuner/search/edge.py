"""Bisect mem-fraction-static toward its cliff, on the best server's other flags.

The KV pool grows with mfs until a cliff: CUDA-graph capture fails at start, then a band where
the server starts but a prefill runs out of memory under load (sglang-reference section 2).
Where the pool binds, the best server sits just below that cliff, and a sampler that draws mfs
at random needs many restarts to land on the one or two grid points there (Kimi TP8: mfs 0.91
serves 4% more than 0.90 and 0.92 dies under load). So after each trial the best feasible
configuration's mfs is raised halfway toward the nearest mfs above it that failed with the same
flags (or past the range's top when none did): each probe either becomes the best or lowers the
failure's mfs, so the gap halves with each restart, and ends when no grid point is left in it.

Where the GPU memory the layout's servers held after their load runs is known (nvidia-smi: a
real GPU host, or a virtual study), it predicts the cliff (search/ceiling.py): the probe goes
straight to the highest mfs predicted to fit, below any failure, and once the best sits there
the cliff counts as found one step above it. On Kimi TP8 that is 0.85 -> 0.91 in one restart,
where halving took three (0.90, 0.93 died under load, 0.91). A prediction rejects nothing: a
jump that dies is a failure like any other, and the gap below it is halved as before.

A probe only climbs toward a failure: where a feasible server above the best measured less, the
pool no longer binds there and climbing buys nothing. Failures of another server count when
SGLang's memory flags are the same (`capacity.precheck.memory_key`: a death or a graph failure is about
GPU memory, which hicache-size does not change); the pre-check rejects a probe it knows will
fail, which costs no restart and narrows the gap the same way.

No probe runs once a server with the best's flags but mfs found a latency limit (a point above
the concurrency its search chose missed an SLO or held it with no margin) at a concurrency its
pool and the best's hold at full length: there nothing waited for KV memory, so a larger pool
cannot move the limit (Llama-70B TP4 chat: the limit at ~60 requests, a pool for ~250; each
climb there was a restart lost, and the higher mfs only nearer its prefill OOM band).

Once the best sits at its cliff (the next grid point up failed on the GPU), the cliff is known
for every server with the same memory flags: one that differs in other flags (a hicache-size, a
scheduler knob) and served more per token of its KV pool than the best did is run at the best's
mfs (a lift), each such server once. On Kimi TP8 the chain finds the cliff with HiCache off in 2
restarts (the baseline, then the jump to 0.91) and the lifts carry the HiCache sizes the sampler
tried there.
With nothing to lift, one trial per best pins mfs and the memory flags at the cliff and leaves
the other flags to the sampler (a pin): a HiCache size is tried where the pool is largest on
the next restart, not below the cliff first (Kimi search-only median at 6 restarts 0.978 ->
0.995).

`edge_probe` is pure (trials in, params out); `ProbeEdge` is the optuna callback that queues it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.capacity.layout import reserve_mib
from tuner.capacity.precheck import MEMORY_FLAGS, Hardware, memory_key, pool_moved
from tuner.config.schema import StudyConfig
from tuner.config.space import CLIENT_PARAMS, ParamSpec
from tuner.outcome import Attr, Status, is_feasible
from tuner.search.ceiling import ceiling
from tuner.search.mode import NAME, sampled_space
from tuner.search.neighbour import MFS, PROMISING, Memory, mfs_of, neighbour_probe, pool_of
from tuner.search.space import canonical, distributions
from tuner.sglang.failures import FailureClass
from tuner.sglang.flags import full_name

#: the grid a range without a step is bisected on (SGLang reads mfs to any precision; a hundredth
#: of the GPU is ~1 GB on an 80-100 GB card, below the run-to-run noise of the pool it buys)
DEFAULT_STEP = 0.01
#: start failures that say the GPU's memory ran out at this mfs (not the host's, not the world's)
GPU_FAILURES = (FailureClass.OOM_CUDA_GRAPH,)

Flags = Mapping[str, Any]
#: a pool's size in tokens -> how many requests it holds at their full length
Holds = Callable[[int | None], float]


def ladder(dist: BaseDistribution) -> list[float]:
    """The mfs values a probe may take: the choices, or the range's grid (optuna's values)."""
    if isinstance(dist, CategoricalDistribution):
        return sorted(float(c) for c in dist.choices if isinstance(c, int | float))
    if not isinstance(dist, FloatDistribution) or dist.log:
        return []
    step = dist.step or DEFAULT_STEP
    n = math.floor((dist.high - dist.low) / step + 1e-9)
    return [round(dist.low + k * step, 10) for k in range(n + 1)]


def _others(params: Flags) -> str:
    return canonical({k: v for k, v in params.items() if k != MFS})


def _fails_on_gpu(t: FrozenTrial) -> bool:
    """Died under load, or failed CUDA-graph capture: the GPU's memory, whatever hicache."""
    status = t.user_attrs.get(Attr.STATUS)
    return status == Status.DIED or (
        status == Status.START_FAILED and t.user_attrs.get(Attr.FAILURE) in GPU_FAILURES
    )


class Probe(NamedTuple):
    params: dict[str, Any]
    of: int  # the trial whose other flags it keeps, at a higher mfs
    pin: bool = False  # only mfs and the memory flags are set: the sampler draws the rest
    neighbour: bool = False  # one layout flag changed (search/neighbour.py)


def _measured(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Completed, feasible trials that measured their own server, best first."""
    ok = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.values is not None
        and is_feasible(t.constraints)
        and Attr.DUPLICATE_OF not in t.user_attrs
        and mfs_of(t) is not None
    ]
    return sorted(ok, key=lambda t: (-t.values[0], t.number))


def _best(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    return next(iter(_measured(trials)), None)


def _above(
    t: FrozenTrial, trials: Sequence[FrozenTrial], flags_for: Callable[[Flags], Flags]
) -> tuple[float, bool]:
    """The nearest mfs above `t`'s that ran or was judged with its flags, or failed on the GPU
    with its memory flags, and whether it failed; (inf, True) when none did."""
    m_t, others, key = mfs_of(t), _others(t.params), memory_key(flags_for(t.params))
    assert m_t is not None
    above: list[tuple[float, bool]] = []
    for u in trials:
        m = mfs_of(u)
        if u.state != TrialState.COMPLETE or m is None or m <= m_t + 1e-9:
            continue
        if _others(u.params) == others:
            above.append((m, not is_feasible(u.constraints)))
        elif _fails_on_gpu(u) and memory_key(flags_for(u.params)) == key:
            above.append((m, True))
    return min(above, default=(math.inf, True))


def _bisect(m_b: float, hi: float, grid: list[float]) -> float | None:
    """The grid point halfway between the best's mfs and the failure above it, if any is left;
    none failed above: the range's top counts as failed one step past it, so it is reachable."""
    inside = [m for m in grid if m_b + 1e-9 < m < hi - 1e-9]
    if not inside:
        return None
    ceiling = hi if hi < math.inf else grid[-1] + (grid[-1] - grid[0]) / max(1, len(grid) - 1)
    mid = (m_b + ceiling) / 2
    return min(inside, key=lambda m: (abs(m - mid), m))


def _toward(
    t: FrozenTrial,
    hi: float,
    trials: Sequence[FrozenTrial],
    grid: list[float],
    flags_for: Callable[[Flags], Flags],
) -> tuple[float | None, float]:
    """The next mfs to probe above `t`'s, below `hi` (the failure above it), and the cliff as
    known: where the GPU memory its layout's servers held predicts one below `hi`
    (search/ceiling.py), the highest grid point under that, else halfway (`_bisect`)."""
    m_t = mfs_of(t)
    assert m_t is not None
    top = ceiling(trials, t.params, grid, flags_for)
    if top is None or top >= hi - 1e-9:
        return _bisect(m_t, hi, grid), hi
    fits = [m for m in grid if m_t + 1e-9 < m < top - 1e-9]
    return (max(fits) if fits else None), top


def _chosen(t: FrozenTrial) -> int | None:
    c = (t.user_attrs.get(Attr.CLIENT) or {}).get(NAME)
    return int(c) if isinstance(c, int | float) else None


def _pool_idle(best: FrozenTrial, trials: Sequence[FrozenTrial], holds: Holds | None) -> bool:
    """A server with the best's flags but mfs met a latency limit (a measured point above the
    concurrency its search chose, not clear of the SLOs) at a concurrency that its pool and the
    best's both hold at full length: the limit is not the pool's, the best runs below it, and
    more pool buys nothing there."""
    pool_b, chosen_b = pool_of(best), _chosen(best)
    if holds is None or pool_b is None or chosen_b is None:
        return False
    measured, others = (Status.OK, Status.SLO_MISSED), _others(best.params)
    for t in _measured(trials):
        pool, chosen = pool_of(t), _chosen(t)
        if pool is None or chosen is None or _others(t.params) != others:
            continue
        held = min(holds(int(pool)), holds(int(pool_b)))
        limits = [
            int(p[NAME])
            for p in t.user_attrs.get(Attr.LOAD_POINTS) or []
            if p.get("status") in measured and not p.get("clear")
        ]
        if any(max(chosen, chosen_b) < c <= held for c in limits):
            return True
    return False


def _at_cliff(best: FrozenTrial, hi: float, grid: list[float]) -> bool:
    """The next grid point above the best's mfs failed on the GPU, or there is none."""
    m_b = mfs_of(best)
    assert m_b is not None
    up = [m for m in grid if m > m_b + 1e-9]
    return not up or abs(hi - up[0]) <= 1e-9


def _lift(
    best: FrozenTrial, trials: Sequence[FrozenTrial], flags_for: Callable[[Flags], Flags]
) -> Probe | None:
    """With the best at its memory flags' cliff (`_at_cliff`, checked by the caller): another server with the same memory flags but other flags (a
    hicache-size, a scheduler knob) that served more per token of its pool than the best did,
    at a lower mfs, is run at the best's mfs: the cliff is the GPU's, theirs too."""
    m_b, pool_b = mfs_of(best), pool_of(best)
    assert m_b is not None
    if pool_b is None:
        return None
    key, others = memory_key(flags_for(best.params)), _others(best.params)
    tried = {canonical(t.params) for t in trials}
    for t in _measured(trials):
        m, pool = mfs_of(t), pool_of(t)
        if m is None or pool is None or m >= m_b - 1e-9 or _others(t.params) == others:
            continue
        if t.values[0] / pool < best.values[0] / pool_b:
            continue  # less per token of pool: raising its pool would not reach the best
        params = {**t.params, MFS: m_b}
        if memory_key(flags_for(params)) == key and canonical(params) not in tried:
            return Probe(params, t.number)
    return None


def _memory_params(params: Flags) -> dict[str, Any]:
    """The params that are SGLang memory flags (their changes move the cliff)."""
    return {k: v for k, v in params.items() if full_name(k) in MEMORY_FLAGS}


def _pin(best: FrozenTrial, trials: Sequence[FrozenTrial], sampled: Sequence[str]) -> Probe | None:
    """At the cliff with nothing to lift: once per best, a trial at its mfs and memory flags
    whose other server flags (a hicache-size, a scheduler knob) the sampler draws, so they are
    tried where the pool is largest instead of below the cliff, then lifted (a restart more)."""
    m_b = mfs_of(best)
    fixed = {**_memory_params(best.params), MFS: m_b}
    if not any(k not in fixed for k in sampled):
        return None  # nothing left for the sampler to draw: it would be the best again
    if any(t.user_attrs.get(Attr.EDGE_PIN) == best.number for t in trials):
        return None
    return Probe(fixed, best.number, pin=True)


def edge_probe(
    trials: Sequence[FrozenTrial],
    dist: BaseDistribution,
    flags_for: Callable[[Flags], Flags],
    holds: Holds | None = None,
    sampled: Sequence[str] = (),
    space: Mapping[str, ParamSpec] | None = None,
    memory: Memory | None = None,
) -> Probe | None:
    """The next probe toward mfs's cliff, or None (nothing left to probe).

    `trials`: the study's (those queued or running count as tried); `dist`: mfs's
    distribution; `flags_for`: params -> server flags; `holds`: pool -> requests it holds at
    full length (the inner search's; None: the pool is taken to bind); `sampled`: the
    server params the sampler proposes (none: no pin); `space`: the sampled space (None: no
    neighbours); `memory`: what the GPU's memory says of neighbours (`neighbour.Memory`)."""
    best = _best(trials)
    grid = ladder(dist)
    if best is None or not grid or _pool_idle(best, trials, holds):
        return None
    m_b = mfs_of(best)
    assert m_b is not None
    hi, failed = _above(best, trials, flags_for)
    if not failed:
        return None  # a feasible server above measured less: the pool does not bind up there
    pick, hi = _toward(best, hi, trials, grid, flags_for)
    if pick is not None:
        return Probe({**best.params, MFS: pick}, best.number)
    if not _at_cliff(best, hi, grid):
        return None
    return (
        _lift(best, trials, flags_for)
        or _pin(best, trials, sampled)
        or _other_cliffs(best, trials, grid, flags_for, holds)
        or _next_to(best, trials, grid, flags_for, space, memory)
    )


def _other_cliffs(
    best: FrozenTrial,
    trials: Sequence[FrozenTrial],
    grid: list[float],
    flags_for: Callable[[Flags], Flags],
    holds: Holds | None,
) -> Probe | None:
    """Each memory layout has its own cliff (a smaller CUDA-graph batch or no draft leaves room
    for a larger pool): the best server of another layout that served within PROMISING of the
    best is climbed toward its own cliff, as the best was. A neighbour run at the best's mfs
    is then taken to where its layout can go before it is judged."""
    seen = {memory_key(flags_for(best.params))}
    for t in _measured(trials):
        key = memory_key(flags_for(t.params))
        if key in seen:
            continue
        seen.add(key)
        if t.values[0] < PROMISING * best.values[0] or _pool_idle(t, trials, holds):
            continue
        hi, failed = _above(t, trials, flags_for)
        pick = _toward(t, hi, trials, grid, flags_for)[0] if failed else None
        if pick is not None:
            return Probe({**t.params, MFS: pick}, t.number)
    return None


def _next_to(
    best: FrozenTrial,
    trials: Sequence[FrozenTrial],
    grid: list[float],
    flags_for: Callable[[Flags], Flags],
    space: Mapping[str, ParamSpec] | None,
    memory: Memory | None = None,
) -> Probe | None:
    """At the cliff, lifted and pinned: a neighbour layout (search/neighbour.py)."""
    if not space:
        return None
    measured = _measured(trials)
    params = neighbour_probe(best, trials, measured, space, grid, flags_for, _fails_on_gpu, memory)
    return Probe(params, best.number, neighbour=True) if params is not None else None


def _memory(hw: Hardware, flags_for: Callable[[Flags], Flags]) -> Memory | None:
    """The neighbours' `Memory` on this hardware; None without the GPU's memory."""
    gpu = hw.gpu_mem_mib
    if not gpu:
        return None

    def pool_at(params: Flags, tokens: int, at: float, to: float) -> int | None:
        return pool_moved(flags_for({**params, MFS: at}), tokens, at, to, hw)

    def spare(best: Flags, params: Flags) -> float:
        return (reserve_mib(flags_for(best), gpu) - reserve_mib(flags_for(params), gpu)) / gpu

    return Memory(pool_at, spare)


class ProbeEdge:
    """After each trial, queue `edge_probe`'s params unless they are tried, queued or running,
    or another trial waits (a probe chain runs one restart at a time)."""

    def __init__(
        self,
        dist: BaseDistribution | None,
        flags_for: Callable[[Flags], Flags],
        n_trials: int | None = None,
        holds: Holds | None = None,
        sampled: Sequence[str] = (),
        space: Mapping[str, ParamSpec] | None = None,
        memory: Memory | None = None,
    ):
        self.dist, self.flags_for, self.n_trials = dist, flags_for, n_trials
        self.holds, self.sampled, self.space = holds, tuple(sampled), space
        self.memory = memory

    @classmethod
    def of(
        cls,
        cfg: StudyConfig,
        flags_for: Callable[[Flags], Flags],
        n_trials: int | None = None,
        holds: Holds | None = None,
        hardware: Hardware | None = None,
    ) -> ProbeEdge:
        """The study's probe: on mfs as the sampler proposes it; none when mfs is not searched
        or `sampler.mfs_edge` is off; `holds`: what a pool holds (the study's inner search's
        `InnerSearch.holds`; None without one); `hardware`: the pre-check's (the neighbours'
        `Memory`; None, or no GPU memory in it: none)."""
        space = sampled_space(cfg)
        dist = distributions(space).get(MFS) if cfg.sampler.mfs_edge else None
        server = [k for k in space if k not in CLIENT_PARAMS]
        memory = _memory(hardware, flags_for) if hardware is not None else None
        return cls(dist, flags_for, n_trials, holds, server, space, memory)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.dist is None or trial.state != TrialState.COMPLETE:
            return
        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        if self.n_trials is not None and len(done) >= self.n_trials:
            return
        if any(t.state == TrialState.WAITING for t in trials):
            return
        live = [t for t in trials if t.state != TrialState.FAIL]
        probe = edge_probe(
            live, self.dist, self.flags_for, self.holds, self.sampled, self.space, self.memory
        )
        if probe is None:
            return
        if probe.pin:
            study.enqueue_trial(probe.params, user_attrs={Attr.EDGE_PIN: probe.of})
            return
        key = canonical(probe.params)
        if any(canonical(t.params) == key for t in live):
            return
        attr = Attr.EDGE_NEIGHBOUR if probe.neighbour else Attr.EDGE_OF
        study.enqueue_trial(probe.params, user_attrs={attr: probe.of})
