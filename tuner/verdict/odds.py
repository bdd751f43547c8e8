"""How sure it is that a configuration holds its latency limits, from its runs' p99s and the
requests beyond the limits. Pure.

A configuration measured at p99 TTFT 2,940 ms against 3,000 held on those runs, but its true
p99 (what a night of serving would see) is known only to within the run-to-run noise: one
start's p99 moves by ~2% (sd of log p99 over 12 fresh simulated starts: 0.022 at the demo's and
the 32 GB profile's edges). Confirmation ranks a candidate by its throughput times the odds
that the next start's p99 lies under every limit, so a pick at 0.98 of a limit after three runs
(odds ~0.8) loses to one 1% slower at 0.93 (odds ~1): the winner must not be an SLO pass by
luck, on its runs or on the start that serves.

    logs = log_ratios([tails1, tails2, tails3])   # {"p99_ttft_ms": [log(p99 / limit), ...]}
    sd = noise_sd([logs, other_logs])               # pooled over every candidate's repeats
    hold_odds([tails1, tails2, tails3], sd)         # 0.0 .. 1.0
    exceed_odds([tails1, tails2, tails3])           # 0.0 .. 1.0, from the requests above a limit

The two read different things and a configuration needs both. A p99 read from a few hundred
requests hides a tail with a gap: Kimi TP8 at concurrency 62 has, on every start, 3 requests
of ~297 that waited ~71 s (the opening burst beyond what the pool admits) and the rest under
22 s; each run's p99 interpolates 4% of the way into the gap (24 s of a 30 s limit), three runs
pooled 10% (28 s), five 16% (30 s): 1.01% of its requests miss the limit, so its p99 over
more runs of that length is 71 s. `exceed_odds` counts them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.verdict.tails import SLO_KEYS, count_above, merge, pooled_metrics

#: the least sd of one start's log p99 it assumes (0.022 measured on the simulator): a few
#: repeats that happened to agree must not make an edge look safe (on the demo's concurrency 166,
#: six runs gave 0.011, twelve starts 0.022); more spread measured is taken as measured
FLOOR_SD = 0.02


def log_ratios(tails: Sequence[Mapping[str, Any] | None]) -> dict[str, list[float]]:
    """Per limited latency, log(p99 / limit) of each run that kept tails (a death kept none)."""
    out: dict[str, list[float]] = {}
    for run in tails:
        if not run:
            continue
        p99s = pooled_metrics([run])
        for key, limit in (run.get("limits") or {}).items():
            if key != "max_error_rate" and key in p99s and p99s[key] > 0 and limit > 0:
                out.setdefault(key, []).append(math.log(p99s[key] / limit))
    return out


def noise_sd(groups: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, float]:
    """Per latency, the sd of one run's log p99 about its configuration's mean, pooled over
    every configuration run more than once, and never below FLOOR_SD."""
    squares: dict[str, float] = {}
    dof: dict[str, int] = {}
    for logs in groups:
        for key, ys in logs.items():
            if len(ys) > 1:
                mean = sum(ys) / len(ys)
                squares[key] = squares.get(key, 0.0) + sum((y - mean) ** 2 for y in ys)
                dof[key] = dof.get(key, 0) + len(ys) - 1
    keys = {k for logs in groups for k in logs}
    return {k: max(FLOOR_SD, math.sqrt(squares[k] / dof[k]) if k in dof else 0.0) for k in keys}


def hold_odds(tails: Sequence[Mapping[str, Any] | None], sd: Mapping[str, float]) -> float:
    """The odds that the next start of a configuration holds every latency limit: the mean of
    its runs' log(p99 / limit) estimates a start's, known to within `sd` / sqrt(runs), and one
    start's lies `sd` about it (noise_sd's spread, about the same means); the lowest over the
    latencies (they move together). 1.0 with nothing measured.

    Not the odds that the mean holds: those reach 1 with enough runs at 0.97 of a limit, while
    a server is started once and serves on that start's luck (the demo's concurrency 166 at mfs
    0.82 sits at 0.98 of its TTFT limit: 12 fresh starts in 40 missed, and 3 sets of 5 in 8 missed
    pooled).
    Nor the p99 of the runs' requests pooled, which the verdict reads: that lies above the
    runs' typical p99 (the slowest run's tail fills the pooled one) and would count their
    spread twice."""
    odds = 1.0
    for key, ys in log_ratios(tails).items():
        # a fresh start about the true mean (sd), and that mean known to sd / sqrt(n)
        se = sd.get(key, FLOOR_SD) * math.sqrt(1.0 + 1.0 / len(ys))
        z = -(sum(ys) / len(ys)) / se
        odds = min(odds, 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))))
    return odds


#: the share of requests a p99 limit lets past it
P99_SHARE = 0.01


def exceed_odds(tails: Sequence[Mapping[str, Any] | None]) -> float:
    """The odds that fewer than 1% of a configuration's requests miss each p99 limit where
    more than 1% of them did, counted over every run (pooled.count_above, strict by one bin):
    k of n, the share after Jeffreys' prior Beta(k + 1/2, n - k + 1/2), taken in its Poisson
    limit (n large, the share small) as Gamma(k + 1/2) / n, under 0.5 there. The lowest over
    the limits; 1.0 where no more than 1% were beyond every limit: the p99s then read the
    tail's bulk, which hold_odds judges. (The posterior would doubt every winner: a clean run of
    200 requests cannot prove 1% more surely than ~0.95; and 1 of ~104 beyond, as the 32 GB
    profile has at concurrency 76 on every start, holds its p99 over any number of starts.)"""
    kept = [run for run in tails if run]
    if not kept:
        return 1.0
    odds = 1.0
    limits: Mapping[str, float] = kept[0].get("limits") or {}
    for key, limit in limits.items():
        if key not in SLO_KEYS or not all(key in run.get("bins", {}) for run in kept):
            continue
        bins = merge(run["bins"][key] for run in kept)
        n, k = sum(bins.values()), count_above(bins, limit)
        if k > n * P99_SHARE:  # more than a p99 lets past: pooled over more runs, it misses
            odds = min(odds, _gamma_cdf(k + 0.5, n * P99_SHARE))
    return odds


def _gamma_cdf(a: float, x: float) -> float:
    """P(Gamma(a, 1) < x), the regularized lower incomplete gamma: its power series (terms
    fall once j > x, so ~x + 40 suffice), or for large a or x (the series' sum would overflow)
    Wilson and Hilferty's cube-root normal form, within ~0.001 there."""
    if x <= 0:
        return 0.0
    if a > 100 or x > 500:
        z = ((x / a) ** (1 / 3) - 1 + 1 / (9 * a)) * math.sqrt(9 * a)
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    term = total = 1.0 / a
    j = 1
    while term > 1e-12 * total:
        term *= x / (a + j)
        total += term
        j += 1
    return min(1.0, math.exp(a * math.log(x) - x - math.lgamma(a)) * total)
