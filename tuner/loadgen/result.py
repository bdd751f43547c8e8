"""A finished load run: its records, duration, the client's self-check and the server's view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.metrics import Metrics, RequestRecord, ServerView, bench_serving_json, summarize


@dataclass(frozen=True)
class SelfCheck:
    """Was the client fast enough to trust the measurement? `reasons` says why not."""

    ok: bool
    reasons: tuple[str, ...]
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    cpu_fraction: float


@dataclass(frozen=True)
class LoadResult:
    """A finished run: records, timed duration, self-check, the server's view, why it stopped.

    `stopped`: "done" (every request ended), "duration", or "error_budget" (flagged).
    """

    records: tuple[RequestRecord, ...]
    duration_s: float
    self_check: SelfCheck
    server: ServerView | None
    stopped: str

    @property
    def flagged(self) -> bool:
        """True when the run should be discarded rather than trusted."""
        return not self.self_check.ok or self.stopped == "error_budget"

    def metrics(self) -> Metrics:
        """bench_serving's metrics of this run."""
        return summarize(self.records, self.duration_s)

    def summary(self) -> dict[str, Any]:
        """JSON-ready: bench_serving's keys, why the run stopped, the self-check, the server's view."""
        m = self.metrics()
        sc = self.self_check
        return {
            **bench_serving_json(m),
            "stopped": self.stopped,
            "flagged": self.flagged,
            "self_check": {
                "ok": sc.ok,
                "reasons": list(sc.reasons),
                "loop_lag_p99_ms": sc.loop_lag_p99_ms,
                "loop_lag_max_ms": sc.loop_lag_max_ms,
                "cpu_fraction": sc.cpu_fraction,
            },
            "error_kinds": dict(m.error_kinds),
            "server": self.server.as_dict() if self.server else None,
        }
