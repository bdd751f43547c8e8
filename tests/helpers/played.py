"""A simulator playing one SGLang version, and plain HTTP calls to it, for the fidelity tests.

    with played("0.5.23", "--enable-metrics") as sim:   # a ready `tuner sim`, always killed after
        status, body = get(sim, "/ready")
        status, obj = post(sim, "/tokenize", {"prompt": "hi"})
        events = sse(sim, "/v1/chat/completions", {...})   # parsed chunks, then "[DONE]"

Source paths in the facts are relative to SGLang's `python/` directory; the wheels
(`pip download sglang==<version> --no-deps`) hold the same files under `sglang/`.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from tests.helpers.simproc import SimProc, sim_server

OLD, NEW = "0.5.6.post2", "0.5.23"
VERSIONS = (OLD, NEW)
#: the served model name every fidelity simulator uses
MODEL = "sim-llama"


@contextlib.contextmanager
def played(version: str, *flags: str) -> Iterator[SimProc]:
    """A ready simulator playing `version` (metrics and cache report on), killed afterwards."""
    with sim_server(
        "--sim-sglang-version",
        version,
        "--served-model-name",
        MODEL,
        "--enable-metrics",
        "--enable-cache-report",
        *flags,
    ) as sim:
        yield sim


def call(
    sim: SimProc, method: str, path: str, body: Any = None, timeout: float = 30.0
) -> tuple[int, str, dict[str, str]]:
    """(status, body text, headers) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(sim.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def get(sim: SimProc, path: str) -> tuple[int, str]:
    """(status, body text) of a GET."""
    status, text, _ = call(sim, "GET", path)
    return status, text


def post(sim: SimProc, path: str, body: Any) -> tuple[int, Any]:
    """(status, parsed JSON or text) of a POST."""
    status, text, _ = call(sim, "POST", path, body)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def sse(sim: SimProc, path: str, body: dict) -> list[Any]:
    """POST with `stream: true` and return the events: parsed chunks, then "[DONE]"."""
    status, text, headers = call(sim, "POST", path, {**body, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream"), text
    events: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
