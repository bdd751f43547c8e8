"""How a load run sends: `LoadOptions`, built mechanically from the study file's workload section.

Every default and every user-facing check of these options is `config.WorkloadSection`'s; this
module only adds what a run decides (concurrency, a searched request rate, the API key, the
self-check's lag limit) and the client's own knobs, which no study sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.config import WorkloadSection

#: the self-check's event-loop lag limit for a one-off run (`tuner bench`); a study passes its own
MAX_LOOP_LAG_MS = 50.0

#: the workload keys a LoadOptions copies under the same name
_FROM_WORKLOAD = (
    "backend",
    "duration_s",
    "num_requests",
    "warmup_requests",
    "flush_cache",
    "request_timeout_s",
    "max_error_rate",
    "stream",
    "seed",
    "model",
)


@dataclass(frozen=True)
class LoadOptions:
    """How to send (built by `load_options`). `request_rate` inf = closed loop only; stop at
    `num_requests` (None = all built requests) and/or `duration_s`. `max_error_rate` is the
    tolerated failed fraction of ended requests (counted over at least 20), past which the run
    stops, flagged. The last three fields are the client's own knobs: how often /metrics is
    scraped, bench_serving's pause after a cache flush, the CPU share the self-check tolerates."""

    backend: str
    concurrency: int
    request_rate: float
    duration_s: float | None
    num_requests: int | None
    warmup_requests: int
    flush_cache: bool
    request_timeout_s: float
    max_error_rate: float
    stream: bool
    seed: int
    model: str | None
    api_key: str | None = field(repr=False)
    max_loop_lag_ms: float
    metrics_interval_s: float = 1.0
    flush_pause_s: float = 1.0
    max_client_cpu: float = 0.9

    def __post_init__(self) -> None:
        # the caller's invariants (a searched value out of range is a bug upstream); the checks
        # a user sees are WorkloadSection's
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 (got {self.concurrency})")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (got {self.request_rate})")


def load_options(
    w: WorkloadSection,
    *,
    concurrency: int,
    request_rate: float | None = None,
    api_key: str | None = None,
    max_loop_lag_ms: float = MAX_LOOP_LAG_MS,
) -> LoadOptions:
    """`w`'s options for one run at `concurrency`; a trial's `request_rate` overrides `w`'s
    (a study may search it as a client-side parameter); no rate at all = closed loop."""
    rate = request_rate if request_rate is not None else w.request_rate
    return LoadOptions(
        **{key: getattr(w, key) for key in _FROM_WORKLOAD},
        concurrency=concurrency,
        request_rate=math.inf if rate is None else rate,
        api_key=api_key,
        max_loop_lag_ms=max_loop_lag_ms,
    )
