"""The official `openai` Python client against the simulator, over real HTTP, for each version.

It reads every field SGLang's response classes send (sglang/srt/entrypoints/openai/protocol.py:
ChatCompletionResponse, ChatCompletionStreamResponse, CompletionResponse, UsageInfo; the 0.5.23
stream chunks of sse_utils.py). SGLang's extras (`reasoning_content`, `matched_stop`,
`reasoning_tokens`, `metadata`) reach the client as pydantic extras, so reading them is plain
attribute access, which raises AttributeError when the server leaves them out: the issue's
"the SDK then raises AttributeError on every chunk" is what these reads would catch.
"""

from __future__ import annotations

import openai
import pytest

from tests.helpers.played import MODEL, NEW, VERSIONS, played

PROMPT = "the quick brown fox jumps over the lazy dog " * 4


@pytest.fixture(scope="module", params=VERSIONS)
def client(request):
    with played(request.param) as sim:
        c = openai.OpenAI(base_url=sim.url + "/v1", api_key="none", timeout=30, max_retries=0)
        c.played = request.param
        try:
            yield c
        finally:
            c.close()


def test_chat(client):
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        n=2,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert len(done.id) == 32 and done.object == "chat.completion" and done.model == MODEL
    assert done.created > 0 and done.metadata["weight_version"] == "default"
    for i, choice in enumerate(done.choices):
        assert (
            choice.index == i and choice.finish_reason == "length" and choice.matched_stop is None
        )
        msg = choice.message
        assert msg.role == "assistant" and msg.reasoning_content is None and msg.tool_calls is None
        assert len(msg.content.split()) == 6  # generated words, one token each
        assert len(choice.logprobs.content) == 6
        top = choice.logprobs.content[0].top_logprobs
        assert len(top) == 2 and top[0].token == choice.logprobs.content[0].token
        assert bytes(top[1].bytes).decode() == top[1].token and top[1].logprob < top[0].logprob
    usage = done.usage
    assert usage.completion_tokens == 12 and usage.total_tokens == usage.prompt_tokens + 12
    assert usage.reasoning_tokens == 0 and usage.completion_tokens_details is None
    assert usage.prompt_tokens_details is None or usage.prompt_tokens_details.cached_tokens >= 0
    if client.played == NEW:  # --enable-cache-report: always reported by 0.5.23
        assert usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        stop=["never in the vocabulary"],
        extra_body={"ignore_eos": True},
    )
    parts, usage, finish, ids, reasoning, roles = [], None, [], set(), [], []
    for chunk in stream:
        ids.add(chunk.id)
        assert chunk.object == "chat.completion.chunk" and chunk.model == MODEL
        if chunk.usage:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        choice = chunk.choices[0]
        reasoning.append(choice.delta.reasoning_content)  # every chunk carries it (null)
        roles.append(choice.delta.role)
        assert choice.delta.tool_calls is None and choice.index == 0
        if choice.delta.content:
            parts.append(choice.delta.content)
        if choice.finish_reason:
            finish.append((choice.finish_reason, choice.matched_stop))
    assert len(ids) == 1 and reasoning and set(reasoning) == {None}
    assert roles[0] == "assistant" and set(roles[1:]) == {None}
    assert finish == [("length", None)]
    assert usage.completion_tokens == 7 and usage.total_tokens == usage.prompt_tokens + 7
    assert usage.reasoning_tokens == 0
    text = "".join(parts)
    assert len(text.split()) == 7  # generated words, one token each


def test_completions(client):
    done = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, logprobs=1, extra_body={"ignore_eos": True}
    )
    choice = done.choices[0]
    assert done.object == "text_completion" and choice.finish_reason == "length"
    assert choice.matched_stop is None and choice.index == 0
    assert (
        choice.logprobs.text_offset == [-1] * 5 and "".join(choice.logprobs.tokens) == choice.text
    )
    assert len(choice.logprobs.token_logprobs) == 5 and len(choice.logprobs.top_logprobs) == 5
    assert done.usage.completion_tokens == 5 and done.metadata == {"weight_version": "default"}
    again = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # --enable-cache-report


def test_completions_stream_and_stop(client):
    stream = client.completions.create(
        model=MODEL,
        prompt="a b",
        max_tokens=400,
        stop=[" the"],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    *texts, last = chunks
    assert last.choices == [] and last.usage.completion_tokens < 400
    assert texts[-1].choices[0].finish_reason == "stop"
    assert texts[-1].choices[0].matched_stop == " the"
    assert " the" not in "".join(c.choices[0].text for c in texts)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models] == [MODEL]
    card = client.models.retrieve(MODEL)
    assert card.owned_by == "sglang" and card.max_model_len > 0
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
