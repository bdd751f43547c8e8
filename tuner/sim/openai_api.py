"""SGLang's OpenAI-compatible endpoints for the simulator: /v1/completions, /v1/chat/completions.

Shapes follow SGLang (reference section 4): text deltas, `finish_reason` null until the end, an
optional usage chunk with `choices: []` when `stream_options.include_usage`, then `[DONE]`. Chat
streams open with a role chunk and close with an empty-delta chunk that carries finish_reason.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from tuner.sim import tokens
from tuner.sim.httpapi import (
    SSE_HEADERS,
    BadRequest,
    _error,
    _ids_from,
    _json,
    _srv,
    _sse,
    _start,
    _updates,
)

#: OpenAI's default for /v1/completions; chat without max_tokens gets SGLang's sampling default
COMPLETIONS_MAX_TOKENS = 16
CHAT_MAX_TOKENS = 128


def _finish(reason: dict | None) -> str | None:
    if reason is None:
        return None
    return {"length": "length", "stop": "stop"}.get(reason.get("type", ""), "abort")


def _usage(st: Any, cache_report: bool) -> dict[str, Any]:
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


async def _run(request: web.Request, chat: bool) -> web.StreamResponse:
    srv = _srv(request)
    try:
        body = await _json(request)
        if body.get("n", 1) != 1:
            raise BadRequest("n > 1 is not simulated.")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages: expected a non-empty list.")
            ids = tokens.chat_prompt_ids(messages)
            max_new = _max_tokens(body, CHAT_MAX_TOKENS)
        else:
            ids = _ids_from(body.get("prompt"))
            max_new = _max_tokens(body, COMPLETIONS_MAX_TOKENS)
    except BadRequest as exc:
        return _error(str(exc), 400, True)
    st = await _start(
        request, ids, max_new, bool(body.get("ignore_eos", False)), body.get("rid"), True
    )
    if isinstance(st, web.Response):
        return st
    model = body.get("model") or srv.served_model_name
    created = int(time.time())
    cache_report = srv.ns.enable_cache_report
    try:
        if not body.get("stream"):
            await srv.wait_finished(st)
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": _finish(st.finish_reason),
            }
            if chat:
                choice["message"] = {
                    "role": "assistant",
                    "content": st.text(),
                    "reasoning_content": None,
                    "tool_calls": None,
                }
            else:
                choice["text"] = st.text()
            obj = "chat.completion" if chat else "text_completion"
            return web.json_response({
                "id": st.rid, "object": obj, "created": created, "model": model,
                "choices": [choice], "usage": _usage(st, cache_report),
            })  # fmt: skip
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(payload: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": st.rid, "object": obj, "created": created, "model": model,
                "choices": [{"index": 0, **payload, "logprobs": None, "finish_reason": finish}],
                "usage": None,
            }  # fmt: skip

        if chat:
            await _sse(resp, chunk({"delta": {"role": "assistant", "content": ""}}))
        async for sent in _updates(srv, st):
            delta = st.text(sent)
            finish = _finish(st.finish_reason) if st.finished else None
            if chat:
                if delta:
                    await _sse(resp, chunk({"delta": {"content": delta}}))
                if finish is not None:
                    await _sse(resp, chunk({"delta": {}}, finish))
            elif delta or finish is not None:
                await _sse(resp, chunk({"text": delta}, finish))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            usage = {
                "id": st.rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(st, cache_report),
            }
            await _sse(resp, usage)
        await _sse(resp, "[DONE]")
        return resp
    finally:
        srv.release(st)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _run(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _run(request, chat=True)
