"""The rest of SGLang's HTTP routes for the version played: probes, tokenizer, abort, and the
operations the simulator does not model (weights, profiling, LoRA, sessions, ...).

The route lists are SGLang's `entrypoints/http_server.py` decorators (0.5.6.post2 and 0.5.23).
Routes that concern serving answer as SGLang does (status codes and JSON shapes); the others
answer 400 with SGLang's native error shape and a message that says they are not simulated, so a
tool that calls them learns it at once instead of meeting a 404 that no SGLang sends.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from tuner.sim import tokens
from tuner.sim.http import oaishapes
from tuner.sim.http.common import BadRequest, backend, error_response, read_json, version_of

#: http_server.py routes of 0.5.6.post2 ("METHODS path", one a line) that httpapi.py does not serve
ROUTES_0_5_6 = """
GET /get_weight_version
GET /weight_version
GET /get_load
POST,PUT /set_internal_state
POST /generate_from_file
POST,PUT /encode
POST,PUT /classify
GET,POST /clear_hicache_storage_backend
GET,POST /start_profile
GET,POST /stop_profile
GET,POST /freeze_gc
GET,POST /start_expert_distribution_record
GET,POST /stop_expert_distribution_record
GET,POST /dump_expert_distribution_record
POST /update_weights_from_disk
POST /init_weights_send_group_for_remote_instance
POST /send_weights_to_remote_instance
POST /init_weights_update_group
POST /destroy_weights_update_group
POST /update_weights_from_tensor
POST /update_weights_from_distributed
POST /update_weights_from_ipc
POST /update_weight_version
GET,POST /get_weights_by_name
GET,POST /release_memory_occupation
GET,POST /resume_memory_occupation
POST /weights_checker
GET,POST /slow_down
POST /load_lora_adapter
POST /unload_lora_adapter
GET,POST /open_session
GET,POST /close_session
GET,POST /configure_logging
POST /abort_request
POST /parse_function_call
POST /separate_reasoning
POST /pause_generation
POST /continue_generation
POST /v1/embeddings
POST /v1/classify
POST /v1/tokenize
POST /tokenize
POST /v1/detokenize
POST /detokenize
GET /v1/models/{model:.*}
POST /v1/score
POST /v1/responses
GET /v1/responses/{response_id}
POST /v1/responses/{response_id}/cancel
POST,PUT /v1/rerank
GET /ping
POST /invocations
POST /vertex_generate
"""

#: the same for 0.5.23
ROUTES_0_5_23 = """
GET /ready
POST,PUT /set_internal_state
POST /dumper/{method}
POST,PUT /encode
POST,PUT /classify
POST /add_external_corpus
POST /remove_external_corpus
GET /list_external_corpora
POST /hicache/storage-backend/clear
GET,PUT,DELETE /hicache/storage-backend
GET /get_hicache_l3_cache_layout
GET,POST /start_profile
GET,POST /stop_profile
GET,POST /set_trace_level
GET,POST /freeze_gc
GET,POST /start_expert_distribution_record
GET,POST /stop_expert_distribution_record
GET,POST /dump_expert_distribution_record
POST /update_weights_from_disk
POST /init_weights_send_group_for_remote_instance
POST /send_weights_to_remote_instance
GET /get_remote_instance_transfer_engine_info
GET /remote_instance_transfer_engine_info
POST /init_weights_update_group
POST /destroy_weights_update_group
POST /update_weights_from_tensor
POST /begin_weight_update
POST /end_weight_update
POST /update_weights_from_distributed
POST /update_weights_from_ipc
POST /update_weight_version
GET,POST /get_weights_by_name
GET,POST /release_memory_occupation
GET,POST /resume_memory_occupation
GET,POST /weights_checker
GET,POST /slow_down
POST /pd_role_switch
POST /load_lora_adapter
POST /load_lora_adapter_from_tensors
POST /unload_lora_adapter
GET,POST /open_session
GET,POST /close_session
GET,POST /configure_logging
POST /abort_request
POST /parse_function_call
POST /separate_reasoning
POST /pause_generation
POST /continue_generation
POST /v1/embeddings
POST /v1/classify
POST /v1/tokenize
POST /tokenize
POST /v1/detokenize
POST /detokenize
POST /v1/audio/transcriptions
GET /v1/models/{model:.*}
POST /v1/score
POST /v1/decisions
POST /v1/responses
GET /v1/responses/{response_id}
POST /v1/responses/{response_id}/cancel
POST,PUT /v1/rerank
GET /
POST /api/chat
POST /api/generate
GET /api/tags
POST /api/show
POST /v1/messages
POST /v1/messages/count_tokens
POST /v1/systemone
GET /ping
POST /invocations
POST /vertex_generate
"""


def routes_for(version: str) -> list[tuple[tuple[str, ...], str]]:
    """(methods, path) of the extra routes of a version."""
    table = ROUTES_0_5_23 if oaishapes.newer(version) else ROUTES_0_5_6
    out = []
    for line in table.split("\n"):
        if line.strip():
            methods, path = line.split()
            out.append((tuple(methods.split(",")), path))
    return out


def _up(request: web.Request) -> bool:
    """SGLang's is_healthy(): start-up done, not shutting down."""
    return backend(request).state == "ready"


async def ready(request: web.Request) -> web.Response:
    """GET /ready (0.5.23): 200 when healthy and not paused."""
    srv = backend(request)
    ok = _up(request) and not getattr(srv, "paused", False)
    return web.Response(status=200 if ok else 503)


async def ping(request: web.Request) -> web.Response:
    """GET /ping (SageMaker): always 200 in 0.5.6.post2; is_healthy() in 0.5.23."""
    if not oaishapes.newer(version_of(backend(request))):
        return web.Response(status=200)
    return web.Response(status=200 if _up(request) else 503)


async def tokenize(request: web.Request) -> web.Response:
    """POST /tokenize, /v1/tokenize: {"tokens", "count", "max_model_len"}."""
    srv = backend(request)
    try:
        body = await read_json(request)
        prompt = body.get("prompt")
        if prompt is None and body.get("messages") is not None:
            ids: Any = tokens.chat_prompt_ids(body["messages"])
            count: Any = len(ids)
        elif isinstance(prompt, str):
            ids = tokens.encode(prompt)
            count = len(ids)
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            ids = [tokens.encode(p) for p in prompt]
            count = [len(i) for i in ids]
        else:
            raise BadRequest(f"Invalid prompt type: {type(prompt)}. Expected str or List[str].")
    except BadRequest as exc:
        return error_response(str(exc), 400, True)
    ctx = srv.script.defaults.context_len
    return web.json_response({"tokens": ids, "count": count, "max_model_len": ctx})


async def detokenize(request: web.Request) -> web.Response:
    """POST /detokenize, /v1/detokenize: {"text"} (a list for a list of lists)."""
    try:
        body = await read_json(request)
        ids = body.get("tokens")
        if not isinstance(ids, list):
            raise BadRequest(
                f"Invalid tokens type: {type(ids)}. Expected List[int] or List[List[int]]."
            )
        if ids and all(isinstance(x, list) for x in ids):
            if not all(isinstance(t, int) for x in ids for t in x):
                raise BadRequest("Invalid input: Sublist in 'tokens' must contain only integers.")
            text: Any = [tokens.decode(x) for x in ids]
        elif all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            text = tokens.decode(ids)
        else:
            raise BadRequest("Invalid input: 'tokens' must be a list of integers.")
    except BadRequest as exc:
        return error_response(str(exc), 400, True)
    return web.json_response({"text": text})


async def abort_request(request: web.Request) -> web.Response:
    """POST /abort_request {"rid": ..., "abort_all": false}: 200, empty."""
    srv = backend(request)
    try:
        body = await read_json(request)
    except BadRequest as exc:
        return web.json_response({"error": {"message": str(exc)}}, status=400)
    rid = body.get("rid") or ""
    rids = list(srv.requests) if body.get("abort_all") else [rid] if rid else []
    if not rids and not body.get("abort_all"):
        srv.log("Ignore abort_request with empty rid and abort_all=False")
    for r in rids:
        srv.abort(r)
    return web.Response(status=200)


async def weight_version(request: web.Request) -> web.Response:
    """GET /weight_version (and the deprecated /get_weight_version)."""
    return web.json_response({"weight_version": oaishapes.WEIGHT_VERSION})


async def get_load(request: web.Request) -> web.Response:
    """GET /get_load (0.5.6.post2): one entry per DP rank."""
    srv = backend(request)
    stats = srv.engine.stats() if srv.engine is not None else None
    running = getattr(stats, "num_running_reqs", 0)
    waiting = getattr(stats, "num_queue_reqs", 0)
    used = getattr(stats, "num_used_tokens", 0)
    load = {"dp_rank": None, "num_reqs": running + waiting, "num_waiting_reqs": waiting}
    return web.json_response([{**load, "num_tokens": used}])


async def model_card(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: the card, or OpenAI's 404 for another name."""
    srv = backend(request)
    model = request.match_info["model"]
    if model != srv.served_model_name:
        error = {
            "message": f"The model '{model}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        return web.json_response({"error": error}, status=404)
    ctx = srv.script.defaults.context_len
    card = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "sglang"}
    return web.json_response({**card, "root": model, "parent": None, "max_model_len": ctx})


def _pause(paused: bool, message: str):
    async def handler(request: web.Request) -> web.Response:
        backend(request).paused = paused  # only /ready reads it: the engine keeps running
        return web.json_response({"message": message, "status": "ok"})

    return handler


async def root(request: web.Request) -> web.Response:
    """GET / (0.5.23): a JSON string."""
    return web.json_response("SGLang is running")


def _text(body: str):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body)

    return handler


async def not_simulated(request: web.Request) -> web.Response:
    """A route SGLang serves whose operation the simulator does not model."""
    message = (
        f"{request.method} {request.path} is not simulated: tuner sim plays SGLang's serving "
        "API, not its weight, profiling, LoRA, session or admin operations."
    )
    return web.json_response({"error": {"message": message}}, status=400)


HANDLERS = {
    "/ready": ready,
    "/ping": ping,
    "/tokenize": tokenize,
    "/v1/tokenize": tokenize,
    "/detokenize": detokenize,
    "/v1/detokenize": detokenize,
    "/abort_request": abort_request,
    "/weight_version": weight_version,
    "/get_weight_version": weight_version,
    "/get_load": get_load,
    "/v1/models/{model:.*}": model_card,
    "/pause_generation": _pause(True, "Generation paused successfully."),
    "/continue_generation": _pause(False, "Generation continued successfully."),
    "/": root,
    # SGLang's plain-text answers (http_server.py): harmless to acknowledge
    "/start_profile": _text("Start profiling.\n"),
    "/stop_profile": _text("Stop profiling. This will take some time.\n"),
    "/freeze_gc": _text("Garbage collection frozen.\n"),
    "/configure_logging": _text(""),
}


def add_extra_routes(app: web.Application, version: str) -> None:
    """Register the version's routes that httpapi.add_routes does not."""
    for methods, path in routes_for(version):
        handler = HANDLERS.get(path, not_simulated)
        for method in methods:
            app.router.add_route(method, path, handler)
