"""Is the client itself the bottleneck? Event-loop lag and CPU share of a run -> a `SelfCheck`.

A client that lags (event-loop overshoot, CPU saturation) stamps tokens late and sends late:
such a run is flagged, to be discarded rather than trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tuner.loadgen.metrics import percentile
from tuner.loadgen.options import LoadOptions
from tuner.loadgen.result import SelfCheck

_LAG_TICK_S = 0.02
#: the self-check of a run that never started its timed part (nothing to judge)
SKIPPED = SelfCheck(True, (), 0.0, 0.0, 0.0)


class LagMonitor:
    """Measures how late `asyncio.sleep` wakes up: a busy client wakes up late."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(_LAG_TICK_S)
            self.lags.append(time.perf_counter() - t - _LAG_TICK_S)

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def self_check(
    opt: LoadOptions, lags: list[float], cpu_s: float, wall_s: float, connector_limit: int
) -> SelfCheck:
    """The verdict on a run that measured `lags` (s) and used `cpu_s` of CPU over `wall_s`."""
    lag_sorted = sorted(x * 1000 for x in lags)
    p99 = percentile(lag_sorted, 99)
    mx = lag_sorted[-1] if lag_sorted else 0.0
    cpu = cpu_s / wall_s if wall_s > 0 else 0.0
    reasons = []
    if p99 > opt.max_loop_lag_ms:
        reasons.append(f"event loop lag p99 {p99:.0f} ms > {opt.max_loop_lag_ms:.0f} ms")
    if cpu > opt.max_client_cpu:
        reasons.append(f"client CPU {cpu:.0%} of one core > {opt.max_client_cpu:.0%}")
    if connector_limit and connector_limit < opt.slots:
        reasons.append(f"connector limit {connector_limit} < concurrency {opt.concurrency}")
    return SelfCheck(not reasons, tuple(reasons), p99, mx, cpu)
