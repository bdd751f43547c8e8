"""A whole load run: session, warm-up, optional cache flush, then the timed run.

Every step has a deadline derived from the load window (tuner/loadgen/bounds.py): a server that
stops answering ends the run as `stopped == "unresponsive"` within `Bounds.total_s`, never after
the request timeout times the number of requests. `time_limit_s` (the trial's time left) caps
the whole run on top: past it the run raises TrialTimeout. `on_phase("warmup")` and
`on_phase("load")` tell the caller where the run is (the trial's phases log); `on_progress`
hears how the timed run goes (tuner/loadgen/timed.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import aiohttp

from tuner.errors import ConfigError, HostUnreachable, TrialTimeout
from tuner.loadgen.bounds import Bounds
from tuner.loadgen.client import Client, RequestState, send_one
from tuner.loadgen.metrics import RequestRecord
from tuner.loadgen.monitor import SKIPPED
from tuner.loadgen.options import LoadOptions
from tuner.loadgen.result import Cut, LoadProgress, LoadResult
from tuner.loadgen.timed import Refill, TimedRun
from tuner.loadgen.workload import Request, warmup_requests

if TYPE_CHECKING:
    from rich.progress import Progress

#: SGLang answers /flush_cache with 400 while requests are pending: retry this far apart
_FLUSH_RETRY_S = 0.25

Phase = Callable[[str], None]
Tick = Callable[[LoadProgress], None]


def make_session(options: LoadOptions) -> aiohttp.ClientSession:
    """One session whose connector never queues below the client's own concurrency."""
    # no cap (a Poisson rate without a concurrency): no connector limit either
    limit = 0 if options.concurrency is None else max(100, options.concurrency + 16)
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


def run_load_sync(
    base_url: str,
    requests: Sequence[Request],
    options: LoadOptions,
    progress: Progress | None = None,
    *,
    time_limit_s: float | None = None,
    on_phase: Phase | None = None,
    on_progress: Tick | None = None,
    more: Refill | None = None,
    cut: Cut | None = None,
) -> LoadResult:
    """`run_load` in a fresh event loop with a session from `make_session`."""

    async def main() -> LoadResult:
        async with make_session(options) as session:
            return await run_load(
                session,
                base_url,
                requests,
                options,
                progress,
                time_limit_s=time_limit_s,
                on_phase=on_phase,
                on_progress=on_progress,
                more=more,
                cut=cut,
            )

    return asyncio.run(main())


async def run_load(
    session: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[Request],
    options: LoadOptions,
    progress: Progress | None = None,
    *,
    time_limit_s: float | None = None,
    on_phase: Phase | None = None,
    on_progress: Tick | None = None,
    more: Refill | None = None,
    cut: Cut | None = None,
) -> LoadResult:
    """Warm up, optionally flush the cache, then one timed run of `requests` per `options`;
    `more(start, n)` extends a duration-bound run's list when it runs out (timed.py); `cut`
    may end the timed run early (LoadResult.stopped "cut").

    Raises TrialTimeout when the whole run outlives `time_limit_s` (None: no limit beyond the
    run's own bounds).
    """
    if not requests:
        raise ConfigError("the workload has no requests", key="workload")
    args = (session, base_url, requests, options, progress, on_phase, on_progress, more, cut)
    if time_limit_s is None:
        return await _run(*args)
    try:
        async with asyncio.timeout(max(0.0, time_limit_s)) as cm:
            return await _run(*args)
    except TimeoutError as exc:
        if not cm.expired():
            raise
        msg = f"load run cut at the trial's time left ({time_limit_s:.0f} s)"
        raise TrialTimeout(msg) from exc


async def _run(
    session: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[Request],
    options: LoadOptions,
    progress: Progress | None,
    on_phase: Phase | None,
    on_progress: Tick | None = None,
    more: Refill | None = None,
    cut: Cut | None = None,
) -> LoadResult:
    bounds = Bounds.of(options)
    client = Client(session, base_url, options)
    if on_phase is not None:
        on_phase("warmup")
    if options.backend != "sglang" and options.model is None:
        client.model = await client.served_model(bounds.lookup_s)
    if options.warmup_requests:
        t0 = time.perf_counter()
        await _warmup(client, requests, options.warmup_requests, options.slots, bounds)
        if client.heard_at < t0:
            # not one status line or byte: measuring this server would only measure the hang
            return unanswered(time.perf_counter() - t0)
    if options.flush_cache:
        # past its bound the timed run finds out whether the server still answers
        with contextlib.suppress(TimeoutError):
            flush = _flush(client, options.flush_pause_s, bounds.flush_s)
            await asyncio.wait_for(flush, bounds.flush_s)
    if on_phase is not None:
        on_phase("load")
    timed = TimedRun(client, requests, options, progress, bounds, on_progress, more, cut)
    return await timed.run()


def unanswered(silent_s: float) -> LoadResult:
    """The result of a run the server answered nothing to: no records, stopped unresponsive."""
    return LoadResult((), 0.0, SKIPPED, None, "unresponsive", silent_s=silent_s)


async def _warmup(
    client: Client, requests: Sequence[Request], n: int, concurrency: int, bounds: Bounds
) -> None:
    """Send `n` untimed requests (short answers: `warmup_requests`) within `bounds.warmup_s`; a
    server that cannot be reached or refuses us is fatal here, one that is merely slow gets the
    rest of the run to show it."""
    sem = asyncio.Semaphore(concurrency)
    end = time.perf_counter() + bounds.warmup_s

    async def go(req: Request) -> RequestRecord:
        async with sem:
            left = max(0.1, end - time.perf_counter())
            return await send_one(client, req, 0.0, RequestState(), left)

    recs = await asyncio.gather(*(go(r) for r in warmup_requests(requests, n)))
    errors = [r.error or "" for r in recs if not r.ok]
    if len(errors) < len(recs):
        return
    first = errors[0]
    if first.startswith("connection"):
        raise HostUnreachable(f"cannot reach {client.base}: {first}")
    if first.startswith("http 401"):
        raise ConfigError("the server refused the API key (HTTP 401)", key="api_key")
    if first.startswith("http 404"):
        raise ConfigError(
            f"{client.base}{client.path} not found (HTTP 404): wrong --backend?", key="backend"
        )


async def _flush(client: Client, pause_s: float, call_s: float) -> None:
    """Flush the server's prefix cache, retrying while it is busy (the caller bounds it)."""
    while not await client.flush(call_s):
        await asyncio.sleep(_FLUSH_RETRY_S)
    await asyncio.sleep(pause_s)
