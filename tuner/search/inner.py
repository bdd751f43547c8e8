"""The inner search: the best client concurrency on one running server, under the SLOs. Pure.

Concurrency is a client-side knob: changing it costs a load run, never a restart. So in
`space.concurrency.search: inner` mode the sampler proposes server configurations only, and for
each server that starts this search finds its best concurrency with a few load runs:

1. start where the capacity model says the KV pool admits the workload's requests (`start_at`),
   or where an earlier server's best was; then, when the study gives one (`Bounds.explore`), one
   run where no server of the study has looked yet;
2. step up by `factor` while the throughput gains and the SLOs hold (or step down from an
   infeasible start until a point holds); then step down from the best point while that gains
   (past a peak, retraction or a slow queue can make less concurrency worth more);
3. then bisect, on the log scale, between the best point and its worse neighbours until the gap
   is below one `resolution` step; runs left look below the best by sqrt(`factor`) (a short
   window's throughput is bumpy in concurrency), until the run budget is spent. On the study's
   first look (`Bounds.first`: no earlier server's best to start from), when its runs measured
   a short window's ramp-up (`Point.bumpy`, loadgen/window.py) and the best gained less than two
   noise floors over the clear point below it, that look below comes before the bisection: a
   flat stretch of a bumpy curve is where a factor-2 bracket steps over a peak (the demo's 6 s
   windows: 64 -> 128 gains 4%, the peak is at 102). A steep rise into the best (tight's 32 ->
   64 gains 40%) says the best lies up at the edge, and the bisection goes first as before.

Throughput in concurrency rises until the pool or an SLO binds, then flattens (a queue) or the
SLO breaks, so the feasible best is a bracket's edge. `measure(c)` is injected (a real load run,
a virtual one, or a test's function); a point that ended the server (`stop`) ends the search, and so does a
`measure` that returns None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Point:
    """One load run of the search: its concurrency, score and SLO verdict."""

    concurrency: int
    value: float  # the objective as measured (also when an SLO was missed)
    feasible: bool
    stop: bool = False  # the run ended the server (died or hung): no more points on it
    status: str = ""
    reason: str = ""
    failure: str | None = None  # the server's failure class, when the run ended it
    #: the least share of a latency limit left unused (1 - p99 / limit over the limited
    #: latencies; 1.0 with none limited): how far the point sits from its SLO edge
    headroom: float = 1.0
    #: the run was cut early (search/cut.py): `value` is its projection, `feasible` its SLOs so
    #: far; it steers the search and is never its result
    cut: bool = False
    #: the run's window measured the first wave's ramp-up (loadgen/window.py): throughput is
    #: bumpy in concurrency where such runs are
    bumpy: bool = False


@dataclass(frozen=True)
class Bounds:
    """Where and how the search may look."""

    low: int
    high: int
    start: int
    max_runs: int = 5
    factor: float = 2.0  # the bracketing step
    gain: float = 0.03  # a step up counts as a gain above this share (the noise floor)
    resolution: float = 1.15  # stop bisecting when hi / lo is below this
    step: int = 1  # space.concurrency.step: every point is low + k * step
    explore: int | None = None  # a point no server of the study measured yet, run second
    first: bool = True  # no earlier server's best to start from: the study's first look

    def snap(self, c: int) -> int:
        """`c` clamped to [low, high] and onto the grid low + k * step (the nearest point)."""
        c = clamp(c, self.low, self.high)
        if self.step <= 1:
            return c
        on = self.low + round((c - self.low) / self.step) * self.step
        return on - self.step if on > self.high else on

    def fit(self) -> Bounds:
        """These bounds with `start` on the grid."""
        return replace(self, start=self.snap(self.start))


@dataclass(frozen=True)
class InnerResult:
    points: tuple[Point, ...]

    @property
    def best(self) -> Point | None:
        """The best feasible measured point (cut ones are not), or None when none held."""
        ok = [p for p in self.points if p.feasible and not p.cut]
        return max(ok, key=lambda p: p.value) if ok else None

    @property
    def stopped(self) -> bool:
        return any(p.stop for p in self.points)


#: a point this near a latency limit (headroom under it) is an SLO edge (`knee`)
NEAR_EDGE = 0.10
#: ... and gains less than this share over a point below it that is not: the last 1% of
#: throughput is within what two load runs on one server differ by
KNEE_GAIN = 0.01


def knee(best: Point | None, points: Sequence[Point]) -> Point | None:
    """`best`, unless it sits near a latency limit and a clear point below it with more than
    NEAR_EDGE headroom scores within KNEE_GAIN of it: then the best of those.

    Past the concurrency the pool admits, throughput flattens while the queue's waits climb to
    the limit: Kimi TP8 with HiCache gained 0.5% from concurrency 81 to 85 and its p99 TTFT
    went from 0.58 to 0.94 of the limit, which a fresh start's luck crosses (confirmation read
    odds 0.93 of holding and kept HiCache off, 2% slower). A user gives up the last 1% of
    throughput for a third of the latency limit back, and so does the search."""
    if best is None or best.headroom >= NEAR_EDGE:
        return best
    calm = [
        p
        for p in points
        if p.feasible
        and not p.cut
        and p.concurrency < best.concurrency
        and p.headroom >= NEAR_EDGE
        and p.value >= best.value * (1 - KNEE_GAIN)
    ]
    return max(calm, key=lambda p: p.value) if calm else best


def start_at(
    pool_tokens: int | None, avg_len: float, low: int, high: int, shared: float = 0.0
) -> int:
    """The concurrency the KV pool admits for requests of `avg_len` tokens (`shared`: the share
    of each request that a shared prefix lets requests hold once), clamped to [low, high]; the
    range's geometric middle when the pool is unknown."""
    if not pool_tokens or avg_len <= 0:
        return clamp(round(math.sqrt(low * high)), low, high)
    private = max(avg_len * (1.0 - shared), 1.0)
    return clamp(int(pool_tokens // private), low, high)


def clamp(c: int, low: int, high: int) -> int:
    return int(min(max(c, low), high))


def search(measure: Callable[[int], Point | None], b: Bounds) -> InnerResult:
    """Find the best feasible concurrency in [b.low, b.high] with at most `b.max_runs` runs;
    `measure` may return None to end the search (no time left for another run)."""
    points: dict[int, Point] = {}
    declined = [False]  # measure said no more (e.g. the trial's deadline is near)

    def run(c: int) -> Point | None:
        c = b.snap(c)
        over = declined[0] or len(points) >= b.max_runs or any(p.stop for p in points.values())
        if c in points or over:
            return None
        p = measure(c)
        if p is None:
            declined[0] = True
            return None
        points[c] = p
        return p

    def done() -> InnerResult:
        return InnerResult(tuple(points[c] for c in points))

    first = run(b.start)
    if first is None:
        return done()
    if b.explore is not None and b.snap(b.explore) != first.concurrency:
        run(b.explore)  # the widest gap the study left below its best (see InnerSearch)
    c = first.concurrency
    if first.feasible:
        _climb(run, points, c, b, up=True)
        above = points.get(b.snap(round(c * b.factor)))
        # a step up that held but lost throughput: the peak lies below the start
        past_peak = bool(above and above.feasible and above.value < first.value / (1 + b.gain))
    else:
        above = first
        while c > b.low and not points[c].stop:  # an infeasible start: down until one holds
            above = points[c]
            c = b.snap(math.floor(c / b.factor))
            p = run(c)
            if p is None or p.feasible:
                break
        # throughput that did not rise from the point that holds to the one above it: that one
        # may lie past the peak too (retraction, a slow queue), so look below it
        held = points.get(c)
        past_peak = held is not None and held.value * (1 + b.gain) >= above.value
    best = _best(points)
    if best is not None and past_peak:  # retraction or a slow queue: less may be worth more
        _climb(run, points, best.concurrency, b, up=False)
    best = _best(points)
    if best is not None and b.first and _flat_below(points, best, b.gain):
        # a short window's curve has bumps the bracket stepped over: look below first
        _climb(run, points, best.concurrency, replace(b, factor=math.sqrt(b.factor)), up=False)
    _bisect(run, points, b)
    best = _best(points)
    if best is not None:  # runs left: a last, finer look below the best (a window's bumps)
        fine = replace(b, factor=math.sqrt(b.factor))
        _climb(run, points, best.concurrency, fine, up=False)
        _bisect(run, points, b)
    return done()


def _climb(
    run: Callable[[int], Point | None], points: dict[int, Point], c: int, b: Bounds, up: bool
) -> None:
    """Step from `c` by `factor` while each step holds the SLOs and gains more than `gain`."""
    while True:
        nxt = b.snap(round(c * b.factor) if up else round(c / b.factor))
        if nxt == c:
            return
        p = run(nxt)
        if p is None or not p.feasible or p.value <= points[c].value * (1 + b.gain):
            return
        c = nxt


def _bisect(run: Callable[[int], Point | None], points: dict[int, Point], b: Bounds) -> None:
    """Halve the gaps beside the best point (log scale) while the budget lasts."""
    while True:
        best = _best(points)
        if best is None:
            return
        gaps = _gaps(points, best.concurrency, b.resolution, b.step)
        if not gaps:
            return
        lo, hi = gaps[0]
        # the grid point nearest the log-scale middle, strictly inside the gap
        mid = min(max(b.snap(round(math.sqrt(lo * hi))), lo + b.step), hi - b.step)
        if run(mid) is None:
            return


def _flat_below(points: dict[int, Point], best: Point, gain: float) -> bool:
    """The runs measured a short window's ramp-up (`bumpy`) and the best gained less than two
    noise floors over the clear point below it: a flat stretch, where a bump can hide."""
    if not any(p.bumpy for p in points.values()):
        return False
    below = [
        p for p in points.values() if p.feasible and not p.cut and p.concurrency < best.concurrency
    ]
    if not below:
        return False
    near = max(below, key=lambda p: p.concurrency)
    return best.value <= near.value * (1 + 2 * gain)


def _best(points: dict[int, Point]) -> Point | None:
    ok = [p for p in points.values() if p.feasible]
    return max(ok, key=lambda p: p.value) if ok else None


def _gaps(
    points: dict[int, Point], at: int, resolution: float, step: int = 1
) -> list[tuple[int, int]]:
    """The unmeasured intervals next to `at` wider than `resolution` that hold a grid point
    (`step`), the upper one first (where throughput still rises until an SLO binds)."""
    measured = sorted(points)
    i = measured.index(at)
    out = []
    if i + 1 < len(measured):
        out.append((at, measured[i + 1]))
    if i > 0:
        out.append((measured[i - 1], at))
    return [(lo, hi) for lo, hi in out if hi / lo > resolution and hi - lo > step]
