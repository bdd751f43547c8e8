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

Neighbours are ranked by evidence: a value that some measured trial served within `PROMISING`
of the best with comes first, then values never measured, in the space's order. A value that
served less is left to the sampler only when it did so at an mfs at least the neighbour's;
measured only below it, with a smaller pool than the neighbour's would have, it comes last: a
layout may hold far more at its own cliff (Kimi generation: DP attention 8 with graph batch 256
serves 0.80 of the best at its cliff, mfs 0.89; with batch 64 at 0.95 it is the optimum). A
neighbour already tried is not proposed again. At most `PER_BEST` neighbour layouts run per
best: each is a restart the sampler would otherwise spend (a retry below a layout's failure is
the same neighbour, not another).

Pure: trials and the space in, params out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.capacity.precheck import MEMORY_FLAGS, memory_key
from tuner.config.space import CLIENT_PARAMS, ParamSpec
from tuner.outcome import Attr, is_feasible
from tuner.search.space import canonical, condition_holds, ordered
from tuner.sglang.flags import full_name

MFS = "mem-fraction-static"
#: a value whose best measured trial served less than this share of the best is not proposed
PROMISING = 0.85
#: neighbours run per best trial, at most
PER_BEST = 2

Flags = Mapping[str, Any]


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
) -> dict[str, Any] | None:
    """The next neighbour of `best` (at its cliff) to run, or None.

    `trials`: the study's (queued or running ones count as tried); `measured`: completed
    feasible ones, best first; `grid`: mfs's ladder; `fails_on_gpu`: a trial that failed for
    the GPU's memory at its mfs."""
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
            mfs = _below_failures(params, float(m_b), trials, grid, flags_for, fails_on_gpu)
            if mfs is None:
                continue
            params[MFS] = mfs
            if canonical(_layout(params)) in tried:
                continue
            with_value = [t for t in measured if t.params.get(name) == value]
            evidence = max((t.values[0] for t in with_value), default=None)
            if evidence is None:
                scored.append((1, -math.inf, -i, params))  # unseen: after the promising
            elif evidence >= PROMISING * best.values[0]:
                scored.append((2, evidence, -i, params))
            elif all(_mfs_of(t) < mfs - 1e-9 for t in with_value):
                # weak, but only with a smaller pool than the neighbour's: last, not never
                scored.append((0, evidence, -i, params))
    if not scored:
        return None
    return max(scored, key=lambda s: s[:3])[3]


def _mfs_of(t: FrozenTrial) -> float:
    m = t.params.get(MFS)
    return float(m) if isinstance(m, int | float) else -math.inf


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
