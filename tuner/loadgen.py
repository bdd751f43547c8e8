"""The async load client: one timed run of requests against an SGLang-compatible server.

Closed loop at `concurrency` (N workers = bench_serving's semaphore; a request's clock starts
when it holds its slot), optionally fed by seeded Poisson arrivals at `request_rate`. Warm-up
requests, optional `/flush_cache`, then the timed run bounded by a request count and/or a
duration (at the deadline in-flight requests are cancelled and recorded as such). Streams are
parsed cheaply: native `/generate` events carry cumulative `completion_tokens` (read with a
regex, no full JSON parse of the growing text), OpenAI events carry deltas and a final usage.

The aiohttp session is an argument (`make_session` builds a suitable one); the server's
`/metrics` is scraped before, during and after the run when it exists. A self-check flags runs
where the client itself lagged (event-loop overshoot, CPU saturation): discard, do not trust.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from tuner.errors import ConfigError, HostUnreachable
from tuner.metrics import (
    Metrics,
    RequestRecord,
    Samples,
    ServerView,
    bench_serving_json,
    parse_prometheus,
    percentile,
    server_view,
    summarize,
)
from tuner.workload import BACKENDS, Backend, Request

if TYPE_CHECKING:
    from rich.progress import Progress

_COMPLETION_RE = re.compile(rb'"completion_tokens":\s*(\d+)')
_PROMPT_RE = re.compile(rb'"prompt_tokens":\s*(\d+)')
_CACHED_RE = re.compile(rb'"cached_tokens":\s*(\d+)')
_ABORT_RE = re.compile(rb'"finish_reason":\s*\{\s*"type":\s*"abort"')
_LAG_TICK_S = 0.02
_METRICS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LoadOptions:
    """How to send. `request_rate` inf = closed loop only; stop at `num_requests` (None = all
    built requests) and/or `duration_s`. `error_budget` is the tolerated failed fraction of
    ended requests (counted over at least 20), past which the run stops, flagged."""

    backend: Backend = "sglang"
    concurrency: int = 64
    request_rate: float = math.inf
    duration_s: float | None = None
    num_requests: int | None = None
    warmup_requests: int = 1
    flush_cache: bool = False
    request_timeout_s: float = 600.0
    error_budget: float = 0.1
    stream: bool = True
    seed: int = 0
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    metrics_interval_s: float = 1.0
    flush_pause_s: float = 1.0
    max_loop_lag_ms: float = 50.0
    max_client_cpu: float = 0.9

    def __post_init__(self) -> None:
        def bad(key: str, msg: str) -> ConfigError:
            return ConfigError(msg, key=f"workload.{key}")

        if self.backend not in BACKENDS:
            raise bad("backend", f"{self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.concurrency < 1:
            raise bad("concurrency", f"must be >= 1 (got {self.concurrency})")
        if not self.request_rate > 0:
            raise bad("request_rate", f"must be > 0 (got {self.request_rate})")
        if self.duration_s is not None and not self.duration_s > 0:
            raise bad("duration_s", f"must be > 0 (got {self.duration_s})")
        if self.num_requests is not None and self.num_requests < 1:
            raise bad("num_requests", f"must be >= 1 (got {self.num_requests})")
        if self.warmup_requests < 0:
            raise bad("warmup_requests", f"must be >= 0 (got {self.warmup_requests})")
        if not self.request_timeout_s > 0:
            raise bad("request_timeout_s", f"must be > 0 (got {self.request_timeout_s})")
        if not 0.0 <= self.error_budget <= 1.0:
            raise bad("error_budget", f"must be in [0, 1] (got {self.error_budget})")


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


class _State:
    """Mutable per-request progress, readable by the caller if the request is cancelled."""

    __slots__ = ("cached", "itl", "last_t", "prompt_tokens", "t0", "tokens", "ttft")

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.ttft: float | None = None
        self.tokens = 0
        self.itl: list[float] = []
        self.last_t = 0.0
        self.prompt_tokens: int | None = None
        self.cached: int | None = None

    def advance(self, new_tokens: int, now: float, t0: float) -> None:
        """`new_tokens` arrived at `now`: first one sets TTFT, later gaps split per token."""
        if new_tokens <= 0:
            return
        if self.ttft is None:
            self.ttft = now - t0
        else:
            gap = (now - self.last_t) / new_tokens
            self.itl.extend([gap] * new_tokens)
        self.last_t = now
        self.tokens += new_tokens


class _RequestFailed(Exception):
    """A request ended without a usable answer (message recorded, run continues)."""


class _Client:
    """Builds payloads and reads responses for one backend."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, options: LoadOptions):
        self.session = session
        self.base = base_url.rstrip("/")
        self.opt = options
        self.model = options.model or "default"
        self.headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=options.request_timeout_s)
        self.path = {
            "sglang": "/generate",
            "openai": "/v1/completions",
            "openai-chat": "/v1/chat/completions",
        }[options.backend]

    def payload(self, req: Request) -> dict[str, Any]:
        opt = self.opt
        if opt.backend == "sglang":
            body: dict[str, Any] = {
                "sampling_params": {
                    "max_new_tokens": req.output_len,
                    "temperature": 0.0,
                    "ignore_eos": True,
                },
                "stream": opt.stream,
            }
            if req.token_ids is not None:
                body["input_ids"] = list(req.token_ids)
            else:
                body["text"] = req.text
            return body
        body = {
            "model": self.model,
            "max_tokens": req.output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": opt.stream,
        }
        if opt.stream:
            body["stream_options"] = {"include_usage": True}
        if opt.backend == "openai":
            body["prompt"] = req.prompt_text()
        else:
            body["messages"] = [{"role": "user", "content": req.prompt_text()}]
        return body

    async def send(self, req: Request, st: _State) -> None:
        """Send one request, filling `st`. Raises _RequestFailed and aiohttp's errors."""
        body = self.payload(req)
        t0 = st.t0 = st.last_t = time.perf_counter()
        async with self.session.post(
            self.base + self.path, json=body, headers=self.headers, timeout=self.timeout
        ) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200].replace("\n", " ")
                raise _RequestFailed(f"http {resp.status}: {text}")
            if not self.opt.stream:
                self._read_whole(await resp.json(content_type=None), st, t0)
            elif self.opt.backend == "sglang":
                await self._read_native(resp, st, t0)
            else:
                await self._read_openai(resp, st, t0)

    def _read_whole(self, data: Any, st: _State, t0: float) -> None:
        if not isinstance(data, dict) or "error" in data:
            raise _RequestFailed(f"error: {str(data)[:200]}")
        info = data.get("meta_info") or data.get("usage") or {}
        n = int(info.get("completion_tokens") or 0)
        st.advance(n, time.perf_counter(), t0)
        st.prompt_tokens = info.get("prompt_tokens")
        st.cached = info.get("cached_tokens")

    async def _read_native(self, resp: aiohttp.ClientResponse, st: _State, t0: float) -> None:
        last = b""
        buf = b""
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            lines = (buf + data if buf else data).split(b"\n")
            buf = lines.pop()
            newest = None
            for line in lines:
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload != b"[DONE]":
                        newest = payload
            if newest is None:
                continue
            # completion_tokens is cumulative: only the newest event of a read matters
            m = _COMPLETION_RE.search(newest)
            if m is None:
                raise _RequestFailed(f"error: {newest[:200].decode(errors='replace')}")
            st.advance(int(m.group(1)) - st.tokens, now, t0)
            last = newest
        if not last:
            raise _RequestFailed("error: empty stream")
        if _ABORT_RE.search(last):
            raise _RequestFailed(f"abort: {last[-200:].decode(errors='replace')}")
        if m := _PROMPT_RE.search(last):
            st.prompt_tokens = int(m.group(1))
        if m := _CACHED_RE.search(last):
            st.cached = int(m.group(1))

    async def _read_openai(self, resp: aiohttp.ClientResponse, st: _State, t0: float) -> None:
        buf = b""
        chunks = 0
        usage: dict[str, Any] | None = None
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            lines = (buf + data if buf else data).split(b"\n")
            buf = lines.pop()
            new = 0
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    continue
                obj = json.loads(payload)
                if "error" in obj:
                    raise _RequestFailed(f"error: {str(obj['error'])[:200]}")
                if obj.get("usage"):
                    usage = obj["usage"]
                for choice in obj.get("choices") or ():
                    text = choice.get("text")
                    if text is None:
                        text = (choice.get("delta") or {}).get("content")
                    if text:
                        new += 1
            # deltas carry no token count: one chunk = one token until usage says otherwise
            st.advance(new, now, t0)
            chunks += new
        if chunks == 0:
            raise _RequestFailed("error: no content in stream")
        if usage:
            st.tokens = int(usage.get("completion_tokens") or st.tokens)
            st.prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            st.cached = details.get("cached_tokens")


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, _RequestFailed):
        return str(exc)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection: {exc.os_error or exc}"
    return f"{type(exc).__name__}: {exc}"[:200]


def _make_record(
    req: Request, st: _State, run_t0: float, error: str | None, *, cancelled: bool = False
) -> RequestRecord:
    return RequestRecord(
        index=req.index,
        ok=error is None,
        prompt_len=st.prompt_tokens if st.prompt_tokens is not None else req.prompt_len,
        output_len=st.tokens,
        start_s=st.t0 - run_t0,
        latency_s=time.perf_counter() - st.t0,
        ttft_s=st.ttft,
        itl_s=tuple(st.itl),
        error=error,
        cancelled=cancelled,
        cached_tokens=st.cached,
        conversation=req.conversation,
        turn=req.turn,
    )


async def _one(client: _Client, req: Request, run_t0: float, st: _State) -> RequestRecord:
    """Send `req`; every outcome but cancellation becomes a record."""
    error = None
    try:
        await client.send(req, st)
    except (TimeoutError, aiohttp.ClientError, _RequestFailed, ValueError) as exc:
        error = _error_text(exc)
    return _make_record(req, st, run_t0, error)


async def _scrape(client: _Client) -> Samples | None:
    try:
        async with client.session.get(
            client.base + "/metrics", timeout=aiohttp.ClientTimeout(total=_METRICS_TIMEOUT_S)
        ) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    samples = parse_prometheus(text)
    return samples if any(k.startswith("sglang:") for k in samples) else None


async def _served_model(client: _Client) -> str:
    """The first model `/v1/models` lists (OpenAI endpoints want a model name)."""
    try:
        async with client.session.get(
            client.base + "/v1/models", headers=client.headers, timeout=client.timeout
        ) as resp:
            if resp.status == 200:
                data = await resp.json(content_type=None)
                return str(data["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, TypeError, ValueError):
        pass
    return "default"


async def _warmup(client: _Client, requests: Sequence[Request], n: int, concurrency: int) -> None:
    """Send `n` untimed requests; a server that cannot be reached or refuses us is fatal here."""
    sem = asyncio.Semaphore(concurrency)

    async def go(req: Request) -> RequestRecord:
        async with sem:
            return await _one(client, req, 0.0, _State())

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


async def _flush(client: _Client) -> None:
    """POST /flush_cache; SGLang answers 400 while requests are pending, so retry briefly."""
    for _ in range(20):
        try:
            async with client.session.post(
                client.base + "/flush_cache", headers=client.headers, timeout=client.timeout
            ) as resp:
                if resp.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            return
        await asyncio.sleep(0.25)


class _LagMonitor:
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
    client = _Client(session, base_url, options)
    if options.backend != "sglang" and options.model is None:
        client.model = await _served_model(client)
    if options.warmup_requests:
        await _warmup(client, requests, options.warmup_requests, options.concurrency)
    if options.flush_cache:
        await _flush(client)
        await asyncio.sleep(options.flush_pause_s)
    return await _TimedRun(client, requests, options, progress).run()


class _TimedRun:
    """The timed part: dispatch (closed loop or Poisson), stop conditions, bookkeeping."""

    def __init__(
        self,
        client: _Client,
        requests: Sequence[Request],
        options: LoadOptions,
        progress: Progress | None,
    ):
        self.client = client
        self.opt = options
        limit = min(len(requests), options.num_requests or len(requests))
        self.planned = list(requests[:limit])
        # multi-turn: each turn unlocks the next turn of its conversation
        self.successor: dict[int, Request] = {}
        last_of: dict[int, Request] = {}
        first: list[Request] = []
        for r in sorted(self.planned, key=lambda r: (r.turn, r.index)):
            prev = last_of.get(r.conversation) if r.conversation is not None else None
            if prev is None:
                first.append(r)
            else:
                self.successor[prev.index] = r
            if r.conversation is not None:
                last_of[r.conversation] = r
        first.sort(key=lambda r: r.index)
        self.ready: asyncio.Queue[Request | None] = asyncio.Queue()
        for r in first:
            self.ready.put_nowait(r)
        self.records: list[RequestRecord] = []
        self.inflight: dict[asyncio.Task[RequestRecord], tuple[Request, _State]] = {}
        self.gated: set[asyncio.Task[None]] = set()
        self.outstanding = len(self.planned)
        self.errors = 0
        self.finished = asyncio.Event()
        self.stopped = "done"
        self.progress = progress
        self.task_id = progress.add_task("load", total=limit) if progress is not None else None
        self.t0 = 0.0

    def _record(self, rec: RequestRecord, req: Request) -> None:
        self.records.append(rec)
        self.outstanding -= 1
        if self.progress is not None and self.task_id is not None:
            self.progress.advance(self.task_id)
        if not rec.ok:
            self.errors += 1
            ended = len(self.records)
            if self.errors > self.opt.error_budget * max(ended, 20):
                self._stop("error_budget")
        nxt = self.successor.get(req.index)
        if nxt is not None:
            self.ready.put_nowait(nxt)
        if self.outstanding <= 0:
            self._stop("done")

    def _stop(self, why: str) -> None:
        if not self.finished.is_set():
            self.stopped = why
            self.finished.set()

    async def _send(self, req: Request) -> None:
        st = _State()
        task = asyncio.create_task(_one(self.client, req, self.t0, st))
        self.inflight[task] = (req, st)
        # shielded: when the run stops, the request stays in `inflight` to be recorded as cut
        rec = await asyncio.shield(task)
        del self.inflight[task]
        self._record(rec, req)

    async def _worker(self) -> None:
        while not self.finished.is_set():
            req = await self.ready.get()
            if req is None:
                return
            await self._send(req)

    async def _poisson(self) -> None:
        rng = random.Random(self.opt.seed)
        sem = asyncio.Semaphore(self.opt.concurrency)

        async def gated(req: Request) -> None:
            async with sem:
                if not self.finished.is_set():
                    await self._send(req)

        while not self.finished.is_set():
            req = await self.ready.get()
            if req is None:
                return
            t = asyncio.create_task(gated(req))
            self.gated.add(t)
            t.add_done_callback(self.gated.discard)
            await asyncio.sleep(rng.expovariate(self.opt.request_rate))

    async def _sampler(self, during: list[Samples]) -> None:
        while True:
            await asyncio.sleep(self.opt.metrics_interval_s)
            s = await _scrape(self.client)
            if s is not None:
                during.append(s)

    async def run(self) -> LoadResult:
        opt = self.opt
        before = await _scrape(self.client) if opt.metrics_interval_s > 0 else None
        during: list[Samples] = []
        lag = _LagMonitor()
        lag.start()
        cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        if math.isinf(opt.request_rate):
            drivers = [asyncio.create_task(self._worker()) for _ in range(opt.concurrency)]
        else:
            drivers = [asyncio.create_task(self._poisson())]
        if before is not None:
            drivers.append(asyncio.create_task(self._sampler(during)))
        try:
            await asyncio.wait_for(self.finished.wait(), timeout=opt.duration_s)
        except TimeoutError:
            self._stop("duration")
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
        drivers.extend(self.gated)
        for d in drivers:
            d.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
        # requests still in flight were cut by the stop: record what they got so far
        cut = list(self.inflight.items())
        for task, _ in cut:
            task.cancel()
        await asyncio.gather(*(t for t, _ in cut), return_exceptions=True)
        for _, (req, st) in cut:
            self.records.append(_make_record(req, st, self.t0, "cancelled", cancelled=True))
        await lag.stop()
        after = await _scrape(self.client) if before is not None else None
        wall = end - self.t0
        view = server_view(before, after, during, wall) if before and after else None
        return LoadResult(
            records=tuple(sorted(self.records, key=lambda r: r.start_s)),
            duration_s=wall,
            self_check=self._self_check(lag.lags, cpu, wall),
            server=view,
            stopped=self.stopped,
        )

    def _self_check(self, lags: list[float], cpu_s: float, wall_s: float) -> SelfCheck:
        opt = self.opt
        lag_sorted = sorted(x * 1000 for x in lags)
        p99 = percentile(lag_sorted, 99)
        mx = lag_sorted[-1] if lag_sorted else 0.0
        cpu = cpu_s / wall_s if wall_s > 0 else 0.0
        reasons = []
        if p99 > opt.max_loop_lag_ms:
            reasons.append(f"event loop lag p99 {p99:.0f} ms > {opt.max_loop_lag_ms:.0f} ms")
        if cpu > opt.max_client_cpu:
            reasons.append(f"client CPU {cpu:.0%} of one core > {opt.max_client_cpu:.0%}")
        limit = getattr(self.client.session.connector, "limit", 0)
        if limit and limit < opt.concurrency:
            reasons.append(f"connector limit {limit} < concurrency {opt.concurrency}")
        return SelfCheck(not reasons, tuple(reasons), p99, mx, cpu)
