"""SGLang's HTTP endpoints for the simulator, same paths and JSON shapes (reference section 4).

Handlers only translate HTTP <-> `SimBackend` calls (submit, wait, release); all state lives in
the server object `add_routes` registers (realtime.SimServer). The OpenAI endpoints are in
openai_api.py, what both share in httpcommon.py.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from aiohttp import web

from tuner.sim import tokens
from tuner.sim.http import promtext
from tuner.sim.http.common import (
    BACKEND_KEY,
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
    version_of,
)
from tuner.sim.http.oaishapes import WEIGHT_VERSION, newer
from tuner.sim.http.openai_api import chat_completions, completions
from tuner.sim.http.reqstate import ReqState
from tuner.sim.http.routes import add_extra_routes
from tuner.sim.startup import engine_startup_time

FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


#: old endpoint names SGLang still serves, with a warning naming the new one
DEPRECATED = {"/get_server_info": "/server_info", "/get_model_info": "/model_info"}


def _meta(st: ReqState, version: str) -> dict[str, Any]:
    """SGLang's meta_info (tokenizer_manager.py): e2e_latency only once the request finished.

    0.5.23 renames total_retractions to num_retractions, adds reasoning_tokens and, once some
    tokens were cached, their breakdown by source (the simulator's hits are all on device).
    """
    new = newer(version)
    meta: dict[str, Any] = {
        "id": st.rid,
        "finish_reason": st.reason(),
        "prompt_tokens": st.prompt_tokens,
        "weight_version": WEIGHT_VERSION,
        "num_retractions" if new else "total_retractions": 0,
    }
    if new:
        meta["reasoning_tokens"] = 0
    meta["completion_tokens"] = st.completion_tokens
    meta["cached_tokens"] = st.cached_tokens
    if new and st.cached_tokens > 0:
        meta["cached_tokens_details"] = {"device": st.cached_tokens, "host": 0}
    if st.finished:
        meta["e2e_latency"] = (st.finished_at or st.created) - st.created
    return meta


async def generate(request: web.Request) -> web.StreamResponse:
    """POST /generate: `text` or `input_ids`; cumulative text when streaming."""
    srv = backend(request)
    try:
        body = await read_json(request)
        sp = body.get("sampling_params") or {}
        raw = body["input_ids"] if "input_ids" in body else body.get("text")
        if raw is None:
            raise BadRequest("Either text or input_ids should be provided.")
        ids = ids_from(raw)
        max_new = sp.get("max_new_tokens", 128)
        stop = sp.get("stop") or ()
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list | tuple) or not all(isinstance(x, str) for x in stop):
            raise BadRequest("stop must be a string or a list of strings.")
    except BadRequest as exc:
        return error_response(str(exc), 400, False)
    stream = bool(body.get("stream"))
    ignore_eos = bool(sp.get("ignore_eos", False))
    st = await start_request(
        request, ids, max_new, ignore_eos, body.get("rid"), False, stop, stream
    )
    if isinstance(st, web.StreamResponse):
        return st
    st.stream = bool(body.get("stream"))
    version = version_of(srv)
    loop_time = request.app["loop_time"]
    try:
        if not body.get("stream"):
            try:
                await srv.wait_finished(st)
            except asyncio.CancelledError:
                if srv.state not in ("loaded", "ready"):  # the server is going down, not the client
                    raise
                kind = 3 if st.first_token_at is not None else 1  # the client left: SGLang logs it
                srv.log(
                    "[http_server] Error: Request is disconnected from the client side "
                    f"(type {kind}). Abort request obj.rid={st.rid!r}"
                )
                raise
            return web.json_response(
                {
                    "text": st.text(),
                    "output_ids": list(st.output_ids()),
                    "meta_info": _meta(st, version),
                }
            )
        cut = srv.faults.cut_after(loop_time(), srv.log)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        try:
            async for _ in updates(srv, st, cut):
                chunk = {
                    "text": st.text(),
                    "output_ids": list(st.output_ids()),
                    "meta_info": _meta(st, version),
                }
                await send_sse(resp, chunk)
            await send_sse(resp, "[DONE]")
        except StreamCut:  # a cut-stream fault, or the client left (ClientGone)
            return cut_connection(request, resp)
        return resp
    finally:
        srv.release(st)


async def health(request: web.Request) -> web.Response:
    """GET /health: 200 once ready, 503 while starting or draining (or flapping, a fault)."""
    srv = backend(request)
    ok = srv.state == "ready" and not srv.faults.health_fails(now(request), srv.log)
    return web.Response(status=200 if ok else 503)


async def health_generate(request: web.Request) -> web.Response:
    """GET /health_generate: a one-token generation must come back within 20 s."""
    srv = backend(request)
    if srv.state != "ready" or srv.faults.health_fails(now(request), srv.log):
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
    """GET /get_server_info and /server_info: resolved args, capacity, version, internal state.

    0.5.6.post2 (http_server.py:544-561): the ServerArgs fields, the scheduler's info, then
    `internal_states` and `version`. 0.5.23 (http_server.py:863-893, build_server_info in
    utils/common.py:3584-3593) adds `launch_command` after the fields, the engine's
    `startup_time` after the scheduler's info and `frontend` last, and redacts the watermark's
    secrets in the whole answer. The simulator adds its own `simulator` key.
    """
    srv = backend(request)
    plan = srv.plan
    assert plan is not None
    version = version_of(srv)
    new = newer(version)
    info = srv.server_args()
    if new:
        info["launch_command"] = launch_command(srv.ns)
    info.update(
        status="ready" if srv.state == "ready" else "starting",
        max_total_num_tokens=plan.max_total_num_tokens,
        max_req_input_len=plan.max_req_input_len,
    )
    if new:  # the tokenizer manager's, set once the schedulers are ready
        info["startup_time"] = engine_startup_time(srv.ns, srv.profile, srv.script)
    info["internal_states"] = [_state(srv, stats) for stats in group_stats(srv)]
    info["version"] = version  # the version played, which the tuner records
    if new:
        info["frontend"] = "python"
        info = redact_watermark_secrets(info)
    info["simulator"] = {
        "profile": srv.profile.name,
        "seed": srv.ns.sim_seed,
        "gpu": srv.profile.gpu_name,
    }
    return web.json_response(info)


REDACTED = "<redacted>"
#: the flags whose values `launch_command` hides: 0.5.23's own `--watermark-config`
#: (sampling/watermarking/core.py:110-134) and, where SGLang shows them as given, the keys
#: and password a reader of /server_info must not learn from it
SECRET_FLAGS = ("--watermark-config", "--api-key", "--admin-api-key", "--ssl-keyfile-password")
#: the keys 0.5.23's redact_watermark_secrets replaces wherever they appear (core.py:25-27)
WATERMARK_SECRET_KEYS = frozenset({"watermark_key", "watermark_key_b", "watermark_config"})


def launch_command(ns: argparse.Namespace) -> str:
    """0.5.23's `launch_command`: the argv the launcher parsed (a `--config` file's flags merged
    in, server_args.py:668-719) joined by spaces, with redact_watermark_command_line's rule
    (core.py:110-134) applied to every secret flag: the value after the flag, `--flag=value`,
    and any argument equal to a secret's parsed value (an abbreviated flag's)."""
    values = {getattr(ns, f[2:].replace("-", "_"), None) for f in SECRET_FLAGS} - {None}
    out: list[str] = []
    redact_next = False
    for arg in getattr(ns, "launch_argv", ()):
        name, eq, value = arg.partition("=")
        if redact_next:
            out.append(REDACTED)
            redact_next = False
        elif arg in values:
            out.append(REDACTED)
        elif eq and (value in values or name in SECRET_FLAGS):
            out.append(f"{name}={REDACTED}")
        else:
            out.append(arg)
            redact_next = arg in SECRET_FLAGS
    return " ".join(out)


def redact_watermark_secrets(value: Any, in_watermark_config: bool = False) -> Any:
    """0.5.23's redact_watermark_secrets on plain data (core.py:79-104): a secret key's value
    becomes "<redacted>" whatever it is (None too), as do `key`/`key_b` under `watermark`."""
    if isinstance(value, dict):
        return {
            k: REDACTED
            if k in WATERMARK_SECRET_KEYS or (in_watermark_config and k in ("key", "key_b"))
            else redact_watermark_secrets(v, in_watermark_config or k == "watermark")
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_watermark_secrets(v, in_watermark_config) for v in value]
    return value


def group_stats(srv: SimBackend) -> list[Any]:
    """Each scheduler's stats: one, or one per DP attention group (None before the engine)."""
    engine = srv.engine
    if engine is None:
        return [None] * (srv.plan.dp_groups if srv.plan is not None else 1)
    if hasattr(engine, "group_stats"):
        return engine.group_stats()
    return [engine.stats()]


def _state(srv: SimBackend, stats: Any) -> dict[str, Any]:
    """One scheduler's `internal_states` entry; under DP attention every group has one, as the
    tokenizer manager gathers them from each DP rank (0.5.6.post2 managers/scheduler.py:
    2273-2298; `avg_spec_accept_length` once a decode log line counted accepted tokens)."""
    plan = srv.plan
    assert plan is not None
    state: dict[str, Any] = {
        "max_total_num_tokens": plan.max_total_num_tokens,
        "max_running_requests": plan.max_running_requests,
        "context_len": srv.script.defaults.context_len,
        "last_gen_throughput": float(getattr(stats, "gen_throughput", 0.0) or 0.0),
        "memory_usage": {
            "weight": round(plan.weights_gib, 2),
            "kvcache": round(plan.kv_gib, 2),
            "token_capacity": plan.max_total_num_tokens,
            "graph": round(plan.graph_gib, 2),
        },
        "hicache_host_tokens": srv.script.hicache.host_tokens if srv.script.hicache else 0,
    }
    avg = getattr(stats, "avg_spec_accept_length", None)
    if avg is not None:
        state["avg_spec_accept_length"] = avg
    return state


async def model_info(request: web.Request) -> web.Response:
    """GET /get_model_info and /model_info."""
    srv = backend(request)
    ns = srv.ns
    info: dict[str, Any] = {"model_path": ns.model_path}
    if newer(version_of(srv)):  # 0.5.23 adds the served name after the path
        info["served_model_name"] = srv.served_model_name
    info.update(
        tokenizer_path=ns.tokenizer_path or ns.model_path,
        is_generation=True,
        preferred_sampling_params=getattr(ns, "preferred_sampling_params", None),
        weight_version=WEIGHT_VERSION,
    )
    if newer(version_of(srv)):  # and the serving config a router reads
        info.update(
            load_format=getattr(ns, "load_format", "auto"),
            reasoning_parser=getattr(ns, "reasoning_parser", None),
            tool_call_parser=getattr(ns, "tool_call_parser", None),
            disaggregation_mode=getattr(ns, "disaggregation_mode", "null"),
        )
    info.update(
        has_image_understanding=False,
        has_audio_understanding=False,
        model_type=srv.profile.model_config.get("model_type"),
        architectures=srv.profile.model_config.get("architectures"),
    )
    return web.json_response(info)


async def models(request: web.Request) -> web.Response:
    """GET /v1/models."""
    srv = backend(request)
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
    srv = backend(request)
    ok = srv.engine is not None and srv.engine.flush_cache()
    if ok:  # PyTorch's cache emptied: nvidia-smi reads less (sim/gpustate.py)
        srv.note_gpu()
    return web.Response(text=FLUSH_TEXT, status=200 if ok else 400)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics (only with --enable-metrics), Prometheus text."""
    srv = backend(request)
    if not srv.ns.enable_metrics:
        return web.Response(status=404, text="404: Not Found")
    stats = srv.engine.stats() if srv.engine is not None else None
    cache_type = "HiRadixCache" if srv.ns.enable_hierarchical_cache else "RadixCache"
    version = version_of(srv)
    groups = srv.engine.group_stats() if hasattr(srv.engine, "group_stats") else ()
    attn_tp = max(1, srv.ns.tp_size // max(srv.plan.dp_groups if srv.plan else 1, 1))
    body = promtext.render(
        stats, srv.hist, srv.served_model_name, version, cache_type, groups, attn_tp
    )
    return web.Response(text=body, content_type="text/plain", charset="utf-8")


def add_routes(app: web.Application, srv: SimBackend) -> None:
    """Register every endpoint on `app` for `srv`."""
    app[BACKEND_KEY] = srv
    app["loop_time"] = asyncio.get_running_loop().time
    ready_only = {
        "/get_server_info": server_info,
        "/server_info": server_info,
        "/get_model_info": model_info,
        "/model_info": model_info,
        "/v1/models": models,
        "/metrics": metrics,
    }

    def gated(handler, path: str = ""):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            if path in DEPRECATED:  # SGLang's http_server.py warns on every call of the old names
                srv.log(
                    f"Endpoint '{path}' is deprecated and will be removed in a future version. "
                    f"Please use '{DEPRECATED[path]}' instead."
                )
            if srv.state == "starting":
                return web.Response(status=503, text="The server is starting.")
            return await handler(request)

        return wrapped

    for path, handler in ready_only.items():
        app.router.add_get(path, gated(handler, path))
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_post("/generate", generate)
    app.router.add_put("/generate", generate)
    app.router.add_route("*", "/flush_cache", gated(flush_cache))
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    add_extra_routes(app, version_of(srv))
