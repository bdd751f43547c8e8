"""How sure it is that a configuration holds its latency limits, from its runs' p99s. Pure.

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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.pooled import pooled_metrics

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
