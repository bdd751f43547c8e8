"""A finished load run: its records, duration, the client's self-check and the server's view."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.loadgen.metrics import Metrics, RequestRecord, ServerView, bench_serving_json, summarize
from tuner.loadgen.options import LoadOptions


@dataclass(frozen=True)
class SelfCheck:
    """Was the client fast enough to trust the measurement? `reasons` says why not."""

    ok: bool
    reasons: tuple[str, ...]
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    cpu_fraction: float


@dataclass(frozen=True)
class LoadProgress:
    """A running load run, as its watcher sees it: the window so far, requests ended, output
    tokens received (cut requests' included), and the server's own gauges from its last
    /metrics scrape (None when it exports none)."""

    elapsed_s: float
    window_s: float | None  # the run's duration bound (None: bounded by its request count)
    done: int
    planned: int
    output_tokens: int
    #: requests in flight that have received a token (with `done`: how many streams are past
    #: their first prefill; search/cut.py waits for every stream)
    streaming: int = 0
    #: every request started so far: its TTFT, or its wait so far when no token came yet (a
    #: wait only grows: what is beyond a TTFT limit now stays beyond it); () when not counted
    first_waits: tuple[float, ...] = ()
    running: float | None = None
    queued: float | None = None

    @property
    def tok_s(self) -> float:
        """Output tokens per second over the window so far."""
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


#: a caller's rule, heard about once a second during the timed run: a reason ends it as "cut"
Cut = Callable[[LoadProgress], "str | None"]


@dataclass(frozen=True)
class LoadResult:
    """A finished run: records, timed duration, self-check, the server's view, why it stopped.

    `stopped`: "done" (every request ended; `exhausted` when that was before the window asked
    for: a finite list ran out, so it measured a shorter window), "duration",
    "error_budget" (flagged; its `error_rate` is then failures over every request sent, in
    flight ones counted as not failed: a lower bound, where failures over ended requests would
    count the fast failures and not the slow successes), or
    "cut": the caller's `cut` rule ended it early (`cut_reason` says why: it could not beat the
    best point known, tuner/search/cut.py); its figures are a partial window's, never a score;
    "unresponsive": requests were in flight and the server sent nothing (no status line, no
    byte) for the stall bound, or answered none of the warm-up (then `records` is empty).
    Unlike ordinary errors, that is a server that may have hung: the trial runner probes it.
    `silent_s`: how long the server had been silent when the run stopped.
    """

    records: tuple[RequestRecord, ...]
    duration_s: float
    self_check: SelfCheck
    server: ServerView | None
    stopped: str
    silent_s: float = 0.0
    options: LoadOptions | None = None  # how it was sent (its max_concurrency is reported)
    exhausted: bool = False
    cut_reason: str | None = None  # why the caller's rule cut it (stopped == "cut")

    @property
    def was_cut(self) -> bool:
        """The caller's rule ended the run before its window (see `stopped`)."""
        return self.stopped == "cut"

    @property
    def unresponsive(self) -> bool:
        """The server stopped answering (see `stopped`)."""
        return self.stopped == "unresponsive"

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
        out = {**bench_serving_json(m)}
        if self.stopped == "error_budget":
            sent = m.completed + m.errors + m.cancelled
            out["error_rate"] = m.errors / sent if sent else 0.0
            out["error_rate_of_ended"] = m.error_rate
        if self.options is not None:
            out["max_concurrency"] = self.options.concurrency  # None: no cap (a rate)
        return {
            **out,
            "stopped": self.stopped,
            "exhausted": self.exhausted,
            **({"cut_reason": self.cut_reason} if self.was_cut else {}),
            "silent_s": round(self.silent_s, 3),
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
