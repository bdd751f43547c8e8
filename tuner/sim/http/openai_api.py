"""SGLang's OpenAI-compatible endpoints for the simulator: /v1/completions, /v1/chat/completions.

Flow as in SGLang's serving_chat.py / serving_completions.py: text deltas, `finish_reason` null
until the end, chat streams open with a role chunk and close with a chunk that carries
finish_reason and `matched_stop`, an optional usage chunk with `choices: []` when
`stream_options.include_usage`, then `[DONE]`. `n > 1` runs n requests (one choice each, usage
counts the prompt once); `stop` strings end a request where its text first contains one;
`logprobs` come in SGLang's shapes with made-up values. The JSON shapes of the version played are
in oaishapes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tuner.sim import tokens
from tuner.sim.http import oaishapes as shapes
from tuner.sim.http.common import (
    SSE_HEADERS,
    BadRequest,
    SimBackend,
    StreamCut,
    backend,
    cut_connection,
    error_response,
    ids_from,
    now,
    read_json,
    send_sse,
    start_requests,
    updates,
    version_of,
)
from tuner.sim.http.reqstate import ReqState

#: OpenAI's default for /v1/completions; chat without max_tokens gets SGLang's sampling default
COMPLETIONS_MAX_TOKENS = 16
CHAT_MAX_TOKENS = 128
#: SGLang's protocol.py default for a request without `model`
DEFAULT_MODEL_NAME = "default"


def _int(body: dict[str, Any], key: str, default: int | None, low: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise BadRequest(f"{key} must be an integer >= {low}, got {value!r}.")
    return value


@dataclass(frozen=True)
class _Ask:
    """What one OpenAI request asks for, parsed."""

    ids: list[int]
    max_new: int
    n: int
    stop: tuple[str, ...]
    top_logprobs: int | None  # None: no logprobs


def _parse(body: dict[str, Any], chat: bool) -> _Ask:
    """The prompt ids and sampling options of a completions or chat body."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: expected a non-empty list.")
        ids = tokens.chat_prompt_ids(messages)
    else:
        ids = ids_from(body.get("prompt"))
    default = CHAT_MAX_TOKENS if chat else COMPLETIONS_MAX_TOKENS
    max_new = body.get("max_completion_tokens")
    if max_new is None:
        max_new = _int(body, "max_tokens", default, 0)
    elif not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise BadRequest(f"max_completion_tokens must be an integer >= 0, got {max_new!r}.")
    n = _int(body, "n", 1, 1) or 1
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop must be a string or a list of strings.")
    if chat:
        top = _int(body, "top_logprobs", 0, 0) if body.get("logprobs") else None
    else:
        top = _int(body, "logprobs", None, 0)
    return _Ask(ids, max_new, n, tuple(stop), top)


def _finish(st: ReqState) -> tuple[str | None, int | str | None]:
    """(finish_reason, matched_stop) of one request."""
    reason = st.reason() if st.finished else None
    if reason is None:
        return None, None
    kind = reason.get("type", "")
    return (kind if kind in ("length", "stop") else "abort"), reason.get("matched")


@dataclass(frozen=True)
class _Reply:
    """One request's responses: what they share, and how the version played shapes them."""

    states: list[ReqState]
    chat: bool
    model: str
    created: int
    cache_report: bool
    version: str
    top_logprobs: int | None

    def top(self, obj: str, i: int = 0) -> dict[str, Any]:
        return shapes.head(self.states[i].rid, obj, self.created, self.model)

    def usage(self, drop_none: bool = False) -> dict[str, Any]:
        first = self.states[0]  # the prompt (and its cache hit) counts once, as SGLang's n
        completion = sum(st.completion_tokens for st in self.states)
        return shapes.usage(
            self.version,
            first.prompt_tokens,
            completion,
            first.cached_tokens,
            self.cache_report,
            drop_none,
        )

    def logprobs(self, st: ReqState, start: int, end: int) -> dict[str, Any] | None:
        """SGLang's logprobs of generated tokens [start, end), or None when not asked."""
        if self.top_logprobs is None:
            return None
        ids = st.output_ids()[start:end]
        pieces = [tokens.piece(t) for t in ids]
        k = self.top_logprobs
        vocab = len(tokens.VOCAB)
        alts = [
            [
                tokens.piece(tokens.VOCAB_BASE + (t - tokens.VOCAB_BASE + 37 * r) % vocab)
                for r in range(k)
            ]
            for t in ids
        ]
        build = shapes.chat_logprobs if self.chat else shapes.completion_logprobs
        return build(st.seed, start, pieces, alts)

    def whole(self) -> dict[str, Any]:
        """The non-streamed response."""
        choices = []
        for i, st in enumerate(self.states):
            text = st.text()
            body = {"message": shapes.message(self.version, text)} if self.chat else {"text": text}
            finish, matched = _finish(st)
            lp = self.logprobs(st, 0, st.completion_tokens)
            choices.append(shapes.choice(i, body, finish, matched, lp))
        obj = "chat.completion" if self.chat else "text_completion"
        return shapes.whole(self.top(obj), choices, self.usage())

    def chunk(self, i: int, text: str | None, lp: dict | None, role: str | None = None) -> dict:
        """A stream chunk of choice `i` with text (a completions chunk also carries the end)."""
        if self.chat:
            one = shapes.choice(
                i, {"delta": shapes.delta(self.version, role, text)}, None, None, lp
            )
            return shapes.chat_chunk(self.version, self.top("chat.completion.chunk", i), one)
        finish, matched = _finish(self.states[i])
        one = shapes.choice(i, {"text": text or ""}, finish, matched, lp)
        return shapes.completion_chunk(self.top("text_completion", i), one)

    def finish_chunk(self, i: int) -> dict:
        """The chat chunk that closes choice `i`: an empty delta with finish_reason."""
        finish, matched = _finish(self.states[i])
        one = shapes.choice(i, {"delta": shapes.delta(self.version)}, finish, matched)
        return shapes.chat_chunk(self.version, self.top("chat.completion.chunk", i), one)

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk with `stream_options.include_usage`: usage and no choices."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        # completions dumps this chunk with exclude_none=True, chat dumps it whole
        return {**self.top(obj), "choices": [], "usage": self.usage(drop_none=not self.chat)}


async def _run(request: web.Request, chat: bool) -> web.StreamResponse:
    srv = backend(request)
    try:
        body = await read_json(request)
        ask = _parse(body, chat)
    except BadRequest as exc:
        return error_response(str(exc), 400, True)
    ignore_eos = bool(body.get("ignore_eos", False))
    stream = bool(body.get("stream"))
    states = await start_requests(
        request, ask.ids, ask.max_new, ignore_eos, body.get("rid"), True, ask.stop, ask.n, stream
    )
    if isinstance(states, web.StreamResponse):
        return states
    for st in states:
        st.stream = bool(body.get("stream"))
    model = body.get("model") or DEFAULT_MODEL_NAME
    reply = _Reply(
        states,
        chat,
        model,
        int(time.time()),
        srv.ns.enable_cache_report,
        version_of(srv),
        ask.top_logprobs,
    )
    try:
        if not body.get("stream"):
            for st in states:
                await srv.wait_finished(st)
            return web.json_response(reply.whole())
        options = body.get("stream_options") or {}
        return await _stream(
            request,
            srv,
            reply,
            bool(options.get("include_usage")),
            bool(options.get("continuous_usage_stats")),
        )
    finally:
        for st in states:
            srv.release(st)


async def _progress(
    srv: SimBackend, states: Sequence[ReqState], cut: int | None
) -> AsyncIterator[int]:
    """The index of a choice each time it has something to send (all choices merged)."""
    if len(states) == 1:
        async for _ in updates(srv, states[0], cut):
            yield 0
        return
    queue: asyncio.Queue[tuple[int, BaseException | None, bool]] = asyncio.Queue()

    async def pump(i: int, st: ReqState) -> None:
        try:
            async for _ in updates(srv, st, cut if i == 0 else None):
                queue.put_nowait((i, None, False))
        except StreamCut as exc:
            queue.put_nowait((i, exc, True))
            return
        queue.put_nowait((i, None, True))

    tasks = [asyncio.create_task(pump(i, st)) for i, st in enumerate(states)]
    try:
        left = len(states)
        while left:
            i, exc, done = await queue.get()
            if exc is not None:
                raise exc
            if done:
                left -= 1
            else:
                yield i
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _stream(
    request: web.Request,
    srv: SimBackend,
    reply: _Reply,
    include_usage: bool,
    continuous: bool = False,
) -> web.StreamResponse:
    """Text deltas as they come; chat opens with a role chunk and ends with an empty delta.

    `continuous` (stream_options.continuous_usage_stats): each text chunk also carries the
    usage so far (serving_chat.py / serving_completions.py).
    """

    def text_chunk(i: int, delta: str, lp: dict | None) -> dict:
        chunk = reply.chunk(i, delta, lp)
        if continuous:
            st = states[i]
            # 0.5.23's chat adds the cache details (_continuous_usage_cached_details)
            details = reply.chat and shapes.newer(reply.version) and reply.cache_report
            chunk["usage"] = shapes.usage(
                reply.version, st.prompt_tokens, st.completion_tokens, st.cached_tokens, details
            )
        return chunk

    states = reply.states
    cut = srv.faults.cut_after(now(request), srv.log)
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    sent = [0] * len(states)
    opened = [False] * len(states)
    ended: list[int] = []  # chat: finish chunks follow the stream, in the order choices ended
    try:
        async for i in _progress(srv, states, cut):
            st = states[i]
            if reply.chat and not opened[i]:
                opened[i] = True
                await send_sse(resp, reply.chunk(i, "", None, role="assistant"))
            # read the count and the text together: tokens that arrive while a chunk is
            # written go out in the next one
            upto = st.completion_tokens
            delta = st.text(sent[i])
            lp = reply.logprobs(st, sent[i], upto)
            sent[i] = upto
            if reply.chat:
                if delta:
                    await send_sse(resp, text_chunk(i, delta, lp))
                # a choice can be yielded again after it ended (two updates queued before
                # this read): SGLang closes each choice once
                if st.finished and i not in ended:
                    ended.append(i)
            elif delta or st.finished:
                await send_sse(resp, text_chunk(i, delta, lp))
        for i in ended:
            await send_sse(resp, reply.finish_chunk(i))
        if include_usage:
            await send_sse(resp, reply.usage_chunk())
        await send_sse(resp, "[DONE]")
    except StreamCut:  # a cut-stream fault, or the client left (ClientGone)
        return cut_connection(request, resp)
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _run(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _run(request, chat=True)
