"""How sure it is that a configuration holds its latency limits, from its runs' p99s. Pure.

A configuration measured at p99 TTFT 2,940 ms against 3,000 held on those runs, but its true
p99 (what a night of serving would see) is known only to within the run-to-run noise: one
start's p99 moves by ~2% (sd of log p99 over 12 fresh simulated starts: 0.022 at the demo's and
the 32 GB profile's edges). Confirmation ranks a candidate by its throughput times the odds
that its mean p99 lies under every limit, so a pick at 0.98 of a limit after three runs (odds
~0.9) loses to one 1% slower at 0.93 (odds ~1): the winner must not be an SLO pass by luck.

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
    """The odds that the p99 of every limited latency over all of a configuration's starts lies
    under its limit: read from its runs' requests pooled (the figure its verdict reads), each
    known to within `sd` / sqrt(runs); the lowest over the latencies (they move together). 1.0
    with nothing measured."""
    runs = [r for r in tails if r]
    if not runs:
        return 1.0
    pooled = pooled_metrics(runs)
    odds = 1.0
    for key, limit in (runs[0].get("limits") or {}).items():
        if key != "max_error_rate" and pooled.get(key, 0) > 0 and limit > 0:
            se = sd.get(key, FLOOR_SD) / math.sqrt(len(runs))
            z = -math.log(pooled[key] / limit) / se
            odds = min(odds, 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))))
    return odds
