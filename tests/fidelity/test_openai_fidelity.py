"""SGLang's OpenAI-compatible responses, field for field, against the simulator (both versions).

Each fact names its source in SGLang (`sglang/srt/...`, tag v0.5.6.post2 = OLD or v0.5.23 =
NEW, file:line); `OA` is `sglang/srt/entrypoints/openai/`. The simulator answers over real HTTP.
"""

from __future__ import annotations

import json
import re

from tests.helpers.played import MODEL, NEW, OLD, post, sse

OA = "sglang/srt/entrypoints/openai"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HEX_ID = re.compile(r"[0-9a-f]{32}")


def chat_body(content: str = "hello there", **kw) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 5,
        "ignore_eos": True,
        **kw,
    }


def test_ids_are_sglang_request_ids(sim):
    # OA/serving_base.py:145-147 (OLD), :149-151 (NEW): _generate_request_id_base returns None
    # before its `chatcmpl-`/`cmpl-` line, so the id is the request's rid, uuid4().hex
    # (managers/io_struct.py:349 OLD, :387 NEW), shared by every chunk (OA/serving_chat.py:556)
    status, whole = post(sim, CHAT, chat_body())
    assert status == 200 and HEX_ID.fullmatch(whole["id"])
    events = sse(sim, CHAT, chat_body(stream_options={"include_usage": True}))
    assert len({e["id"] for e in events[:-1]}) == 1 and HEX_ID.fullmatch(events[0]["id"])
    status, text = post(sim, COMPLETIONS, {"prompt": "a b", "max_tokens": 2, "ignore_eos": True})
    assert HEX_ID.fullmatch(text["id"]) and text["object"] == "text_completion"


def test_chat_stream_chunks(sim):
    events = sse(sim, CHAT, chat_body(stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    first, *content, last = chunks
    choice_keys = ["index", "delta", "logprobs", "finish_reason", "matched_stop"]
    assert all(list(c["choices"][0]) == choice_keys for c in chunks)
    if sim.version == OLD:
        # OA/protocol.py:735-747 DeltaMessage, dumped whole (OA/serving_chat.py:560
        # model_dump_json()): every delta key, `tool_calls: null`, and `usage: null` per chunk
        # (OA/protocol.py:762-768 ChatCompletionStreamResponse.usage = None)
        assert list(first) == ["id", "object", "created", "model", "choices", "usage"]
        assert all(c["usage"] is None for c in chunks)
        assert first["choices"][0]["delta"] == {
            "role": "assistant",
            "content": "",
            "reasoning_content": None,
            "tool_calls": None,
        }
        assert all(
            list(c["choices"][0]["delta"]) == list(first["choices"][0]["delta"]) for c in chunks
        )
        assert last["choices"][0]["delta"] == dict.fromkeys(first["choices"][0]["delta"])
    else:
        # OA/sse_utils.py:13-49: msgspec structs with omit_defaults; StreamDelta keeps
        # reasoning_content required (line 23: always sent, null when empty), StreamChunk drops
        # the null usage; the role chunk (OA/serving_chat.py:2586-2598) has role and content ""
        assert list(first) == ["id", "object", "created", "model", "choices"]
        assert first["choices"][0]["delta"] == {
            "reasoning_content": None,
            "role": "assistant",
            "content": "",
        }
        assert all(
            list(c["choices"][0]["delta"]) == ["reasoning_content", "content"] for c in content
        )
        assert last["choices"][0]["delta"] == {"reasoning_content": None}
    # the finish chunk comes after the content (OA/serving_chat.py:652-680 OLD, :2626-2663 NEW)
    assert (
        last["choices"][0]["finish_reason"] == "length"
        and last["choices"][0]["matched_stop"] is None
    )
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["choices"][0]["delta"]["content"] for c in content).strip()
    # the usage chunk: choices [] and UsageInfo dumped whole (OA/serving_chat.py:723 / :2797)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["object"] == "chat.completion.chunk"


def usage_keys(version: str) -> list[str]:
    # OA/protocol.py:105-111 (OLD) and :221-229 (NEW, adds completion_tokens_details)
    keys = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]
    return [*keys, "reasoning_tokens"] + (["completion_tokens_details"] if version == NEW else [])


def test_chat_whole_response_and_usage(sim):
    prompt = f"a prompt seen once by {sim.version} " * 20  # long enough for whole cache blocks
    status, body = post(sim, CHAT, chat_body(prompt))
    assert status == 200
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    # CompletionResponse/ChatCompletionResponse.metadata (OA/serving_chat.py:848 OLD; NEW via
    # utils/weight_versions.py:113), ServerArgs.weight_version = "default" (server_args.py:353)
    assert body["metadata"] == {"weight_version": "default"}
    choice = body["choices"][0]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    message = choice["message"]
    if sim.version == OLD:  # OA/protocol.py:698-702 ChatMessage, tool_calls dumped as null
        assert list(message) == ["role", "content", "reasoning_content", "tool_calls"]
        assert message["tool_calls"] is None
    else:  # OA/protocol.py:1293-1304: tool_calls popped when None
        assert list(message) == ["role", "content", "reasoning_content"]
    assert message["role"] == "assistant" and message["reasoning_content"] is None
    use = body["usage"]
    assert list(use) == usage_keys(sim.version)
    assert use["reasoning_tokens"] == 0 and use["completion_tokens"] == 5
    assert use["total_tokens"] == use["prompt_tokens"] + 5
    first_details = use["prompt_tokens_details"]
    again = post(sim, CHAT, chat_body(prompt))[1]["usage"]["prompt_tokens_details"]
    if sim.version == OLD:
        # OA/usage_processor.py:13-15 _details_if_cached: only when some tokens were cached
        assert first_details is None and again["cached_tokens"] > 0
    else:
        # OA/usage_processor.py:44: PromptTokensDetails(cached_tokens=N) with cache report on;
        # :127-131 completion_tokens_details only with reasoning tokens
        assert first_details == {"cached_tokens": 0} and again["cached_tokens"] > 0
        assert use["completion_tokens_details"] is None


def test_completions_stream_and_usage_chunk(sim):
    body = {"prompt": "a b c", "max_tokens": 4, "ignore_eos": True}
    events = sse(sim, COMPLETIONS, {**body, "stream_options": {"include_usage": True}})
    *chunks, usage, done = events
    assert done == "[DONE]"
    # OA/protocol.py:309-331 (OLD) / :546-582 (NEW): CompletionStreamResponse dumped whole,
    # `usage: null` on every chunk in both versions
    for c in chunks:
        assert list(c) == ["id", "object", "created", "model", "choices", "usage"]
        assert list(c["choices"][0]) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "matched_stop",
        ]
        assert c["usage"] is None and c["object"] == "text_completion"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # the usage chunk is dumped with exclude_none=True (OA/serving_completions.py:328 / :495)
    assert usage["choices"] == [] and None not in usage["usage"].values()
    assert usage["usage"]["completion_tokens"] == 4 and usage["usage"]["reasoning_tokens"] == 0


def test_stop_string_ends_and_trims(sim):
    # managers/schedule_batch.py:947-950 (OLD): the first stop string in the output ends the
    # request, FINISH_MATCHED_STR(matched=stop_str) -> {"type": "stop", "matched": "..."}
    # (:119-127); the choice's matched_stop is that string (OA/serving_chat.py:826-830).
    # Every vocabulary word comes within 313 tokens, so " the" (or " then", " they") must match.
    status, body = post(sim, CHAT, chat_body(max_tokens=400, stop=[" the"]))
    choice = body["choices"][0]
    assert status == 200 and choice["finish_reason"] == "stop" and choice["matched_stop"] == " the"
    text = choice["message"]["content"]
    if text is None:  # the stop string came first: OLD sends an empty content as null
        assert sim.version == OLD
        text = ""
    assert " the" not in text  # trimmed before the stop string
    generated = body["usage"]["completion_tokens"]
    assert generated < 400
    count = post(sim, "/tokenize", {"prompt": text})[1]["count"]
    assert count == generated - 1  # every token but the one that carried " the"
    events = sse(
        sim, COMPLETIONS, {"prompt": "x", "max_tokens": 400, "stop": " the", "ignore_eos": True}
    )
    assert events[-2]["choices"][0]["matched_stop"] == " the"
    assert " the" not in "".join(e["choices"][0]["text"] for e in events[:-1])


def test_n_choices(sim):
    # GenerateReqInput with n > 1 runs n requests (managers/io_struct.py _normalize_rid);
    # usage counts the prompt once and sums completions (OA/usage_processor.py calculate_*_usage)
    status, body = post(sim, CHAT, chat_body(n=3))
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    use = body["usage"]
    assert use["completion_tokens"] == 15 and use["total_tokens"] == use["prompt_tokens"] + 15
    single = post(sim, CHAT, chat_body())[1]["usage"]["prompt_tokens"]
    assert use["prompt_tokens"] == single
    events = sse(sim, CHAT, chat_body(n=2, stream_options={"include_usage": True}))
    finishes = [e["choices"][0]["index"] for e in events[:-2] if e["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1] and events[-2]["usage"]["completion_tokens"] == 10


def test_logprobs_shapes(sim):
    # OA/utils.py:13-47 to_openai_style_logprobs (OLD; NEW :126-): text_offset -1 per token
    status, body = post(
        sim, COMPLETIONS, {"prompt": "a", "max_tokens": 3, "logprobs": 2, "ignore_eos": True}
    )
    lp = body["choices"][0]["logprobs"]
    assert list(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    assert lp["text_offset"] == [-1, -1, -1] and "".join(lp["tokens"]) == body["choices"][0]["text"]
    assert all(len(top) == 2 and max(top.values()) <= 0 for top in lp["top_logprobs"])
    # OA/protocol.py:87-102 TopLogprob / ChatCompletionTokenLogprob / ChoiceLogprobs
    status, chat = post(sim, CHAT, chat_body(logprobs=True, top_logprobs=2))
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and list(content[0]) == ["token", "bytes", "logprob", "top_logprobs"]
    assert content[0]["bytes"] == list(content[0]["token"].encode())
    assert [list(t) for t in content[0]["top_logprobs"]] == [["token", "bytes", "logprob"]] * 2
    events = sse(sim, CHAT, chat_body(logprobs=True, top_logprobs=1))
    streamed = [e["choices"][0]["logprobs"] for e in events[1:-2] if e["choices"][0]["logprobs"]]
    assert sum(len(s["content"]) for s in streamed) == 5


def test_continuous_usage_stats(sim):
    # OA/serving_chat.py:639-649 (OLD; NEW :1032-1042, cache details from :834-841 when the
    # cache report is on) and OA/serving_completions.py:275-284 (OLD; NEW :396-401, no cache
    # details): each text chunk carries the usage so far
    options = {"continuous_usage_stats": True}
    events = sse(sim, CHAT, chat_body(max_tokens=4, stream_options=options))
    counts = [e["usage"]["completion_tokens"] for e in events[1:-2]]
    assert counts == sorted(counts) and counts[-1] == 4
    assert all(list(e["usage"]) == usage_keys(sim.version) for e in events[1:-2])
    details = events[1]["usage"]["prompt_tokens_details"]
    assert details is None if sim.version == OLD else details == {"cached_tokens": 0}
    events = sse(
        sim,
        COMPLETIONS,
        {"prompt": "a", "max_tokens": 3, "ignore_eos": True, "stream_options": options},
    )
    assert events[-2]["usage"]["completion_tokens"] == 3
    assert events[-2]["usage"]["prompt_tokens_details"] is None


def test_too_long_input(sim):
    # managers/tokenizer_manager.py raises ValueError("The input (N tokens) is longer than the
    # model's context length (M tokens).") inside the generator. Not streamed: 400 with the
    # ErrorResponse (OA/serving_base.py). Streamed: OLD has answered 200 already, so the error is
    # an event (OA/serving_chat.py:725-727, OA/serving_completions.py:331-333, json.dumps of
    # ErrorResponse, OA/serving_base.py:233-247); NEW kick-starts the generator first and
    # answers 400 (OA/serving_chat.py:2420-2428, OA/serving_completions.py:204-212)
    from tests.helpers.played import call

    body = {"prompt": [7] * 131072, "max_tokens": 1}
    status, err = post(sim, COMPLETIONS, body)
    assert status == 400 and list(err) == ["object", "message", "type", "param", "code"]
    assert err["message"].startswith("The input (131072 tokens) is longer than")
    status, text, _ = call(sim, "POST", COMPLETIONS, {**body, "stream": True})
    if sim.version == NEW:
        assert status == 400 and json.loads(text)["code"] == 400
    else:
        assert status == 200
        event, done = [b[len("data: ") :] for b in text.strip().split("\n\n")]
        assert done == "[DONE]" and json.loads(event)["error"]["code"] == 400
    # /generate logs "[http_server] Error: ..." (HS:591-596, :611 OLD; :962-983, :989 NEW), streams the
    # error as an event in both versions (HS = sglang/srt/entrypoints/http_server.py)
    status, text, _ = call(sim, "POST", "/generate", {"input_ids": [7] * 131072, "stream": True})
    assert status == 200 and text.endswith("data: [DONE]\n\n") and '"error"' in text
    assert "[http_server] Error: The input (131072 tokens) is longer than" in sim.log()
