"""Does a load run's window measure a steady state? Pure.

A closed-loop run of N streams over a window of W seconds finishes about N x W / L requests, L
a request's life (its wait, prefill and every output token). Under about two lives per stream
the window's tokens are mostly the first wave's: every prompt prefills at once, then decodes
together, and the score moves with where the waves fall in the window. In the simulator's
Llama-8B H100 profile with 6 s windows, throughput in concurrency peaks at 104, dips 7% by 117
and climbs back by 175; with 30 s windows it rises smoothly (tests/bench: the noise table's
6 s mean is 10% under the 30 s one). Such scores rank concurrencies by their ramp-up, not by
what a long job gets, and no search finds a stable best among them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: request lives per stream below which a window measures the ramp-up
MIN_LIVES = 2.0


def short_window(
    duration_s: float | None, metrics: Mapping[str, Any], concurrency: int | None
) -> str | None:
    """A warning when a closed-loop run of `concurrency` streams finished fewer than MIN_LIVES
    requests per stream in its `duration_s` window; None when it did, or it cannot tell (no
    window, an open loop, nothing reported)."""
    completed = metrics.get("completed")
    if not duration_s or not concurrency or not isinstance(completed, int):
        return None
    lives = completed / concurrency
    if lives >= MIN_LIVES:
        return None
    need = 5 * math.ceil(duration_s * MIN_LIVES / max(lives, 0.1) / 5)
    return (
        f"workload.duration_s {duration_s:g} s is short for these requests: at concurrency "
        f"{concurrency} the run finished {completed} ({lives:.1f} per stream, under "
        f"{MIN_LIVES:g}), so the score weighs the first wave's ramp-up, not a steady state, "
        f"and concurrencies rank by where the waves fall; consider duration_s >= {need} s"
    )
