"""The async load client: one timed run of requests against an SGLang-compatible server.

Closed loop at `concurrency` (N workers = bench_serving's semaphore; a request's clock starts
when it holds its slot), optionally fed by seeded Poisson arrivals at `request_rate`. Warm-up
requests, optional `/flush_cache`, then the timed run bounded by a request count and/or a
duration (at the deadline in-flight requests are cancelled and recorded as such).

The aiohttp session is an argument (`make_session` builds a suitable one); the server's
`/metrics` is scraped before, during and after the run when it exists. A self-check flags runs
where the client itself lagged (event-loop overshoot, CPU saturation): discard, do not trust.

Modules: `options` (LoadOptions from the study's workload section), `client` (payloads and
stream parsing), `timed` (the timed run), `monitor` (the self-check), `result` (LoadResult),
`run` (warm-up, flush, the entry points), `bounds` (every step's deadline, from the window).
"""

from tuner.loadgen.bounds import Bounds
from tuner.loadgen.options import MAX_LOOP_LAG_MS, LoadOptions, load_options
from tuner.loadgen.result import LoadProgress, LoadResult, SelfCheck
from tuner.loadgen.run import make_session, run_load, run_load_sync

__all__ = [
    "MAX_LOOP_LAG_MS",
    "Bounds",
    "LoadOptions",
    "LoadProgress",
    "LoadResult",
    "SelfCheck",
    "load_options",
    "make_session",
    "run_load",
    "run_load_sync",
]
