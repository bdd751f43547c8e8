"""The study's throughput curve in concurrency, pooled over its servers. Pure.

A server's start carries its own luck: the clocks, placement and the simulator's run factor
shift every load run of one server together (about 2% per start), so the server whose runs
scored highest is mostly the luckiest one, and the concurrency its own best point names is a
draw among the points near its peak (demo: 99, 104 and 108 lie within 2% on one server; held
out, 108 is worth 2% less). Servers that differ only in how much memory they give the KV pool
run the same curve wherever the pool admits every running request; so the study fits

    log value(server, concurrency) = level(server) + shape(concurrency) + noise

over every such point of its servers (a two-way additive model on a sparse table, fit by
alternating means), and a server's concurrency is the one of its points with the best pooled
`shape`: each server's luck cancels in its level, and a concurrency measured on several servers
is judged by all of them. A point that cannot pool (its own key) keeps its own measurement.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

#: alternating-means sweeps; the table is a few dozen points, and 30 sweeps settle it to
#: well below the noise (tests/unit/search/test_curve.py)
SWEEPS = 30


def fit(table: Sequence[Mapping[Hashable, float]], sweeps: int = SWEEPS) -> dict[Hashable, float]:
    """shape(key) for every key of `table` (one mapping per server: key -> a positive value),
    up to a constant. A key measured on one server only gets that server's value less its
    level, so an unpooled table ranks every server's points as they were measured."""
    rows = [{k: math.log(v) for k, v in row.items() if v > 0} for row in table]
    rows = [r for r in rows if r]
    level = [sum(r.values()) / len(r) for r in rows]
    shape: dict[Hashable, float] = {}
    for _ in range(sweeps):
        sums: dict[Hashable, list[float]] = {}
        for r, a in zip(rows, level, strict=True):
            for k, v in r.items():
                sums.setdefault(k, []).append(v - a)
        shape = {k: sum(xs) / len(xs) for k, xs in sums.items()}
        level = [sum(v - shape[k] for k, v in r.items()) / len(r) for r in rows]
    return shape


def narrowed(
    shape: Mapping[int, float], at: int, factor: float, floor: float, gain: float
) -> float:
    """The bracketing step for a search around `at`: the square root of the nearest pooled
    point on either side that is worse than `at` by more than `gain` (the study has already
    bracketed the peak that closely), within [floor, factor]; `factor` when there is none."""
    if at not in shape:
        return factor
    worse = math.log1p(gain)
    ratios = [
        max(c, at) / min(c, at) for c, s in shape.items() if c != at and s < shape[at] - worse
    ]
    if not ratios:
        return factor
    return min(max(math.sqrt(min(ratios)), floor), factor)
