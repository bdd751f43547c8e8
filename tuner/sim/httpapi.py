"""SGLang's HTTP endpoints for the simulator, same paths and JSON shapes (reference section 4).

Handlers only translate HTTP <-> `SimServer` calls (submit, wait, release); all state lives in
the server object registered as `app["srv"]`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tuner.sim import promtext, tokens

if TYPE_CHECKING:
    from tuner.sim.realtime import ReqState, SimServer

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class BadRequest(Exception):
    """A request SGLang would refuse with 400 (the message is SGLang's)."""


def _srv(request: web.Request) -> SimServer:
    return request.app["srv"]


def _error(message: str, status: int, openai: bool) -> web.Response:
    if openai:
        body = {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": status,
        }
        if status == 503:
            body["type"] = "ServiceUnavailableError"
        return web.json_response(body, status=status)
    return web.json_response({"error": {"message": message}}, status=status)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("Invalid JSON body.") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def _check_input(srv: SimServer, ids: list[int], max_new: int) -> None:
    """SGLang's tokenizer-manager checks on one request (context length, token budget)."""
    ctx = srv.script.defaults.context_len
    if not ids:
        raise BadRequest("The input is empty.")
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise BadRequest(f"max_new_tokens must be a non-negative integer, got {max_new!r}.")
    if len(ids) >= ctx:
        raise BadRequest(
            f"The input ({len(ids)} tokens) is longer than the model's context length ({ctx} tokens)."
        )
    if len(ids) + max_new >= ctx:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {len(ids) + max_new} tokens: {len(ids)} tokens from the "
            f"input messages and {max_new} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit."
        )
    limit = srv.plan.max_req_input_len if srv.plan else ctx
    if len(ids) > limit:
        raise BadRequest(
            f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({limit} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )


def _ids_from(value: Any) -> list[int]:
    if isinstance(value, str):
        return tokens.encode(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        return _ids_from(value[0])
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return list(value)
    raise BadRequest(
        "Expected one prompt: a string or a list of token ids (batches are not simulated)."
    )


async def _start(
    request: web.Request,
    ids: list[int],
    max_new: int,
    ignore_eos: bool,
    rid: str | None,
    openai: bool,
):
    """Admission: readiness, queue limit, input checks; a ReqState or an error response."""
    srv = _srv(request)
    if srv.state not in ("loaded", "ready") or srv.engine is None:
        return _error(
            "The server is not ready."
            if srv.state == "starting"
            else "The server is shutting down.",
            503,
            openai,
        )
    try:
        _check_input(srv, ids, max_new)
    except BadRequest as exc:
        return _error(str(exc), 400, openai)
    limit = srv.ns.max_queued_requests
    if limit is not None and srv.engine.stats().num_queue_reqs >= limit:
        return _error("The request queue is full.", 503, openai)
    if rid is not None and rid in srv.requests:
        return _error(f"Duplicate request id: {rid}", 400, openai)
    from tuner.sim.engine import QueueFull

    try:
        return srv.submit(ids, max_new, ignore_eos, rid)
    except QueueFull:
        return _error("The request queue is full.", 503, openai)


async def _updates(srv: SimServer, st: ReqState):
    """Yield each time there is something to send: new tokens (>= stream_interval) or the end.

    Waiting on the request's event means that tokens delivered while the client was slow are
    sent together, in one chunk: SGLang's coalescing under load.
    """
    sent = 0
    interval = max(1, srv.ns.stream_interval)
    while True:
        await st.event.wait()
        st.event.clear()
        if st.finished or st.completion_tokens - sent >= interval:
            yield sent
            sent = st.completion_tokens
        if st.finished:
            return


async def _sse(resp: web.StreamResponse, payload: Any) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    await resp.write(f"data: {data}\n\n".encode())


# --- native API ---------------------------------------------------------------------------------


def _meta(st: ReqState, now: float) -> dict[str, Any]:
    return {
        "id": st.rid,
        "finish_reason": st.finish_reason,
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        "cached_tokens": st.cached_tokens,
        "e2e_latency": (st.finished_at or now) - st.created,
    }


async def generate(request: web.Request) -> web.StreamResponse:
    """POST /generate: `text` or `input_ids`; cumulative text when streaming."""
    srv = _srv(request)
    try:
        body = await _json(request)
        sp = body.get("sampling_params") or {}
        raw = body["input_ids"] if "input_ids" in body else body.get("text")
        if raw is None:
            raise BadRequest("Either text or input_ids should be provided.")
        ids = _ids_from(raw)
        max_new = sp.get("max_new_tokens", 128)
    except BadRequest as exc:
        return _error(str(exc), 400, False)
    st = await _start(
        request, ids, max_new, bool(sp.get("ignore_eos", False)), body.get("rid"), False
    )
    if isinstance(st, web.Response):
        return st
    loop_time = request.app["loop_time"]
    try:
        if not body.get("stream"):
            await srv.wait_finished(st)
            return web.json_response(
                {
                    "text": st.text(),
                    "output_ids": list(st.output_ids()),
                    "meta_info": _meta(st, loop_time()),
                }
            )
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        async for _ in _updates(srv, st):
            chunk = {
                "text": st.text(),
                "output_ids": list(st.output_ids()),
                "meta_info": _meta(st, loop_time()),
            }
            await _sse(resp, chunk)
        await _sse(resp, "[DONE]")
        return resp
    finally:
        srv.release(st)


async def health(request: web.Request) -> web.Response:
    """GET /health: 200 once ready, 503 while starting or draining."""
    return web.Response(status=200 if _srv(request).state == "ready" else 503)


async def health_generate(request: web.Request) -> web.Response:
    """GET /health_generate: a one-token generation must come back within 20 s."""
    srv = _srv(request)
    if srv.state != "ready":
        return web.Response(status=503)
    st = srv.submit(tokens.encode("health check"), 1, True)
    try:
        await asyncio.wait_for(srv.wait_finished(st), 20.0)
    except TimeoutError:
        return web.Response(status=503)
    finally:
        srv.release(st)
    return web.Response(status=200)


async def server_info(request: web.Request) -> web.Response:
    """GET /get_server_info and /server_info: resolved args, capacity, version, internal state."""
    srv = _srv(request)
    plan = srv.plan
    assert plan is not None
    stats = srv.engine.stats() if srv.engine is not None else None
    gen = float(getattr(stats, "gen_throughput", 0.0) or 0.0)
    info = {
        **srv.server_args(),
        "status": "ready" if srv.state == "ready" else "starting",
        "max_total_num_tokens": plan.max_total_num_tokens,
        "max_req_input_len": plan.max_req_input_len,
        "version": srv.profile.version,
        "internal_states": [
            {
                "max_total_num_tokens": plan.max_total_num_tokens,
                "max_running_requests": plan.max_running_requests,
                "context_len": srv.script.defaults.context_len,
                "last_gen_throughput": gen,
                "memory_usage": {
                    "weight": round(plan.weights_gib, 2),
                    "kvcache": round(plan.kv_gib, 2),
                    "token_capacity": plan.max_total_num_tokens,
                    "graph": round(plan.graph_gib, 2),
                },
                "hicache_host_tokens": srv.script.hicache.host_tokens if srv.script.hicache else 0,
            }
        ],
        "simulator": {
            "profile": srv.profile.name,
            "seed": srv.ns.sim_seed,
            "gpu": srv.profile.gpu_name,
        },
    }
    return web.json_response(info)


async def model_info(request: web.Request) -> web.Response:
    """GET /get_model_info and /model_info."""
    srv = _srv(request)
    return web.json_response({
        "model_path": srv.ns.model_path,
        "tokenizer_path": srv.ns.tokenizer_path or srv.ns.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": srv.profile.model_config.get("model_type"),
        "architectures": srv.profile.model_config.get("architectures"),
    })  # fmt: skip


async def models(request: web.Request) -> web.Response:
    """GET /v1/models."""
    srv = _srv(request)
    card = {
        "id": srv.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": srv.served_model_name,
        "parent": None,
        "max_model_len": srv.script.defaults.context_len,
    }
    return web.json_response({"object": "list", "data": [card]})


async def flush_cache(request: web.Request) -> web.Response:
    """POST /flush_cache: refused (400) while requests are pending."""
    srv = _srv(request)
    ok = srv.engine is not None and srv.engine.flush_cache()
    return web.Response(text=FLUSH_TEXT, status=200 if ok else 400)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics (only with --enable-metrics), Prometheus text."""
    srv = _srv(request)
    if not srv.ns.enable_metrics:
        return web.Response(status=404, text="404: Not Found")
    stats = srv.engine.stats() if srv.engine is not None else None
    body = promtext.render(stats, srv.hist, srv.served_model_name)
    return web.Response(text=body, content_type="text/plain", charset="utf-8")


def add_routes(app: web.Application, srv: SimServer) -> None:
    """Register every endpoint on `app` for `srv`."""
    from tuner.sim.openai_api import chat_completions, completions

    app["srv"] = srv
    app["loop_time"] = asyncio.get_running_loop().time
    ready_only = {
        "/get_server_info": server_info, "/server_info": server_info,
        "/get_model_info": model_info, "/model_info": model_info, "/v1/models": models,
        "/metrics": metrics,
    }  # fmt: skip

    def gated(handler):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            if srv.state == "starting":
                return web.Response(status=503, text="The server is starting.")
            return await handler(request)

        return wrapped

    for path, handler in ready_only.items():
        app.router.add_get(path, gated(handler))
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_post("/generate", generate)
    app.router.add_route("*", "/flush_cache", gated(flush_cache))
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
