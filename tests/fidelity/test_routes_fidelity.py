"""SGLang's HTTP routes beyond generation, against the simulator (both versions).

Facts name `sglang/srt/entrypoints/http_server.py` (HS) and the OpenAI serving files of tag
v0.5.6.post2 (OLD) or v0.5.23 (NEW), file:line.
"""

from __future__ import annotations

import json

from tests.helpers.played import MODEL, NEW, OLD, call, get, post
from tuner.sim.http.routes import routes_for


def test_probes(sim):
    # NEW HS:714-718 GET /ready: 200 when is_ready() (healthy, not paused), else 503;
    # OLD has no /ready (404)
    # HS:1319-1322 (OLD) GET /ping: always 200; NEW HS:2190-2199: 200 when is_healthy()
    assert get(sim, "/ping") == (200, "")
    if sim.version == OLD:
        assert get(sim, "/ready")[0] == 404
        return
    assert get(sim, "/ready") == (200, "")
    # HS:1831-1856 /pause_generation, /continue_generation: {"message", "status": "ok"}
    status, body = post(sim, "/pause_generation", {})
    assert status == 200 and body == {"message": "Generation paused successfully.", "status": "ok"}
    assert get(sim, "/ready")[0] == 503 and get(sim, "/ping")[0] == 200
    status, body = post(sim, "/continue_generation", {})
    assert body["status"] == "ok" and get(sim, "/ready")[0] == 200


def test_tokenize_detokenize(sim):
    # HS:1171-1200 (OLD) / :1906-1940 (NEW): /tokenize and /v1/tokenize, /detokenize and
    # /v1/detokenize; OA/protocol.py:887-910 (OLD): {"tokens", "count", "max_model_len"} and
    # {"text"}, a list of prompts gives lists (OA/serving_tokenize.py:40-56)
    for path in ("/tokenize", "/v1/tokenize"):
        status, body = post(sim, path, {"model": MODEL, "prompt": "hello, world"})
        assert status == 200 and list(body) == ["tokens", "count", "max_model_len"]
        assert body["count"] == len(body["tokens"]) == 3 and body["max_model_len"] == 131072
    status, body = post(sim, "/tokenize", {"prompt": ["a b", "c"]})
    assert body["count"] == [2, 1] and len(body["tokens"]) == 2
    ids = post(sim, "/tokenize", {"prompt": "the quick brown fox"})[1]["tokens"]
    for path in ("/detokenize", "/v1/detokenize"):
        status, body = post(sim, path, {"tokens": [201, 202, 5000]})
        assert status == 200 and body == {"text": " of and w5000"}
    text = post(sim, "/detokenize", {"tokens": ids})[1]["text"]
    assert post(sim, "/tokenize", {"prompt": text})[1]["tokens"] == ids  # ids -> text -> ids
    assert post(sim, "/detokenize", {"tokens": [[201], [202]]})[1] == {"text": [" of", " and"]}
    status, body = post(sim, "/detokenize", {"tokens": "nope"})
    assert status == 400 and body["object"] == "error"


def test_abort_request(sim):
    # HS:1052-1061 (OLD) / :1721-1731 (NEW): POST /abort_request {"rid", "abort_all"} -> 200,
    # empty body; the request ends with finish_reason {"type": "abort", ...}
    import threading

    rid = f"abort-me-{sim.version}"
    out: dict = {}
    body = {
        "text": "x",
        "rid": rid,
        "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True},
    }

    def run() -> None:
        out["resp"] = post(sim, "/generate", body)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        for _ in range(200):
            status, text, _ = call(sim, "POST", "/abort_request", {"rid": rid})
            assert status == 200 and text == ""
            worker.join(0.05)
            if not worker.is_alive():
                break
    finally:
        worker.join(30)
    status, result = out["resp"]
    assert status == 200 and result["meta_info"]["finish_reason"]["type"] == "abort"
    assert result["meta_info"]["completion_tokens"] < 100000
    assert call(sim, "POST", "/abort_request", {"abort_all": True})[0] == 200


def test_model_card_and_weight_version(sim):
    # HS:1239-1262 (OLD) / :2025-2047 (NEW): the served model's card, else OpenAI's 404 body
    status, text = get(sim, f"/v1/models/{MODEL}")
    assert status == 200 and f'"id": "{MODEL}"' in text and '"owned_by": "sglang"' in text
    status, body = post(sim, "/tokenize", {"prompt": "x"})  # keep the server warm
    status, text = get(sim, "/v1/models/other")
    assert status == 404 and '"code": "model_not_found"' in text
    if sim.version == OLD:  # HS:516-531 /weight_version; HS:564-566 /get_load (OLD only)
        assert get(sim, "/weight_version") == (200, '{"weight_version": "default"}')
        status, text = get(sim, "/get_load")
        assert status == 200 and '"num_waiting_reqs"' in text
    else:  # NEW serves neither; HS:2124-2128 GET / answers "SGLang is running"
        assert get(sim, "/weight_version")[0] == 404
        assert get(sim, "/") == (200, '"SGLang is running"')


def test_every_route_of_the_version_answers(sim):
    # every decorator of HS answers (the simulator's list is SGLang's, per version); the
    # operations it does not model answer 400 in SGLang's native error shape, never 404
    for methods, path in routes_for(sim.version):
        if "{" in path or path in ("/abort_request", "/pause_generation"):
            continue
        status, text, _ = call(sim, methods[0], path, {} if methods[0] != "GET" else None)
        assert status != 404, (methods, path)
    status, text, _ = call(sim, "POST", "/update_weights_from_disk", {})
    assert status == 400 and text.startswith(
        '{"error": {"message": "POST /update_weights_from_disk is not simulated'
    )
    assert (call(sim, "POST", "/v1/decisions", {})[0] == 404) == (sim.version == OLD)
    assert (call(sim, "GET", "/get_load")[0] == 404) == (sim.version == NEW)


def test_model_info_and_deprecated_names(sim):
    # HS:498-512 (OLD) / :812-848 (NEW, adds served_model_name and the serving config)
    status, text = get(sim, "/model_info")
    keys = [
        "model_path",
        "tokenizer_path",
        "is_generation",
        "preferred_sampling_params",
        "weight_version",
    ]
    if sim.version == NEW:
        keys[1:1] = ["served_model_name"]
        keys += ["load_format", "reasoning_parser", "tool_call_parser", "disaggregation_mode"]
    keys += ["has_image_understanding", "has_audio_understanding", "model_type", "architectures"]
    assert status == 200 and list(json.loads(text)) == keys
    # HS:488-495 and :534-541 (OLD; NEW :802-809, :853-860): the old names answer the same,
    # and log a deprecation warning on every call
    assert json.loads(get(sim, "/get_model_info")[1]) == json.loads(text)
    get(sim, "/get_server_info")
    log = sim.log()
    assert (
        "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
        "Please use '/model_info' instead." in log
    )
    assert "Endpoint '/get_server_info' is deprecated" in log


def test_server_info_names_the_version_played(sim):
    # HS /server_info: "version": __version__ of the installed sglang; the tuner records it per
    # trial and judges the exported flags against that version's table
    status, body = get(sim, "/server_info")
    assert status == 200 and json.loads(body)["version"] == sim.version
