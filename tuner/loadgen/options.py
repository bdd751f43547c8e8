"""How a load run sends: `LoadOptions`, built mechanically from the study file's workload section.

Every default and every user-facing check of these options is `config.schema.WorkloadSection`'s; this
module only adds what a run decides (concurrency, a searched request rate, the API key, the
self-check's lag limit) and the client's own knobs, which no study sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.config.base import MAX_CONCURRENCY
from tuner.config.workload import WorkloadSection

#: the self-check's event-loop lag limit for a one-off run (`tuner bench`); a study passes its own
MAX_LOOP_LAG_MS = 50.0
#: the error budget judges a run from this many failures on: the first couple of a run end in
#: milliseconds while its successes stream for seconds, and say nothing yet about its rate
MIN_ERRORS = 10

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
    """How to send (built by `load_options`). `request_rate` inf = closed loop only;
    `concurrency` None = no cap on requests in flight (a Poisson rate only, bench_serving's
    max_concurrency None); stop at `num_requests` (None = all built requests) and/or
    `duration_s`. `max_error_rate` is the tolerated failed fraction of the requests sent
    (counted over at least 20, judged from MIN_ERRORS failures on), past which the run stops,
    flagged. The last three fields are the client's own knobs: how often /metrics is
    scraped, bench_serving's pause after a cache flush, the CPU share the self-check tolerates."""

    backend: str
    concurrency: int | None
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
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 (got {self.concurrency})")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (got {self.request_rate})")
        if self.concurrency is None and math.isinf(self.request_rate):
            raise ValueError("a closed loop needs a concurrency (no cap needs a request rate)")

    @property
    def slots(self) -> int:
        """How many requests may be in flight at once (no cap: MAX_CONCURRENCY)."""
        return MAX_CONCURRENCY if self.concurrency is None else self.concurrency


def load_options(
    w: WorkloadSection,
    *,
    concurrency: int | None,
    request_rate: float | None = None,
    api_key: str | None = None,
    max_loop_lag_ms: float = MAX_LOOP_LAG_MS,
    max_error_rate: float | None = None,
) -> LoadOptions:
    """`w`'s options for one run at `concurrency` (None: no cap, with a rate); a trial's
    `request_rate` overrides `w`'s (a study may search it as a client-side parameter); no rate
    at all = closed loop. `max_error_rate` overrides `w`'s (a study's SLO may allow more)."""
    rate = request_rate if request_rate is not None else w.request_rate
    values = {key: getattr(w, key) for key in _FROM_WORKLOAD}
    if max_error_rate is not None:
        values["max_error_rate"] = max_error_rate
    return LoadOptions(
        **values,
        concurrency=concurrency,
        request_rate=math.inf if rate is None else rate,
        api_key=api_key,
        max_loop_lag_ms=max_loop_lag_ms,
    )
