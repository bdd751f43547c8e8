"""How long each part of a load run may take: deadlines derived from the load window. Pure.

With W the window (`duration_s`, or `DEFAULT_WINDOW_S` for a run bounded by a request count)
and T the request timeout (`request_timeout_s`, always the ceiling):

    model lookup (OpenAI backends, no model named)  min(T, PROBE_S)
    warm-up, all warm-up requests together           min(T, max(WARMUP_FLOOR_S, W/2))
    cache flush, its retries and the pause after it  min(T, max(FLUSH_FLOOR_S, W/4))
    one timed request                                min(T, time left in the window + GRACE_S)
                                                     (a count-bounded run: T)
    stall: requests in flight, nothing from the      max(STALL_FLOOR_S, min(T, W/4))
    server (no status line, no byte) this long       -> the run stops as "unresponsive"
    quiet: the window ends with the server silent    min(stall, W/4)
    this long while requests wait                    -> "unresponsive" too (a short window)
    each /metrics scrape (before, after)             SCRAPE_S (after: skipped when unresponsive)

"unresponsive" only says the server may have hung: whoever ran the load asks /health before
calling it a hang (tuner/trial/runner.py). A run against a server that stops answering entirely
returns within `Bounds.total_s`:
lookup + warm-up + flush + 2 scrapes + (W, or the stall for a count-bounded run) + SLACK_S.
A warm-up the server answered nothing to ends the run at once as "unresponsive" (no timed run).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.loadgen.options import LoadOptions

#: the window assumed for a run bounded only by a request count
DEFAULT_WINDOW_S = 60.0
PROBE_S = 10.0
WARMUP_FLOOR_S = 10.0
FLUSH_FLOOR_S = 5.0
#: a request may outlive the window by this much (it is cut at the window's end anyway)
GRACE_S = 5.0
STALL_FLOOR_S = 5.0
SCRAPE_S = 5.0
#: event-loop and teardown time the bound allows on a busy machine
SLACK_S = 5.0


@dataclass(frozen=True)
class Bounds:
    """The deadlines of one load run (seconds); build with `Bounds.of(options)`."""

    window_s: float
    timed: bool  # bounded by duration_s (else by a request count)
    request_s: float
    lookup_s: float
    warmup_s: float
    flush_s: float
    stall_s: float
    quiet_s: float
    scrape_s: float = SCRAPE_S

    @classmethod
    def of(cls, opt: LoadOptions) -> Bounds:
        t = opt.request_timeout_s
        w = opt.duration_s if opt.duration_s is not None else DEFAULT_WINDOW_S
        return cls(
            window_s=w,
            timed=opt.duration_s is not None,
            request_s=t,
            lookup_s=min(t, PROBE_S),
            warmup_s=min(t, max(WARMUP_FLOOR_S, w / 2)),
            flush_s=min(t, max(FLUSH_FLOOR_S, w / 4)),
            stall_s=max(STALL_FLOOR_S, min(t, w / 4)),
            quiet_s=min(max(STALL_FLOOR_S, min(t, w / 4)), w / 4),
        )

    def request_timeout(self, left_s: float | None) -> float:
        """One timed request's total time with `left_s` of the window left (None: no window)."""
        if left_s is None:
            return self.request_s
        return max(0.1, min(self.request_s, left_s + GRACE_S))

    @property
    def total_s(self) -> float:
        """The longest a whole run takes when the server stops answering entirely."""
        timed = self.window_s if self.timed else self.stall_s
        before = self.lookup_s + self.warmup_s + self.flush_s
        return before + 2 * self.scrape_s + timed + SLACK_S
