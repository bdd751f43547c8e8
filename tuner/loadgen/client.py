"""One request's round trip: payloads per backend, streamed responses parsed into token timings.

Streams are parsed cheaply: native `/generate` events carry cumulative `completion_tokens` (read
with a regex, no full JSON parse of the growing text), OpenAI events carry deltas and a final
usage. Every outcome but cancellation becomes a `RequestRecord`. The client notes when the server
last sent anything (`Client.heard_at`): a run that hears nothing stops (tuner/loadgen/bounds.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from tuner.loadgen.metrics import RequestRecord, Samples, parse_prometheus
from tuner.loadgen.options import LoadOptions
from tuner.loadgen.workload import Request

_COMPLETION_RE = re.compile(rb'"completion_tokens":\s*(\d+)')
_PROMPT_RE = re.compile(rb'"prompt_tokens":\s*(\d+)')
_CACHED_RE = re.compile(rb'"cached_tokens":\s*(\d+)')
_ABORT_RE = re.compile(rb'"finish_reason":\s*\{\s*"type":\s*"abort"')
_METRICS_TIMEOUT_S = 5.0
_PATHS = {"sglang": "/generate", "openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


class RequestState:
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


class RequestFailed(Exception):
    """A request ended without a usable answer (message recorded, run continues)."""


class Client:
    """Builds payloads and reads responses for one backend; also the run's other server calls."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, options: LoadOptions):
        self.session = session
        self.base = base_url.rstrip("/")
        self.opt = options
        self.model = options.model or "default"
        self.headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=options.request_timeout_s)
        self.path = _PATHS[options.backend]
        #: perf_counter() of the last status line or byte the server sent (0: nothing yet)
        self.heard_at = 0.0
        #: since when the server owes us something: its last byte, or the first request sent
        #: after it was idle (a timed-out request does not reset it: it was never answered)
        self.waiting_since = 0.0
        self.pending = 0  # requests in flight

    def hear(self) -> None:
        """The server sent something: it is not hung."""
        self.heard_at = self.waiting_since = time.perf_counter()

    def silence(self, now: float) -> float:
        """Seconds the server has sent nothing while requests waited on it (0: none waits)."""
        return max(0.0, now - self.waiting_since) if self.pending else 0.0

    def payload(self, req: Request) -> dict[str, Any]:
        """The request body for this backend (greedy, ignore_eos: exact output lengths)."""
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

    async def send(self, req: Request, st: RequestState, timeout_s: float | None = None) -> None:
        """Send one request, filling `st`; `timeout_s` bounds its total time (default: the
        request timeout). Raises RequestFailed, TimeoutError and aiohttp's errors."""
        body = self.payload(req)
        t0 = st.t0 = st.last_t = time.perf_counter()
        timeout = self.timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        if not self.pending and self.heard_at >= self.waiting_since:
            self.waiting_since = t0  # the server was idle, not silent, until now
        self.pending += 1
        try:
            await self._post(req, body, st, t0, timeout)
        finally:
            self.pending -= 1

    async def _post(
        self,
        req: Request,
        body: dict[str, Any],
        st: RequestState,
        t0: float,
        timeout: aiohttp.ClientTimeout,
    ) -> None:
        async with self.session.post(
            self.base + self.path, json=body, headers=self.headers, timeout=timeout
        ) as resp:
            self.hear()
            if resp.status != 200:
                text = (await resp.text())[:200].replace("\n", " ")
                raise RequestFailed(f"http {resp.status}: {text}")
            if not self.opt.stream:
                _read_whole(await resp.json(content_type=None), st, t0)
                self.hear()
            elif self.opt.backend == "sglang":
                await _read_native(resp, st, t0, self.hear)
            else:
                await _read_openai(resp, st, t0, self.hear)

    async def scrape(self) -> Samples | None:
        """The server's /metrics, or None when it has no SGLang metrics (or no answer)."""
        try:
            async with self.session.get(
                self.base + "/metrics", timeout=aiohttp.ClientTimeout(total=_METRICS_TIMEOUT_S)
            ) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        samples = parse_prometheus(text)
        return samples if any(k.startswith("sglang:") for k in samples) else None

    async def served_model(self, timeout_s: float) -> str:
        """The first model `/v1/models` lists (OpenAI endpoints want a model name)."""
        try:
            async with self.session.get(
                self.base + "/v1/models",
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                if resp.status == 200:
                    data = await resp.json(content_type=None)
                    return str(data["data"][0]["id"])
        except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, TypeError, ValueError):
            pass
        return "default"

    async def flush(self, timeout_s: float) -> bool:
        """POST /flush_cache once; True when the server flushed (it refuses while busy)."""
        try:
            async with self.session.post(
                self.base + "/flush_cache",
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            # a server without the endpoint, or gone: nothing to wait for
            return True


def _read_whole(data: Any, st: RequestState, t0: float) -> None:
    if not isinstance(data, dict) or "error" in data:
        raise RequestFailed(f"error: {str(data)[:200]}")
    info = data.get("meta_info") or data.get("usage") or {}
    n = int(info.get("completion_tokens") or 0)
    st.advance(n, time.perf_counter(), t0)
    st.prompt_tokens = info.get("prompt_tokens")
    st.cached = info.get("cached_tokens")


async def _read_native(
    resp: aiohttp.ClientResponse, st: RequestState, t0: float, hear: Callable[[], None]
) -> None:
    last = b""
    buf = b""
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        hear()
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
            raise RequestFailed(f"error: {newest[:200].decode(errors='replace')}")
        st.advance(int(m.group(1)) - st.tokens, now, t0)
        last = newest
    if not last:
        raise RequestFailed("error: empty stream")
    if _ABORT_RE.search(last):
        raise RequestFailed(f"abort: {last[-200:].decode(errors='replace')}")
    if m := _PROMPT_RE.search(last):
        st.prompt_tokens = int(m.group(1))
    if m := _CACHED_RE.search(last):
        st.cached = int(m.group(1))


async def _read_openai(
    resp: aiohttp.ClientResponse, st: RequestState, t0: float, hear: Callable[[], None]
) -> None:
    buf = b""
    chunks = 0
    usage: dict[str, Any] | None = None
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        hear()
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
                raise RequestFailed(f"error: {str(obj['error'])[:200]}")
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
        raise RequestFailed("error: no content in stream")
    if usage:
        st.tokens = int(usage.get("completion_tokens") or st.tokens)
        st.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        st.cached = details.get("cached_tokens")


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, RequestFailed):
        return str(exc)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection: {exc.os_error or exc}"
    return f"{type(exc).__name__}: {exc}"[:200]


def make_record(
    req: Request, st: RequestState, run_t0: float, error: str | None, *, cancelled: bool = False
) -> RequestRecord:
    """What `st` got so far as a record (`run_t0`: the timed run's start)."""
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


async def send_one(
    client: Client,
    req: Request,
    run_t0: float,
    st: RequestState,
    timeout_s: float | None = None,
) -> RequestRecord:
    """Send `req` (within `timeout_s`, default the request timeout); every outcome but
    cancellation becomes a record."""
    error = None
    try:
        await client.send(req, st, timeout_s)
    except (TimeoutError, aiohttp.ClientError, RequestFailed, ValueError) as exc:
        error = _error_text(exc)
    return make_record(req, st, run_t0, error)
