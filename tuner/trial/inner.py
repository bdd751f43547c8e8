"""One server's inner search on a `TrialRunner`: load runs at chosen concurrencies -> points ->
the trial's outcome.

`InnerSearch` is the inner search of one `tuner tune` run (search/mode.py says when it runs):
on each server that starts it places a few load runs with `search.inner.search`, starting where
the KV pool admits the workload (`bounds`) or near the study's best concurrency so far, looks in
the widest gap no server measured (`widest_gap`), and picks the point the study's curve pooled
over its servers ranks best (search/curve.py). Every point is kept (`Attr.LOAD_POINTS`,
`trials/<n>/points.json`); the winner's concurrency is the trial's `Attr.CLIENT`, which
confirmation re-runs and the export recommends. The baseline's concurrency is where trial 0's
search starts (`InnerSearch.start_next`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config.schema import StudyConfig
from tuner.loadgen.window import short_window
from tuner.loadgen.workload import Request, request_pool, request_tokens, requests_for
from tuner.outcome import (
    POOL_ATTR,
    Attr,
    Status,
    TrialOutcome,
    is_feasible,
    metric_attrs,
    objective_values,
)
from tuner.search.curve import fit, narrowed
from tuner.search.cut import Cutter, cutter
from tuner.search.inner import Bounds, Point, knee, search, start_at
from tuner.search.mode import NAME
from tuner.sglang.failures import FailureClass
from tuner.trial.seams import takes_keywords
from tuner.verdict.tails import SLO_MARGIN, exceed_odds

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

#: a point is not started when less than this many times the last point's time is left
TIME_MARGIN = 1.2
LATENCY_CONSTRAINTS = ("c_ttft", "c_tpot", "c_itl", "c_e2e")
#: a point is clear of its p99 limits only when fewer than 1% of its requests beyond them is
#: at least this likely (verdict.tails.exceed_odds, under 0.5 only where more than 1% were beyond:
#: 3 of 297 beyond gives 0.45; 2 of 297 is no more than a p99 lets past)
EXCEED_CLEAR = 0.5


#: the inner search's step and resolution on a server after the first that found a best
HINTED_FACTOR = 2**0.5
HINTED_RESOLUTION = 1.06


def bounds(
    cfg: StudyConfig,
    pool_tokens: int | None,
    high_cap: int | None = None,
    hint: int | None = None,
    start: int | None = None,
    requests: Sequence[Request] | None = None,
) -> Bounds:
    """Where the inner search looks on a server whose KV pool holds `pool_tokens`; `high_cap`:
    a concurrency known to kill servers like this one (the search stays below it); `hint`: the
    best concurrency found on an earlier server of the study, where a similar server's best
    most likely is (else the capacity model's estimate); `start`: where to start instead (the
    baseline's concurrency: what runs today is measured). Points lie on the range's `step`."""
    spec = cfg.space[NAME]
    assert spec.low is not None and spec.high is not None  # mode_problem/search_mode ensure it
    low, high, step = int(spec.low), int(spec.high), int(spec.step or 1)
    if high_cap is not None:
        high = max(low, min(high, high_cap - 1))
    high = low + (high - low) // step * step  # the last point of the grid (optuna's rule)
    runs = cfg.budget.inner_runs
    if start is not None:
        return Bounds(low, high, start, max_runs=runs, step=step).fit()
    if hint is None:
        avg, shared = request_tokens(cfg.workload, requests)
        first = start_at(pool_tokens, avg, low, high, shared)
        return Bounds(low, high, first, max_runs=runs, step=step).fit()
    # an earlier server's best is near this one's: finer steps around it spend the runs where
    # the optimum is, instead of re-bracketing a factor of 2 each way
    return Bounds(
        low,
        high,
        hint,
        max_runs=runs,
        factor=HINTED_FACTOR,
        resolution=HINTED_RESOLUTION,
        step=step,
    ).fit()


#: how far below the study's best concurrency its searches look for points no server measured
EXPLORE_SPAN = 2.0


def widest_gap(seen: set[int], best: int, b: Bounds) -> int | None:
    """A concurrency in the widest gap (log scale) between the points the study measured in
    [best / EXPLORE_SPAN, best], when that gap is wider than a hinted step (`b.factor`); None
    when none is. A window short against a request's life makes throughput bumpy in
    concurrency (loadgen/window.py): a hinted search climbs from the best and would never look
    again where the first server's factor-2 bracket stepped over."""
    floor = max(b.low, math.ceil(best / EXPLORE_SPAN))
    marks = sorted({floor, best, *(c for c in seen if floor < c < best)})
    gaps = [(hi / lo, lo, hi) for lo, hi in pairwise(marks) if lo > 0]
    if not gaps:
        return None
    ratio, lo, hi = max(gaps)
    mid = b.snap(round(math.sqrt(lo * hi)))
    return mid if ratio > b.factor and lo < mid < hi else None


#: a best at this share or more of what its pool holds at full length was placed by its pool
POOL_BOUND = 0.8

#: the server flag that only sizes the KV pool: servers that differ in it alone run the same
#: throughput curve wherever the pool holds every running request (search/curve.py)
POOL_FLAG = "mem-fraction-static"


def _group(params: Mapping[str, Any]) -> str:
    """The servers a point pools with: those with the same flags but `POOL_FLAG`."""
    return json.dumps({k: v for k, v in params.items() if k != POOL_FLAG}, sort_keys=True)


class InnerSearch:
    """The inner search of one `tuner tune` run: remembers the best point so far (the next
    server's starting point), every concurrency that held on some server (where the next
    search need not look again: `widest_gap`), and every server's clear points, whose pooled
    curve (search/curve.py) chooses each server's concurrency and narrows the next search."""

    def __init__(self, cfg: StudyConfig):
        self.cfg = cfg
        self.best: tuple[float, int] | None = None  # (value, concurrency)
        self.best_pool: int | None = None  # the KV pool of the best's server
        #: where the next search starts (once): the baseline's concurrency for trial 0
        self.start_next: int | None = None
        self._requests: list[Request] | None = None  # a dataset's list, for its lengths
        #: concurrencies that held their SLOs on some server of this run
        self.seen: set[int] = set()
        #: each earlier server's clear points: (flags but the pool's, concurrency) -> value
        #: where its pool holds them at full length, else with the server's index appended
        self.table: list[dict[tuple, float]] = []

    def run(
        self,
        params: Mapping[str, Any],
        trial_dir: Path,
        measure: Measure,
        pool: int | None,
        high_cap: int | None,
        time_left: Callable[[], float | None],
        clock: Callable[[], float],
    ) -> TrialOutcome:
        hint = None if self.best is None else self.pool_moved(self.best[1], pool)
        start, self.start_next = self.start_next, None
        b = bounds(self.cfg, pool, high_cap, hint, start, self._dataset())
        group = _group(params)
        if hint is not None and start is None:
            shape = {k[1]: v for k, v in fit(self.table).items() if len(k) == 2 and k[0] == group}
            factor = narrowed(shape, hint, b.factor, HINTED_RESOLUTION, b.gain)
            b = replace(b, factor=factor, explore=widest_gap(self.seen, hint, b), first=False)
        key = self._keyer(group, pool)

        def choose(points: Sequence[Point]) -> Point | None:
            """The clear point whose concurrency the pooled curve ranks best."""
            row = {key(p.concurrency): p.value for p in points if p.feasible and p.value > 0}
            if not row:
                return None
            shape = fit([*self.table, row])
            return max(
                (p for p in points if key(p.concurrency) in row),
                key=lambda p: shape[key(p.concurrency)],
            )

        beat = None if self.best is None else self.best[0]
        out = run_inner(self.cfg, params, trial_dir, measure, b, time_left, clock, choose, beat)
        chosen = out.client.get(NAME) if out.feasible and out.status != Status.CUT else None
        self._learn(params, pool, out.points, chosen, out.values[0] if out.values else 0.0)
        return out

    def recall(self, trials: Sequence[FrozenTrial]) -> None:
        """What the study's searches so far taught, rebuilt from its completed trials (every
        worker's, and a resumed run's earlier ones) before a trial runs, as `run` learns it."""
        self.best, self.best_pool, self.seen, self.table = None, None, set(), []
        for t in sorted(trials, key=lambda t: t.number):
            a = t.user_attrs
            if not a.get(Attr.LOAD_POINTS) or Attr.DUPLICATE_OF in a or not t.values:
                continue
            scored = is_feasible(t.constraints) and a.get(Attr.STATUS) != Status.CUT
            chosen = (a.get(Attr.CLIENT) or {}).get(NAME) if scored else None
            self._learn(t.params, a.get(POOL_ATTR), a[Attr.LOAD_POINTS], chosen, t.values[0])

    def _learn(
        self,
        params: Mapping[str, Any],
        pool: int | None,
        points: Sequence[Mapping[str, Any]],
        chosen: int | None,
        value: float,
    ) -> None:
        """One server's search: its clear points join the pooled table, its points that held
        the SLOs `seen`, and its chosen concurrency is the next hint when its value is best."""
        key = self._keyer(_group(params), pool)
        row = {key(int(p[NAME])): float(p["value"]) for p in points if p.get("clear")}
        if row := {k: v for k, v in row.items() if v > 0}:
            self.table.append(row)
        # a cut run was looked at too: the next server's search need not look there again
        self.seen |= {int(p[NAME]) for p in points if p.get("feasible") or p.get("held_so_far")}
        if chosen is not None and (self.best is None or value > self.best[0]):
            self.best, self.best_pool = (value, int(chosen)), pool

    def pool_moved(self, hint: int, pool: int | None) -> int:
        """Where the next server's search starts: the best's concurrency, moved in step with the
        KV pool where its pool placed it (it sat at POOL_BOUND or more of the requests its pool
        holds at full length). Kimi TP8: the best at 0.85 (a pool of 116 k tokens) ran 37
        requests; the server at 0.91 holds 1.75 x as many, and a climb from 37 by sqrt(2) spent
        its runs before it reached its best at 81-84."""
        held = self.holds(self.best_pool)
        if not pool or not self.best_pool or not math.isfinite(held) or hint < POOL_BOUND * held:
            return hint
        return max(1, round(hint * pool / self.best_pool))

    def _keyer(self, group: str, pool: int | None) -> Callable[[int], tuple]:
        """A point's key in the pooled table: (group, concurrency) where the server's pool
        holds that many requests at their full length, shared prefixes counted in each (so it
        never binds: the 32 GB case's best sits where it starts to; Kimi's 32 prefixes of 2,000
        tokens alone fill half its pool), or is not known; else one of this server's own
        (there the pool's size shapes the curve)."""
        admits = self.holds(pool)
        index = len(self.table)
        return lambda c: (group, c) if c <= admits else (group, c, index)

    def holds(self, pool: int | None) -> float:
        """How many of the workload's requests a pool of `pool` tokens holds at their full
        length, shared prefixes counted in each (inf when the pool is not known): up to that
        concurrency no request waits for KV memory or is retracted, so the pool binds nothing."""
        if not pool:
            return math.inf
        full, _ = request_tokens(self.cfg.workload, self._dataset(), answer=1.0)
        return pool / max(full, 1.0)

    def _dataset(self) -> list[Request] | None:
        """A dataset workload's request list (its lengths are the file's), read once."""
        w = self.cfg.workload
        if w.kind in ("sharegpt", "jsonl") and self._requests is None:
            self._requests = requests_for(w, num_requests=request_pool(self.cfg))
        return self._requests


#: one load run at these params: (params with concurrency, the point's directory[, a `cut`
#: rule that may end it early: search/cut.py]) -> outcome
Measure = Callable[..., TrialOutcome]


def run_inner(
    cfg: StudyConfig,
    params: Mapping[str, Any],
    trial_dir: Path,
    measure: Measure,
    b: Bounds,
    time_left: Callable[[], float | None],
    clock: Callable[[], float],
    choose: Callable[[Sequence[Point]], Point | None] | None = None,
    beat: float | None = None,
) -> TrialOutcome:
    """The inner search on the running server -> the trial's outcome: its best feasible
    measured point's (`choose`: which of the clear points is best; the highest by default;
    with every point and the winner's concurrency), else the most telling failure.

    `beat`: the study's best score. With `budget.early_stop`, a run that clearly cannot beat
    it nor this server's best point so far is cut (search/cut.py). A server whose every run
    that held its SLOs was cut cannot beat the study's best: its outcome is `Status.CUT`, with
    its best projection as the value (what the sampler learns; never a winner: verdict/trials.py),
    and no run spends a full window to score it."""
    outcomes: dict[int, TrialOutcome] = {}
    seen: list[Point] = []
    longest = [0.0]  # the longest run so far (a cut run is short: not a guide to the next)
    cuttable = takes_keywords(measure, ("cut",))  # a test's function may not take one

    def point(c: int) -> Point | None:
        left = time_left()
        if outcomes and left is not None and left < TIME_MARGIN * longest[0]:
            return None  # another run would pass the trial's deadline
        if _hopeless(seen, b):
            return None  # where on this server's curve its peak lies decides nothing
        t0 = clock()
        rule = _cutter(cfg, seen, c, beat) if cuttable else None
        kw = {"cut": rule.cut} if rule is not None else {}
        out = measure({**params, NAME: c}, trial_dir / f"{NAME}-{c}", **kw)
        longest[0] = max(longest[0], clock() - t0)
        outcomes[c] = out
        if out.status == Status.CUT and rule is not None:
            held = out.feasible  # its SLOs so far: a climb goes on past it only if they held
            p = Point(c, rule.projected or 0.0, held, False, str(out.status), out.reason, cut=True)
        else:
            raw = objective_values(cfg.objective, out.metrics)[0] if out.metrics else 0.0
            stop = out.status in (Status.DIED, Status.WORLD, Status.START_FAILED)
            safe = out.feasible and _clear_of_limits(out.constraints) and _few_beyond(out.tails)
            room = _headroom(out.constraints)
            bumpy = short_window(cfg.workload.duration_s, out.metrics, c) is not None
            p = Point(
                c, raw, safe, stop, str(out.status), out.reason, out.failure, room, bumpy=bumpy
            )
        seen.append(p)
        return p

    result = search(point, b)
    records = tuple(_record(p, outcomes[p.concurrency]) for p in result.points)
    measured = [p for p in result.points if not p.cut]
    best = knee(result.best if choose is None else choose(measured), measured)
    if best is None:  # none clear of the limits: the best that held them, if any did
        held = [p for p in measured if outcomes[p.concurrency].feasible]
        best = max(held, key=lambda p: p.value) if held else None
    lead = None if best is not None else _cut_lead(result.points)
    _save(trial_dir, best or lead, records)
    if best is not None:
        chosen = outcomes[best.concurrency]
        client = {NAME: best.concurrency}
    elif lead is not None:
        values = (lead.value, *outcomes[lead.concurrency].values[1:])
        reason = (
            f"projected {lead.value:,.1f} at {NAME} {lead.concurrency}: every run was cut, "
            f"none could beat the study's best {beat or 0:,.1f} (a projection, not a score)"
        )
        chosen = replace(outcomes[lead.concurrency], values=values, reason=reason)
        client = {NAME: lead.concurrency}
    else:
        chosen, client = _failure(outcomes), {}
    return replace(chosen, points=records, client=client)


def _hopeless(seen: Sequence[Point], b: Bounds) -> bool:
    """Every run on this server so far was cut (none can beat the study's best), and the climb
    found its peak: a run above the best that lost, two runs within `gain` of the best (a flat
    top), or the best at the range's top. Refining where such a server peaks cannot change the
    study's answer, so its search ends."""
    if not seen or not all(p.cut for p in seen):
        return False
    lead = _cut_lead(seen)
    if lead is None:
        return False
    top = [p for p in seen if p.feasible and p.value * (1 + b.gain) >= lead.value]
    above = any(p.concurrency > lead.concurrency for p in seen)
    return lead.concurrency >= b.high or len(top) >= 2 or above


def _cut_lead(points: Sequence[Point]) -> Point | None:
    """The cut point with the best projection among those whose SLOs held so far."""
    held = [p for p in points if p.cut and p.feasible]
    return max(held, key=lambda p: p.value) if held else None


def _cutter(
    cfg: StudyConfig, seen: Sequence[Point], concurrency: int, beat: float | None
) -> Cutter | None:
    """The early stop of the next run on this server (search/cut.py), or None: against the
    larger of the study's best score and this server's best point so far that held its SLOs
    (a projection, for a cut one: the search steps by it), and the p99 TTFT limit. The first
    run of the study's first server has no score to beat; a Pareto study runs every window in
    full (a cut run has no latency to place on the front)."""
    if not cfg.budget.early_stop or cfg.objective.pareto_latency is not None:
        return None
    lead = max((p.value for p in seen if p.feasible), default=0.0)
    target = max(lead, beat or 0.0)
    slo = cfg.objective.slo
    return cutter(
        cfg.objective.metric, cfg.workload.duration_s, concurrency, target, slo.p99_ttft_ms
    )


def _clear_of_limits(constraints: Mapping[str, float]) -> bool:
    """Every latency at least SLO_MARGIN below its limit (constraint = observed / limit - 1)."""
    return _headroom(constraints) >= SLO_MARGIN


def _headroom(constraints: Mapping[str, float]) -> float:
    """The least share of a latency limit left unused (search.inner.Point.headroom)."""
    return min(-constraints.get(k, -1.0) for k in LATENCY_CONSTRAINTS)


def _few_beyond(tails: Mapping[str, Any] | None) -> bool:
    """More likely than not, under 1% of the run's requests miss each p99 limit
    (verdict.tails.exceed_odds): a p99 well under its limit can hide a gap in the tail (a few
    requests of every run far beyond it) that its runs pooled show."""
    return tails is None or exceed_odds([tails]) >= EXCEED_CLEAR


def died_at(outcome: TrialOutcome, params: Mapping[str, Any]) -> int | None:
    """The least concurrency at which this trial's server ran out of memory under load."""
    died = [int(p[NAME]) for p in outcome.points if p.get("failure") == FailureClass.OOM_RUNTIME]
    if not outcome.points and outcome.failure == FailureClass.OOM_RUNTIME and NAME in params:
        died.append(int(params[NAME]))
    return min(died) if died else None


def _failure(outcomes: Mapping[int, TrialOutcome]) -> TrialOutcome:
    """No point held its SLOs: a death or the world's failure tells most, else the lowest
    concurrency's miss (the least load this server was asked to carry). A cut run tells
    nothing more than that it could not win: the lowest one, when every run was cut."""
    for status in (Status.WORLD, Status.FLAGGED, Status.DIED):
        for out in outcomes.values():
            if out.status == status:
                return out
    full = {c: o for c, o in outcomes.items() if o.status != Status.CUT} or outcomes
    return full[min(full)]


def _record(p: Point, out: TrialOutcome) -> dict[str, Any]:
    """One point as stored (the report's inner-search chart reads the score and p99 TTFT)."""
    figures = metric_attrs(out.metrics) if out.status.measured else {}
    return {
        NAME: p.concurrency,
        "value": round(p.value, 3),
        "score": round(p.value, 3),
        **{k: round(v, 3) for k, v in figures.items()},
        "feasible": out.feasible and not p.cut,  # held its SLOs
        "clear": p.feasible and not p.cut,  # held them with SLO_MARGIN to spare
        "cut": p.cut,  # ended early: `value` is its projection, never a score
        "held_so_far": p.cut and p.feasible,  # a cut run's SLOs held while it ran
        "status": p.status,
        "reason": p.reason,
        "failure": p.failure,
    }


def _save(trial_dir: Path, best: Point | None, records: tuple[dict[str, Any], ...]) -> None:
    data = {"best": None if best is None else best.concurrency, "points": list(records)}
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "points.json").write_text(json.dumps(data, indent=2) + "\n")
    if best is not None:  # the winner's run is the trial's run, where tools look for it
        src = trial_dir / f"{NAME}-{best.concurrency}"
        for name in ("metrics.json", "server.log"):
            if (src / name).exists():
                (trial_dir / name).write_bytes((src / name).read_bytes())
        if (src / "requests.jsonl").exists():  # large: moved, not copied
            (src / "requests.jsonl").replace(trial_dir / "requests.jsonl")
