"""A whole load run: session, warm-up, optional cache flush, then the timed run."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

import aiohttp

from tuner.errors import ConfigError, HostUnreachable
from tuner.loadgen.client import Client, RequestState, send_one
from tuner.loadgen.options import LoadOptions
from tuner.loadgen.result import LoadResult
from tuner.loadgen.timed import TimedRun
from tuner.metrics import RequestRecord
from tuner.workload import Request

if TYPE_CHECKING:
    from rich.progress import Progress

#: SGLang answers /flush_cache with 400 while requests are pending: retry this often, this far apart
_FLUSH_TRIES, _FLUSH_RETRY_S = 20, 0.25


def make_session(options: LoadOptions) -> aiohttp.ClientSession:
    """One session whose connector never queues below the client's own concurrency."""
    connector = aiohttp.TCPConnector(limit=max(100, options.concurrency + 16), limit_per_host=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


def run_load_sync(
    base_url: str,
    requests: Sequence[Request],
    options: LoadOptions,
    progress: Progress | None = None,
) -> LoadResult:
    """`run_load` in a fresh event loop with a session from `make_session`."""

    async def main() -> LoadResult:
        async with make_session(options) as session:
            return await run_load(session, base_url, requests, options, progress)

    return asyncio.run(main())


async def run_load(
    session: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[Request],
    options: LoadOptions,
    progress: Progress | None = None,
) -> LoadResult:
    """Warm up, optionally flush the cache, then one timed run of `requests` per `options`."""
    if not requests:
        raise ConfigError("the workload has no requests", key="workload")
    client = Client(session, base_url, options)
    if options.backend != "sglang" and options.model is None:
        client.model = await client.served_model()
    if options.warmup_requests:
        await _warmup(client, requests, options.warmup_requests, options.concurrency)
    if options.flush_cache:
        await _flush(client)
        await asyncio.sleep(options.flush_pause_s)
    return await TimedRun(client, requests, options, progress).run()


async def _warmup(client: Client, requests: Sequence[Request], n: int, concurrency: int) -> None:
    """Send `n` untimed requests; a server that cannot be reached or refuses us is fatal here."""
    sem = asyncio.Semaphore(concurrency)

    async def go(req: Request) -> RequestRecord:
        async with sem:
            return await send_one(client, req, 0.0, RequestState())

    recs = await asyncio.gather(*(go(requests[i % len(requests)]) for i in range(n)))
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


async def _flush(client: Client) -> None:
    """Flush the server's prefix cache, retrying briefly while it is busy."""
    for _ in range(_FLUSH_TRIES):
        if await client.flush():
            return
        await asyncio.sleep(_FLUSH_RETRY_S)
