"""What SGLang's native and OpenAI endpoints share: request parsing and checks, admission, error
bodies, streaming, and `SimBackend`, the server as the handlers see it.

The handlers (httpapi.py, openai_api.py) reach the server only through `SimBackend`, which
realtime.SimServer satisfies, so the HTTP layer never imports the server that mounts it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web

from tuner.sglang.flags import DEFAULT_VERSION
from tuner.sim import tokens
from tuner.sim.engine import DPEngine, Engine, QueueFull
from tuner.sim.faults import Faults
from tuner.sim.faultspec import PREFIX
from tuner.sim.http.oaishapes import newer
from tuner.sim.http.promtext import Histograms
from tuner.sim.http.reqstate import ReqState
from tuner.sim.profile import Profile
from tuner.sim.startup import MemoryPlan, Script

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
#: the key of the `SimBackend` in the aiohttp application
BACKEND_KEY = "srv"


class SimBackend(Protocol):
    """The simulated server as the HTTP handlers use it (realtime.SimServer)."""

    ns: argparse.Namespace
    profile: Profile
    script: Script
    plan: MemoryPlan | None
    engine: Engine | DPEngine | None
    state: str  # starting -> loaded -> ready -> draining
    requests: Mapping[str, ReqState]
    hist: Histograms
    served_model_name: str
    faults: Faults
    log: Callable[[str], None]
    paused: bool  # /pause_generation: /ready answers 503

    def abort(self, rid: str) -> None: ...

    def note_gpu(self) -> None: ...

    def server_args(self) -> dict[str, Any]: ...

    def submit(
        self,
        input_ids: list[int],
        max_new_tokens: int,
        ignore_eos: bool,
        rid: str | None = None,
        stop: Sequence[str] = (),
    ) -> ReqState: ...

    async def wait_finished(self, st: ReqState) -> None: ...

    def release(self, st: ReqState) -> None: ...


class BadRequest(Exception):
    """A request SGLang would refuse with 400 (the message is SGLang's)."""


class StreamCut(Exception):
    """An injected cut-stream fault: the handler closes the connection mid-body."""


class ClientGone(StreamCut):
    """The client closed the connection mid-stream: stop writing, quietly (SGLang logs nothing)."""


def now(request: web.Request) -> float:
    """The event loop's clock, which the engine loop and the faults use too."""
    return request.app["loop_time"]()


def cut_connection(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
    """Close the connection after what was already written: no final chunk, no [DONE]."""
    if request.transport is not None:
        request.transport.close()  # aiohttp's write_eof then meets a closed transport, and stops
    return resp


def backend(request: web.Request) -> SimBackend:
    """The server behind this request's application."""
    return request.app[BACKEND_KEY]


def error_response(message: str, status: int, openai: bool) -> web.Response:
    """An error in the native (`{"error": ...}`) or the OpenAI shape."""
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


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or BadRequest."""
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("Invalid JSON body.") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def ids_from(value: Any) -> list[int]:
    """Token ids of one prompt given as text or as ids (a batch of one is unwrapped)."""
    if isinstance(value, str):
        return tokens.encode(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        return ids_from(value[0])
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return list(value)
    raise BadRequest(
        "Expected one prompt: a string or a list of token ids (batches are not simulated)."
    )


def check_input(srv: SimBackend, ids: list[int], max_new: int) -> None:
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


def version_of(srv: SimBackend) -> str:
    """The SGLang version the simulator plays (`--sim-sglang-version`)."""
    return getattr(srv.ns, "sim_sglang_version", None) or DEFAULT_VERSION


async def start_request(
    request: web.Request,
    ids: list[int],
    max_new: int,
    ignore_eos: bool,
    rid: str | None,
    openai: bool,
    stop: Sequence[str] = (),
    stream: bool = False,
) -> ReqState | web.StreamResponse:
    """Admission: readiness, queue limit, input checks; a ReqState or an error response."""
    out = await start_requests(request, ids, max_new, ignore_eos, rid, openai, stop, 1, stream)
    return out if isinstance(out, web.StreamResponse) else out[0]


async def start_requests(
    request: web.Request,
    ids: list[int],
    max_new: int,
    ignore_eos: bool,
    rid: str | None,
    openai: bool,
    stop: Sequence[str] = (),
    n: int = 1,
    stream: bool = False,
) -> list[ReqState] | web.StreamResponse:
    """`start_request` for `n` samples of one prompt (OpenAI's `n`): n requests, or the error."""
    srv = backend(request)
    if srv.state not in ("loaded", "ready") or srv.engine is None:
        message = (
            "The server is not ready."
            if srv.state == "starting"
            else "The server is shutting down."
        )
        return error_response(message, 503, openai)
    srv.faults.on_request()
    status = srv.faults.http_error(now(request), srv.log)
    if status is not None:
        return error_response(f"{PREFIX} http-5xx: simulated server error", status, openai)
    try:
        check_input(srv, ids, max_new)
    except BadRequest as exc:
        return await _rejected(request, srv, str(exc), openai, stream)
    limit = srv.ns.max_queued_requests
    if limit is not None and srv.engine.stats().num_queue_reqs >= limit:
        return error_response("The request queue is full.", 503, openai)
    if rid is not None and rid in srv.requests:
        return error_response(f"Duplicate request id: {rid}", 400, openai)
    states: list[ReqState] = []
    try:
        for _ in range(n):
            states.append(srv.submit(ids, max_new, ignore_eos, rid if n == 1 else None, stop))
    except QueueFull:
        for st in states:
            srv.release(st)
        return error_response("The request queue is full.", 503, openai)
    return states


async def _rejected(
    request: web.Request, srv: SimBackend, message: str, openai: bool, stream: bool
) -> web.StreamResponse:
    """An input SGLang's tokenizer manager refuses (a ValueError in its generator).

    /generate logs it; a stream has already answered 200 when the error comes, so the error is
    an SSE event before [DONE] (http_server.py, serving_chat.py), except on 0.5.23's OpenAI
    endpoints, which start the generator before answering and so return 400.
    """
    new = newer(version_of(srv))
    if not openai:
        srv.log(f"[http_server] Error: {message}")
    if not stream or (openai and new):
        return error_response(message, 400, openai)
    if openai:  # serving_base.create_streaming_error_response: json.dumps of ErrorResponse
        error = {"object": "error", "message": message, "type": "BadRequestError"}
        event = json.dumps({"error": {**error, "param": None, "code": 400}})
    elif new:
        error = {"message": message, "type": "invalid_request_error", "code": 400}
        event = json.dumps({"error": {**error, "retryable": False}}, separators=(",", ":"))
    else:
        event = json.dumps({"error": {"message": message}}, separators=(",", ":"))
    resp = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await resp.prepare(request)
        await send_sse(resp, event)
        await send_sse(resp, "[DONE]")
    except (ConnectionResetError, StreamCut):
        pass  # the client left already
    return resp


async def updates(srv: SimBackend, st: ReqState, cut: int | None = None) -> AsyncIterator[int]:
    """Yield each time there is something to send: new tokens (>= stream_interval) or the end.

    Yields how many tokens were sent before. Waiting on the request's event means that tokens
    delivered while the client was slow are sent together, in one chunk: SGLang's coalescing
    under load. With `cut` (a cut-stream fault) it raises StreamCut once `cut` tokens were
    sent, or before the last chunk of a shorter response.
    """
    sent = 0
    interval = max(1, srv.ns.stream_interval)
    while True:
        await st.event.wait()
        st.event.clear()
        if cut is not None and st.finished:
            raise StreamCut
        if st.finished or st.completion_tokens - sent >= interval:
            yield sent
            sent = st.completion_tokens
            if cut is not None and sent >= cut:
                raise StreamCut
        if st.finished:
            return


async def send_sse(resp: web.StreamResponse, payload: Any) -> None:
    """One server-sent event: `data: <json or text>`."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    try:
        await resp.write(f"data: {data}\n\n".encode())
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError: the client left
        raise ClientGone from None
