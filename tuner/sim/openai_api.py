"""SGLang's OpenAI-compatible endpoints for the simulator: /v1/completions, /v1/chat/completions.

Shapes follow SGLang (reference section 4): text deltas, `finish_reason` null until the end, an
optional usage chunk with `choices: []` when `stream_options.include_usage`, then `[DONE]`. Chat
streams open with a role chunk and close with an empty-delta chunk that carries finish_reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tuner.sim import tokens
from tuner.sim.httpcommon import (
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
    start_request,
    updates,
)
from tuner.sim.reqstate import ReqState

#: OpenAI's default for /v1/completions; chat without max_tokens gets SGLang's sampling default
COMPLETIONS_MAX_TOKENS = 16
CHAT_MAX_TOKENS = 128


def _finish(reason: dict | None) -> str | None:
    if reason is None:
        return None
    return {"length": "length", "stop": "stop"}.get(reason.get("type", ""), "abort")


def _usage(st: ReqState, cache_report: bool) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        "total_tokens": st.prompt_tokens + st.completion_tokens,
    }
    if cache_report:
        usage["prompt_tokens_details"] = {"cached_tokens": st.cached_tokens}
    return usage


def _max_tokens(body: dict[str, Any], default: int) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"max_tokens must be a non-negative integer, got {value!r}.")
    return value


def _prompt(body: dict[str, Any], chat: bool) -> tuple[list[int], int]:
    """(prompt ids, max new tokens) of a completions or chat body."""
    if body.get("n", 1) != 1:
        raise BadRequest("n > 1 is not simulated.")
    if not chat:
        return ids_from(body.get("prompt")), _max_tokens(body, COMPLETIONS_MAX_TOKENS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list.")
    return tokens.chat_prompt_ids(messages), _max_tokens(body, CHAT_MAX_TOKENS)


@dataclass(frozen=True)
class _Reply:
    """One request's response objects: what they share, and how each is shaped."""

    st: ReqState
    chat: bool
    model: str
    created: int
    cache_report: bool

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.st.rid, "object": obj, "created": self.created, "model": self.model}

    def whole(self) -> dict[str, Any]:
        """The non-streaming response."""
        st = self.st
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": _finish(st.finish_reason),
        }
        if self.chat:
            choice["message"] = {
                "role": "assistant",
                "content": st.text(),
                "reasoning_content": None,
                "tool_calls": None,
            }
        else:
            choice["text"] = st.text()
        head = self.head("chat.completion" if self.chat else "text_completion")
        return {**head, "choices": [choice], "usage": _usage(st, self.cache_report)}

    def chunk(self, payload: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        """One streamed chunk with one choice."""
        choice = {"index": 0, **payload, "logprobs": None, "finish_reason": finish}
        return {**self.head(self.chunk_object), "choices": [choice], "usage": None}

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk with `stream_options.include_usage`: usage and no choices."""
        usage = _usage(self.st, self.cache_report)
        return {**self.head(self.chunk_object), "choices": [], "usage": usage}

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


async def _run(request: web.Request, chat: bool) -> web.StreamResponse:
    srv = backend(request)
    try:
        body = await read_json(request)
        ids, max_new = _prompt(body, chat)
    except BadRequest as exc:
        return error_response(str(exc), 400, True)
    st = await start_request(
        request, ids, max_new, bool(body.get("ignore_eos", False)), body.get("rid"), True
    )
    if isinstance(st, web.Response):
        return st
    model = body.get("model") or srv.served_model_name
    reply = _Reply(st, chat, model, int(time.time()), srv.ns.enable_cache_report)
    try:
        if not body.get("stream"):
            await srv.wait_finished(st)
            return web.json_response(reply.whole())
        options = body.get("stream_options") or {}
        return await _stream(request, srv, reply, bool(options.get("include_usage")))
    finally:
        srv.release(st)


async def _stream(
    request: web.Request, srv: SimBackend, reply: _Reply, include_usage: bool
) -> web.StreamResponse:
    """Text deltas as they come; chat opens with a role chunk and ends with an empty delta."""
    st = reply.st
    cut = srv.faults.cut_after(now(request), srv.log)
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    if reply.chat:
        await send_sse(resp, reply.chunk({"delta": {"role": "assistant", "content": ""}}))
    try:
        async for sent in updates(srv, st, cut):
            delta = st.text(sent)
            finish = _finish(st.finish_reason) if st.finished else None
            if reply.chat:
                if delta:
                    await send_sse(resp, reply.chunk({"delta": {"content": delta}}))
                if finish is not None:
                    await send_sse(resp, reply.chunk({"delta": {}}, finish))
            elif delta or finish is not None:
                await send_sse(resp, reply.chunk({"text": delta}, finish))
    except StreamCut:
        return cut_connection(request, resp)
    if include_usage:
        await send_sse(resp, reply.usage_chunk())
    await send_sse(resp, "[DONE]")
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _run(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _run(request, chat=True)
