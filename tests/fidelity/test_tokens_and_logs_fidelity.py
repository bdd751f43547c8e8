"""The simulator's tokenizer story, /generate's meta_info, and what a client disconnect logs.

Tokenizer: SGLang counts with the model's tokenizer; the simulator's own (tuner/sim/tokens.py,
docs/simulator.md, "The simulator's tokenizer") must keep text and ids consistent: generated text
retokenizes to the count the server reported, ids -> text -> ids is exact, and the tuner's
synthetic `w<id>` prompts count one token per word.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp

from tests.helpers.played import OLD, post
from tuner.sim import tokens


def test_vocabulary_is_prime_and_unique():
    # output_token_id walks the vocabulary with a seed-chosen stride: a prime size makes every
    # stride visit every word, so any stop word is met within len(VOCAB) tokens
    n = len(tokens.VOCAB)
    assert len(set(tokens.VOCAB)) == n and all(n % k for k in range(2, int(n**0.5) + 1))
    assert all(w.isalpha() and w.islower() for w in tokens.VOCAB)


def test_ids_text_ids_is_exact():
    ids = [*range(0, 2000), 29_999, 123_456_789, *(tokens.output_token_id(7, i) for i in range(50))]
    assert tokens.encode(tokens.decode(ids)) == ids
    generated = [tokens.output_token_id(42, i) for i in range(300)]
    text = tokens.decode(generated)
    assert tokens.count_tokens(text) == 300 == len(text.split())


def test_counts():
    # the tuner's synthetic prompts (workload.Request.prompt_text) count what they asked for
    assert tokens.count_tokens(" ".join(f"w{i}" for i in range(1000, 2024))) == 1024
    assert tokens.encode("w1234 w77") == [1234, 77]
    # prose: punctuation and digit groups apart (as byte-level BPE pre-tokenizers split),
    # so a text counts more than its whitespace words
    prose = "Hello, world! It's 2026: the year 12345 began."
    assert tokens.count_tokens(prose) > len(prose.split())
    assert tokens.encode("same text") == tokens.encode("same text")  # prefix caching on text


def test_generated_text_retokenizes_to_the_reported_count(sim):
    body = {"text": "count me", "sampling_params": {"max_new_tokens": 37, "ignore_eos": True}}
    status, out = post(sim, "/generate", body)
    meta = out["meta_info"]
    assert status == 200 and meta["completion_tokens"] == 37 == len(out["output_ids"])
    assert post(sim, "/tokenize", {"prompt": out["text"]})[1]["tokens"] == out["output_ids"]
    assert post(sim, "/detokenize", {"tokens": out["output_ids"]})[1]["text"] == out["text"]
    # managers/tokenizer_manager.py:1493-1527 (0.5.6.post2): id, finish_reason, prompt_tokens,
    # weight_version ("default", server_args.py:353), total_retractions, completion_tokens,
    # cached_tokens, e2e_latency once finished (:1571-1576); 0.5.23 (:2507-2558, :2753):
    # num_retractions, and reasoning_tokens before completion_tokens
    head = ["id", "finish_reason", "prompt_tokens", "weight_version"]
    if sim.version == OLD:
        keys = [*head, "total_retractions", "completion_tokens", "cached_tokens", "e2e_latency"]
    else:
        keys = [*head, "num_retractions", "reasoning_tokens", "completion_tokens", "cached_tokens"]
        keys.append("e2e_latency")
    assert list(meta) == keys and meta["weight_version"] == "default"
    assert meta["prompt_tokens"] == 2


def test_client_disconnects_log_no_traceback(sim):
    """Clients that leave mid-stream or mid-wait: SGLang aborts the request; no traceback.

    managers/tokenizer_manager.py:965-973 and :1053-1061 (0.5.6.post2): a non-streamed request
    whose client is gone raises "Request is disconnected from the client side (type 1|3). Abort
    request obj.rid=..." which /generate logs as "[http_server] Error: ..." (HS:608-611); a
    stream is cancelled by Starlette and its abort (scheduler.py:2384, :2439) logs at debug.
    """

    async def leave(session: aiohttp.ClientSession, path: str, body: dict, after: float) -> None:
        try:
            async with asyncio.timeout(after), session.post(sim.url + path, json=body) as r:
                async for _ in r.content:
                    pass
        except TimeoutError:
            pass

    long = {"max_new_tokens": 5000, "ignore_eos": True}
    jobs = [
        ("/generate", {"text": "a b", "stream": True, "sampling_params": long}),
        ("/generate", {"text": "a b", "sampling_params": long}),
        (
            "/v1/completions",
            {"prompt": "a", "max_tokens": 5000, "stream": True, "ignore_eos": True},
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "a"}],
                "max_tokens": 5000,
                "stream": True,
                "ignore_eos": True,
            },
        ),
    ]

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(
                *(
                    leave(s, p, b, 0.05 + 0.05 * (i % 7))
                    for i in range(24)
                    for p, b in [jobs[i % 4]]
                )
            )

    # on a busy machine a client may leave before the server has read its request (nothing to
    # abort then): up to three bursts; a server that never logs the abort still fails
    for _ in range(3):
        asyncio.run(main())
        deadline = time.monotonic() + 10
        while "Abort request obj.rid=" not in sim.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        if "Abort request obj.rid=" in sim.log():
            break
    log = sim.log()
    assert "Traceback" not in log and "Error handling request" not in log
    assert re.search(
        r"\[http_server\] Error: Request is disconnected from the client side \(type [13]\)\. "
        r"Abort request obj\.rid='[0-9a-f]{32}'",
        log,
    )
    assert post(sim, "/tokenize", {"prompt": "still serving"})[0] == 200


def test_first_stop_finds_the_first_match_and_gives_up_after_a_period():
    seed = 1234
    text = tokens.decode([tokens.output_token_id(seed, i) for i in range(40)])
    two = text[text.index(" ", 30) : text.index(" ", 30) + 12]  # spans two or more tokens
    n, matched, keep = tokens.first_stop(seed, 1000, ["never there", two])
    assert matched == two and text.startswith(text[:keep]) and text[:keep] + two in text
    assert two not in text[: keep + len(two) - 1]  # the first occurrence
    assert tokens.count_tokens(text[:keep]) < n <= tokens.count_tokens(text[: keep + len(two)])
    assert tokens.first_stop(seed, 10**6, ["never there"]) is None  # bounded by one period
