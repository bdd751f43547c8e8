"""The simulator's HTTP API: SGLang's endpoints and JSON shapes, streamed and not.

Real subprocess, real HTTP (aiohttp client and the official openai client).
"""

from __future__ import annotations

import asyncio
import itertools
import json

import aiohttp
import openai
import pytest

from tests.helpers.simproc import sim_server

pytestmark = pytest.mark.slow

PROMPT = "the quick brown fox jumps over the lazy dog " * 4


@pytest.fixture(scope="module")
def sim():
    with sim_server(
        "--enable-metrics", "--served-model-name", "sim-llama", "--enable-cache-report"
    ) as proc:
        yield proc


def call(
    method: str, url: str, body: dict | None = None, headers: dict | None = None
) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as s,
            s.request(method, url, json=body, headers=headers) as r,
        ):
            return r.status, await r.text()

    return asyncio.run(go())


def sse(url: str, body: dict) -> list:
    """POST and collect SSE events (parsed JSON, or the raw string for [DONE])."""

    async def go() -> list:
        events = []
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.post(url, json=body) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    data = line[6:]
                    events.append(data if data == "[DONE]" else json.loads(data))
        return events

    return asyncio.run(go())


def test_health_and_health_generate(sim):
    assert call("GET", sim.url + "/health") == (200, "")
    assert call("GET", sim.url + "/health_generate")[0] == 200


@pytest.mark.parametrize("path", ["/get_server_info", "/server_info"])
def test_server_info(sim, path):
    status, text = call("GET", sim.url + path)
    info = json.loads(text)
    assert status == 200 and info["status"] == "ready" and info["version"] == "0.5.6.post2"
    for key in (
        "mem_fraction_static",
        "chunked_prefill_size",
        "cuda_graph_max_bs",
        "page_size",
        "tp_size",
        "hicache_ratio",
        "hicache_size",
        "served_model_name",
        "max_req_input_len",
    ):
        assert key in info, key
    assert info["mem_fraction_static"] == 0.835 and info["served_model_name"] == "sim-llama"
    assert info["max_total_num_tokens"] > 100_000
    state = info["internal_states"][0]
    assert set(state["memory_usage"]) >= {"weight", "kvcache", "token_capacity", "graph"}
    assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert "last_gen_throughput" in state
    assert f"max_total_num_tokens={info['max_total_num_tokens']}," in sim.log()


def test_model_info_and_models(sim):
    for path in ("/get_model_info", "/model_info"):
        info = json.loads(call("GET", sim.url + path)[1])
        assert info["model_path"] == "sim/model" and info["is_generation"] is True
    models = json.loads(call("GET", sim.url + "/v1/models")[1])
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == "sim-llama" and card["object"] == "model" and card["owned_by"] == "sglang"
    assert card["max_model_len"] == 131072


def test_generate_non_stream(sim):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    status, text = call("POST", sim.url + "/generate", body)
    out = json.loads(text)
    assert status == 200
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 12 == len(out["output_ids"]) == len(out["text"].split())
    assert meta["prompt_tokens"] == len(PROMPT.split())
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert set(meta) >= {"id", "cached_tokens", "e2e_latency"} and meta["e2e_latency"] > 0
    # the same prompt again hits the radix cache
    again = json.loads(call("POST", sim.url + "/generate", body)[1])
    assert again["meta_info"]["cached_tokens"] > 0


def test_generate_stream_is_cumulative(sim):
    body = {
        "input_ids": list(range(5000, 5040)),
        "stream": True,
        "sampling_params": {"max_new_tokens": 20, "ignore_eos": True},
    }
    events = sse(sim.url + "/generate", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 20
    for prev, cur in itertools.pairwise(chunks):
        assert cur["text"].startswith(prev["text"])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["meta_info"]["prompt_tokens"] == 40


def test_generate_without_ignore_eos_stops_early_with_stop(sim):
    lengths = set()
    for i in range(6):
        body = {"text": f"question {i} about eos", "sampling_params": {"max_new_tokens": 30}}
        meta = json.loads(call("POST", sim.url + "/generate", body)[1])["meta_info"]
        assert 1 <= meta["completion_tokens"] <= 30
        if meta["finish_reason"]["type"] == "stop":
            lengths.add(meta["completion_tokens"])
    assert lengths and min(lengths) < 30


def test_context_length_errors(sim):
    long = {"input_ids": [7] * 131072, "sampling_params": {"max_new_tokens": 1}}
    status, text = call("POST", sim.url + "/generate", long)
    assert status == 400
    assert json.loads(text)["error"]["message"] == (
        "The input (131072 tokens) is longer than the model's context length (131072 tokens)."
    )
    status, text = call(
        "POST", sim.url + "/v1/completions", {"prompt": [7] * 131072, "max_tokens": 1}
    )
    assert status == 400 and json.loads(text)["object"] == "error"


def test_completions_stream_and_usage(sim):
    body = {
        "model": "sim-llama",
        "prompt": PROMPT,
        "max_tokens": 10,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    events = sse(sim.url + "/v1/completions", body)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 10
    chunks = events[:-2]
    assert all(c["object"] == "text_completion" and len(c["choices"]) == 1 for c in chunks)
    assert (
        "".join(c["choices"][0]["text"] for c in chunks).split()
        and chunks[-1]["choices"][0]["finish_reason"] == "length"
    )
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert len("".join(c["choices"][0]["text"] for c in chunks).split()) == 10


def test_chat_stream_shape(sim):
    body = {
        "model": "sim-llama",
        "messages": [{"role": "user", "content": "hi there"}],
        "max_tokens": 6,
        "stream": True,
        "ignore_eos": True,
    }
    events = sse(sim.url + "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    # SGLang always sends reasoning_content (null here); 0.5.6.post2 also every other delta key
    first, last = chunks[0]["choices"][0]["delta"], chunks[-1]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"] == ""
    assert first["reasoning_content"] is None and last["reasoning_content"] is None
    assert last.get("content") is None and chunks[-1]["choices"][0]["finish_reason"] == "length"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert len(content.split()) == 6
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_openai_client(sim):
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="none", timeout=30)
    try:
        # the same prompt twice: the second is a radix-cache hit whatever ran before on this
        # worker (0.5.6.post2 reports prompt_tokens_details only when some tokens were cached)
        for _ in range(2):
            done = client.completions.create(
                model="sim-llama", prompt=PROMPT, max_tokens=5, extra_body={"ignore_eos": True}
            )
        assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 5
        assert done.usage.prompt_tokens_details.cached_tokens > 0  # --enable-cache-report
        chat = client.chat.completions.create(
            model="sim-llama",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            extra_body={"ignore_eos": True},
        )
        assert (
            chat.choices[0].message.role == "assistant"
            and len(chat.choices[0].message.content.split()) == 4
        )
        stream = client.chat.completions.create(
            model="sim-llama",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        parts, usage = [], None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        assert len("".join(parts).split()) == 7 and usage.completion_tokens == 7
        text_stream = client.completions.create(
            model="sim-llama",
            prompt="a b",
            max_tokens=3,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        assert len("".join(c.choices[0].text for c in text_stream).split()) == 3
        assert [m.id for m in client.models.list()] == ["sim-llama"]
    finally:
        client.close()


def test_flush_cache(sim):
    status, text = call("POST", sim.url + "/flush_cache")
    assert status == 200 and text.startswith("Cache flushed")


def test_metrics(sim):
    call(
        "POST",
        sim.url + "/generate",
        {"text": "metrics please", "sampling_params": {"max_new_tokens": 3}},
    )
    status, text = call("GET", sim.url + "/metrics")
    assert status == 200
    label = 'model_name="sim-llama"'  # the first label of every series
    for name in (
        "num_running_reqs",
        "num_used_tokens",
        "token_usage",
        "num_queue_reqs",
        "gen_throughput",
        "cache_hit_rate",
        "max_total_num_tokens",
        "num_retracted_reqs",
        "prompt_tokens_total",
        "generation_tokens_total",
        "cached_tokens_total",
        "num_requests_total",
    ):
        assert f"sglang:{name}{{{label}" in text, name
    for hist in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
    ):
        assert f"# TYPE sglang:{hist} histogram" in text
        count = next(line for line in text.splitlines() if line.startswith(f"sglang:{hist}_count"))
        assert float(count.split()[-1]) > 0
    requests = next(
        line for line in text.splitlines() if line.startswith("sglang:num_requests_total")
    )
    assert float(requests.split()[-1]) >= 1


def test_api_key_and_no_metrics_without_flag():
    with sim_server("--api-key", "s3cret") as sim:
        assert call("GET", sim.url + "/health")[0] == 200
        assert call("GET", sim.url + "/get_server_info") == (401, '{"error": "Unauthorized"}')
        assert call("POST", sim.url + "/generate", {"text": "x"})[0] == 401
        ok = call("GET", sim.url + "/get_server_info", headers={"Authorization": "Bearer s3cret"})
        assert ok[0] == 200
        assert call("GET", sim.url + "/metrics")[0] == 404  # not enabled


def test_max_queued_requests_gives_503():
    with sim_server("--max-queued-requests", "2", "--max-running-requests", "1") as sim:

        async def burst() -> list[int]:
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(timeout=timeout) as s:

                async def one(i: int) -> int:
                    body = {
                        "text": f"q{i}",
                        "sampling_params": {"max_new_tokens": 40, "ignore_eos": True},
                    }
                    async with s.post(sim.url + "/generate", json=body) as r:
                        await r.read()
                        return r.status

                return await asyncio.gather(*(one(i) for i in range(8)))

        statuses = asyncio.run(burst())
        assert 503 in statuses and 200 in statuses


def test_kimi_done_criterion():
    flags = (
        "--sim-profile",
        "kimi-k2.5-tp8",
        "--model-path",
        "moonshotai/Kimi-K2.5",
        "--tp-size",
        "8",
        "--mem-fraction-static",
        "0.85",
    )
    with sim_server(*flags) as sim:
        info = json.loads(call("GET", sim.url + "/get_server_info")[1])
        assert info["max_total_num_tokens"] == 116_171 and info["tp_size"] == 8
        assert "KV Cache is allocated. #tokens: 116171, KV size: 7.60 GB" in sim.log()
        assert " TP0] " in sim.log()
