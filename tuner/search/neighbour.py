"""One memory-layout flag away from the best, once the best sits at its own cliff.

A study whose space holds layout flags (DP attention and its size, speculative decoding, the
CUDA-graph batch: `capacity.precheck.MEMORY_FLAGS`) has one mfs cliff per layout, and its
optimum is often one flag away from a layout that looks almost as good: on the Kimi generation
study DP attention 4 at its cliff serves 0.90 of the optimum, DP 8 + EAGLE-3 0.91, and only DP 8
without speculation, graph batch 64, at mfs 0.95 serves more. A sampler sees a plateau there;
the edge probe climbs one layout only. So once the best is at its cliff with nothing to lift or
pin (search/edge.py), a *neighbour* runs: the best's params with one layout flag changed, at
the best's mfs (or just below the lowest mfs where that layout already failed on the GPU). If it
measures more it becomes the best and the edge probe climbs its own cliff from there.

A neighbour starts at the best's mfs, or one grid step higher when SGLang's reserve for its
layout (`capacity.layout.reserve_mib`: CUDA graphs per DP group, chunked prefill, a draft) is
smaller than the best's by at least that step: the best's layout fits at its mfs, this one
needs that much less besides the pool (Kimi generation: graph batch 64 instead of 256 under DP
attention 4 starts at 0.93 where batch 256 died, a climb's restart saved). Then below any mfs
where its own layout failed on the GPU.

Neighbours are ranked by evidence, best first:
1. values that some measured trial served within `PROMISING` of the best with, by score;
2. values measured only at a lower mfs whose score (at the highest mfs measured: the tightest
   bound), grown in step with the pool their layout would have at the neighbour's mfs
   (`capacity.precheck.pool_moved`: an upper bound, since more pool admits more requests, none
   faster), reaches `PROMISING` of the best, by that bound
   (Kimi generation: DP attention 8 served 0.74 of the best with graph batch 256 at mfs 0.89,
   a pool of 44 k tokens a rank; at 0.95 its pool is 3x that, and it is the optimum);
3. values never measured: those that start above the best's mfs (a larger pool at once, where
   the pool binds) first, then in the space's order;
4. values that served less, only at a lower mfs, and do not reach it even grown: last, not never.
A value that served less at the neighbour's mfs or above is left to the sampler. A neighbour
already tried is not proposed again. At most `PER_BEST` neighbour layouts run per best: each
is a restart the sampler would otherwise spend (a retry below a layout's failure is the same
neighbour, not another).

Pure: trials and the space in, params out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from optuna.trial import FrozenTrial, TrialState

from tuner.capacity.precheck import MEMORY_FLAGS, memory_key
from tuner.config.space import CLIENT_PARAMS, ParamSpec
from tuner.outcome import POOL_ATTR, Attr, is_feasible
from tuner.search.space import canonical, condition_holds, ordered
from tuner.sglang.flags import full_name

MFS = "mem-fraction-static"
#: a value whose best measured trial served less than this share of the best is not proposed
PROMISING = 0.85
#: neighbours run per best trial, at most
PER_BEST = 2

Flags = Mapping[str, Any]


class Memory(NamedTuple):
    """What the GPU's memory says of neighbours (`edge.ProbeEdge.of` builds it from the
    pre-check's hardware; without one, neither is known)."""

    #: (a measured trial's params, the pool its start reported, its mfs, another mfs) -> the
    #: pool that layout would report there, or None (`capacity.precheck.pool_moved`)
    pool_at: Callable[[Flags, int, float, float], int | None]
    #: (the best's params, a neighbour's) -> the share of the GPU SGLang's reserve keeps outside
    #: the pool for the best's layout beyond the neighbour's (`capacity.layout.reserve_mib`)
    spare: Callable[[Flags, Flags], float]


def layout_params(space: Mapping[str, ParamSpec]) -> list[str]:
    """The searched server params with choices that are SGLang memory flags (mfs aside)."""
    return [
        n
        for n, s in space.items()
        if n != MFS
        and n not in CLIENT_PARAMS
        and s.kind in ("categorical", "bool")
        and full_name(n) in MEMORY_FLAGS
    ]


def _choices(spec: ParamSpec) -> list[Any]:
    return list(spec.choices) if spec.choices is not None else [False, True]


def _default(spec: ParamSpec) -> Any:
    """A value for a newly active param no trial had: the first choice, the range's middle."""
    if spec.kind in ("categorical", "bool"):
        return _choices(spec)[0]
    assert spec.low is not None and spec.high is not None
    mid = (spec.low + spec.high) / 2
    if spec.step:
        mid = spec.low + round((mid - spec.low) / spec.step) * spec.step
    return round(mid) if spec.kind == "int" else round(mid, 10)


def _with(
    best: Flags,
    name: str,
    value: Any,
    space: Mapping[str, ParamSpec],
    donors: Sequence[FrozenTrial],
) -> dict[str, Any]:
    """`best` with `name` = `value`; params it activates taken from the best donor that had
    them with that value (else `_default`), params it deactivates dropped."""
    params = {**best, name: value}
    donor = next((d.params for d in donors if d.params.get(name) == value), {})
    out: dict[str, Any] = {}
    for n in ordered(space):
        if not condition_holds(space[n].when, out):
            continue
        out[n] = params[n] if n in params else donor[n] if n in donor else _default(space[n])
    return out


def neighbour_probe(
    best: FrozenTrial,
    trials: Sequence[FrozenTrial],
    measured: Sequence[FrozenTrial],
    space: Mapping[str, ParamSpec],
    grid: Sequence[float],
    flags_for: Callable[[Flags], Flags],
    fails_on_gpu: Callable[[FrozenTrial], bool],
    memory: Memory | None = None,
) -> dict[str, Any] | None:
    """The next neighbour of `best` (at its cliff) to run, or None.

    `trials`: the study's (queued or running ones count as tried); `measured`: completed
    feasible ones, best first; `grid`: mfs's ladder; `fails_on_gpu`: a trial that failed for
    the GPU's memory at its mfs; `memory`: pools along mfs and reserves by layout (None: weak
    evidence is not projected and a neighbour starts at the best's mfs)."""
    if best.values is None or not grid:
        return None
    ran = {
        canonical(_layout(t.params, mfs=False))
        for t in trials
        if t.user_attrs.get(Attr.EDGE_NEIGHBOUR) == best.number
    }
    if len(ran) >= PER_BEST:
        return None
    m_b = best.params.get(MFS)
    if not isinstance(m_b, int | float):
        return None
    tried = {canonical(_layout(t.params)) for t in trials if t.state != TrialState.FAIL}
    scored: list[tuple[int, float, int, dict[str, Any]]] = []
    for i, name in enumerate(layout_params(space)):
        if name not in best.params:
            continue
        for value in _choices(space[name]):
            if value == best.params[name]:
                continue
            params = _with(best.params, name, value, space, measured)
            start = _start(best.params, params, float(m_b), grid, memory)
            mfs = _below_failures(params, start, trials, grid, flags_for, fails_on_gpu)
            if mfs is None:
                continue
            params[MFS] = mfs
            if canonical(_layout(params)) in tried:
                continue
            with_value = [t for t in measured if t.params.get(name) == value]
            evidence = max((t.values[0] for t in with_value), default=None)
            if evidence is None:  # unseen: after any evidence; one with a larger pool first
                scored.append((1, float(mfs > m_b + 1e-9), -i, params))
            elif evidence >= PROMISING * best.values[0]:
                scored.append((3, evidence, -i, params))
            elif all(_mfs_of(t) < mfs - 1e-9 for t in with_value):
                # weak, but only with a smaller pool than the neighbour's: grown to its pool,
                # within reach of the best before the unseen, else last (not never)
                grown = _grown(with_value, mfs, memory)
                if grown is not None and grown >= PROMISING * best.values[0]:
                    scored.append((2, grown, -i, params))
                else:
                    scored.append((0, evidence, -i, params))
    if not scored:
        return None
    return max(scored, key=lambda s: s[:3])[3]


def _grown(trials: Sequence[FrozenTrial], mfs: float, memory: Memory | None) -> float | None:
    """The most these trials' value could serve at `mfs` if its throughput grew in step with
    its pool (an upper bound: more pool admits more requests, none faster), from those measured
    at the highest mfs (the tightest bound: the least growth); None when no pool projects."""
    if memory is None:
        return None
    pooled = [t for t in trials if pool_of(t) and t.values is not None]
    if not pooled:
        return None
    top = max(_mfs_of(t) for t in pooled)
    out: list[float] = []
    for t in pooled:
        pool, m = int(pool_of(t) or 0), _mfs_of(t)
        if m < top - 1e-9:
            continue
        moved = memory.pool_at(t.params, pool, m, mfs)
        if moved is not None and moved > 0:
            out.append(t.values[0] * max(1.0, moved / pool))
    return max(out, default=None)


def pool_of(t: FrozenTrial) -> float | None:
    """The KV pool (tokens) its server reported, or None."""
    v = t.user_attrs.get(POOL_ATTR)
    return float(v) if isinstance(v, int | float) and v > 0 else None


def _start(
    best: Flags, params: Flags, m_b: float, grid: Sequence[float], memory: Memory | None
) -> float:
    """Where a neighbour starts: the best's mfs, or the next grid point up for a layout SGLang
    reserves at least that much less memory outside the pool for (the best's layout fits at its
    mfs; this one needs that much less besides the pool). One step at most: the reserve is
    SGLang's estimate, not a measurement, and a start that fails costs a restart."""
    room = memory.spare(best, params) if memory is not None else 0.0
    up = [m for m in grid if m > m_b + 1e-9]
    return up[0] if up and up[0] <= m_b + room + 1e-9 else m_b


def mfs_of(t: FrozenTrial) -> float | None:
    """The trial's mem-fraction-static, or None when it has none."""
    m = t.params.get(MFS)
    return float(m) if isinstance(m, int | float) else None


def _mfs_of(t: FrozenTrial) -> float:
    """`mfs_of`, ranked: a trial without one sorts below every mfs."""
    m = mfs_of(t)
    return -math.inf if m is None else m


def _layout(params: Flags, *, mfs: bool = True) -> dict[str, Any]:
    """What makes two trials the same server for a neighbour: every server param (less mfs
    when `mfs` is false: the same layout at another fraction)."""
    return {k: v for k, v in params.items() if k not in CLIENT_PARAMS and (mfs or k != MFS)}


def _below_failures(
    params: Flags,
    m_b: float,
    trials: Sequence[FrozenTrial],
    grid: Sequence[float],
    flags_for: Callable[[Flags], Flags],
    fails_on_gpu: Callable[[FrozenTrial], bool],
) -> float | None:
    """The best's mfs, or the highest grid point below the lowest mfs where this layout
    (its memory flags) already failed on the GPU; None when no grid point is left."""
    key = memory_key(flags_for({**params, MFS: m_b}))
    lowest = min(
        (
            float(t.params[MFS])
            for t in trials
            if t.state == TrialState.COMPLETE
            and MFS in t.params
            and not is_feasible(t.constraints)
            and fails_on_gpu(t)
            and memory_key(flags_for(t.params)) == key
        ),
        default=math.inf,
    )
    if lowest > m_b + 1e-9:
        return m_b
    below = [m for m in grid if m < lowest - 1e-9]
    return max(below) if below else None
