"""Latency tails that pool over runs: p99 over every request of several runs, not a mean of p99s.

One run's p99 is a noisy estimate near an SLO's edge (one configuration's p99 TPOT moves by
several % from run to run); judging a configuration on all its runs' requests together is the
estimate with the most data. Keeping every request of every run in the study would cost
megabytes, so each run keeps a histogram on a log scale (bins 1% wide) of each latency a limit
is set on, plus its request counts: a few KB, JSON-ready (an optuna attribute), and mergeable.
A quantile read from merged bins interpolates as numpy does between the upper edges of the bins
holding its two ranks: never below numpy's linear-interpolated percentile of the raw values and
less than 1% above it, so a verdict from bins errs on the strict side, by less than 1%.

    tails = tails_of(records, slo)              # one run -> JSON-ready dict
    pooled = pooled_metrics([t1, t2, t3])       # {"p99_tpot_ms": ..., "error_rate": ..., "runs": 3, ...}
    slo_constraints(objective, pooled)          # the usual verdict, on the pooled figures
    pooled_verdict([t1, t2, t3])                # (pooled, ["p99 TPOT 53.1 ms > 50 ms over ..."])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuner.config.schema import SLOSection
from tuner.loadgen.metrics import RequestRecord, tpot_s, ttft_or_wait_s
from tuner.outcome import SLO_METRICS

#: bin width on the log scale: bin k holds values in (RATIO**(k-1), RATIO**k] ms
RATIO = 1.01
_LOG = math.log(RATIO)
#: values at or below this (ms) share bin FLOOR_BIN
FLOOR_MS = 0.01
FLOOR_BIN = math.ceil(math.log(FLOOR_MS) / _LOG)

#: SLO field -> the per-run metrics key it limits (the names `slo_constraints` reads)
SLO_KEYS = dict(SLO_METRICS.values())
#: a latency within this share of its limit held by luck as often as not: the inner search's
#: best point keeps it to spare, and confirmation runs a winner again while its pooled p99 is
#: that close (one start's p99 moves by a few %: tests/bench/bench_search.py's noise table)
SLO_MARGIN = 0.05


def bin_of(ms: float) -> int:
    """The bin of a latency in ms."""
    if ms <= FLOOR_MS:
        return FLOOR_BIN
    return max(FLOOR_BIN, math.ceil(math.log(ms) / _LOG - 1e-9))


def upper_ms(k: int) -> float:
    """The upper edge of bin k in ms."""
    return RATIO**k


def _series(records: Sequence[RequestRecord], field: str) -> Iterable[float]:
    """One latency series of a run in seconds, as tuner.loadgen.metrics.summarize defines it."""
    done = [r for r in records if r.ok]
    if field == "p99_ttft_ms":
        return (ttft_or_wait_s(r) for r in records if r.ok or r.cancelled)
    if field == "p99_tpot_ms":
        return (t for t in (tpot_s(r) for r in done) if t is not None)
    if field == "p99_itl_ms":
        return (x for r in done for x in r.itl_s)
    return (r.latency_s for r in done)


def histogram(values_s: Iterable[float]) -> dict[str, int]:
    """Sparse bins of values in seconds (JSON keys are strings)."""
    bins: dict[str, int] = {}
    for v in values_s:
        k = str(bin_of(v * 1000.0))
        bins[k] = bins.get(k, 0) + 1
    return bins


def tails_of(records: Sequence[RequestRecord], slo: SLOSection) -> dict[str, Any]:
    """One run's mergeable summary: bins of each latency the SLO limits, request counts, and the
    limits themselves (so a verdict over stored runs needs no study file)."""
    ended = [
        r for r in records if not r.cancelled
    ]  # error rate: errors / ended, as loadgen/metrics.py
    limits = {key: getattr(slo, key) for key in SLO_KEYS if getattr(slo, key) is not None}
    return {
        "limits": {**limits, "max_error_rate": slo.max_error_rate},
        "ended": len(ended),
        "errors": sum(1 for r in ended if not r.ok),
        "bins": {key: histogram(_series(records, key)) for key in limits},
    }


def quantile(bins: Mapping[str, int], q: float) -> float:
    """The q-th percentile (0-100) of binned values in ms, as `tuner.loadgen.metrics.percentile` takes it
    (numpy's linear interpolation between the two nearest ranks), each rank read as the upper
    edge of its bin: never below the raw values' percentile, and less than 1% above (0.0 when
    empty). A nearest-rank read would be neither: below it when the next rank is far, and up to
    the maximum of a short run."""
    total = sum(bins.values())
    if total == 0:
        return 0.0
    pos = (total - 1) * q / 100.0
    lo = math.floor(pos)
    below, above = _edges(bins, (lo, min(lo + 1, total - 1)))
    return below + (above - below) * (pos - lo)


def _edges(bins: Mapping[str, int], ranks: Sequence[int]) -> list[float]:
    """The upper edge of the bin holding each 0-based rank (ranks ascending, below the total)."""
    out: list[float] = []
    seen = 0
    for k in sorted(bins, key=int):
        seen += bins[k]
        while len(out) < len(ranks) and ranks[len(out)] < seen:
            out.append(upper_ms(int(k)))
    return out


def count_above(bins: Mapping[str, int], limit_ms: float) -> int:
    """How many binned values may lie above `limit_ms`: those of every bin whose upper edge is
    above it (the bin that straddles it counted whole: strict by less than 1%, as `quantile`)."""
    return sum(int(n) for k, n in bins.items() if upper_ms(int(k)) > limit_ms)


def merge(many: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Bins summed."""
    out: dict[str, int] = {}
    for bins in many:
        for k, n in bins.items():
            out[k] = out.get(k, 0) + int(n)
    return out


def pooled_metrics(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures an SLO verdict reads, over every request of `runs` (tails_of dicts):
    p99 of each latency present in all runs, the error rate, and `runs`/`ended` counts."""
    ended = sum(int(r.get("ended", 0)) for r in runs)
    errors = sum(int(r.get("errors", 0)) for r in runs)
    out: dict[str, Any] = {
        "runs": len(runs),
        "ended": ended,
        "error_rate": errors / ended if ended else 0.0,
    }
    keys = set.intersection(*(set(r.get("bins", {})) for r in runs)) if runs else set()
    for key in sorted(keys):
        out[SLO_KEYS[key]] = quantile(merge(r["bins"][key] for r in runs), 99)
    return out


def pooled_verdict(runs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """(pooled_metrics, what they miss) under the limits the runs recorded, e.g.
    ["p99 TPOT 53.1 ms > 50 ms over 3 runs (1,512 requests)"]; nothing missed when no run
    recorded limits."""
    pooled = pooled_metrics(runs)
    limits: Mapping[str, float] = runs[0].get("limits", {}) if runs else {}
    over = f"over {pooled['runs']} runs ({pooled['ended']:,} requests)"
    missed = []
    for key, limit in limits.items():
        if key == "max_error_rate":
            if pooled["error_rate"] > limit:
                missed.append(f"error rate {pooled['error_rate']:.1%} > {limit:.1%} {over}")
        elif key in pooled and pooled[key] > limit:
            name = key.removeprefix("p99_").removesuffix("_ms").replace("_latency", "").upper()
            missed.append(f"p99 {name} {pooled[key]:.1f} ms > {limit:g} ms {over}")
    return pooled, missed


def near_limits(pooled: Mapping[str, Any], margin: float = SLO_MARGIN) -> list[str]:
    """The latencies (`p99_tpot_ms`, ...) that `pooled` (pooled_metrics with its `limits`) holds
    by less than `margin` of their limit: held, but not yet clear of luck."""
    limits: Mapping[str, float] = pooled.get("limits") or {}
    return [
        key
        for key, limit in limits.items()
        if key != "max_error_rate" and key in pooled
        if limit * (1 - margin) < pooled[key] <= limit
    ]
