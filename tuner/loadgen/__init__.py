"""The load: what a trial sends (workloads) and how it is measured (the async client, bench_serving's
metrics and names). Pure but for `client`, `timed` and `run`, which do the network I/O.

Closed loop at `concurrency` (N workers = bench_serving's semaphore; a request's clock starts
when it holds its slot), optionally fed by seeded Poisson arrivals at `request_rate`. Warm-up
requests, optional `/flush_cache`, then the timed run bounded by a request count and/or a
duration (at the deadline in-flight requests are cancelled and recorded as such). The aiohttp
session is an argument (`run.make_session` builds a suitable one); the server's `/metrics` is
scraped before, during and after the run when it exists. A self-check flags runs where the
client itself lagged (event-loop overshoot, CPU saturation): discard, do not trust.

Modules: `workload` (seeded request streams), `plan` (one trial's concurrency, error budget and
top-up from the study file), `options` (LoadOptions from the workload section), `window` (does
a window measure a steady state), `client` (payloads and stream parsing), `timed` (the timed
run), `monitor` (the self-check), `result` (LoadResult), `run` (warm-up, flush, the entry
points), `bounds` (every step's deadline, from the window), `metrics` (bench_serving's metrics
from the records), `names` (bench_serving's names for what tuner sends).
"""
