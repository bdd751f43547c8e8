"""SGLang's OpenAI-compatible JSON shapes, field for field, for the version played. Pure.

Each builder returns what SGLang serializes, key order included, so a client that reads any field
SGLang sends finds it (tests/fidelity/test_openai_fidelity.py names each source line). Where the two
versions differ:

* chat stream chunks: 0.5.6.post2 dumps pydantic models whole (`"usage": null`, every delta key,
  `tool_calls: null`); 0.5.23 builds them with msgspec `omit_defaults` (sse_utils.py): no `usage`,
  the delta keeps `reasoning_content` (always, null when empty) and only the keys that are set;
* non-streamed chat: 0.5.23 drops `tool_calls` when null and sends `content: ""`, not null;
* usage: 0.5.23 adds `completion_tokens_details` and reports `prompt_tokens_details` whenever
  `--enable-cache-report` is on; 0.5.6.post2 only when some tokens were cached.
Ids are SGLang's request ids (uuid4 hex): its `chatcmpl-`/`cmpl-` prefix code is never reached.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: the first version with the msgspec chat chunks and the newer usage shape
V0523 = (0, 5, 23)
#: what SGLang reports as the weights' version until an update names one (server_args default)
WEIGHT_VERSION = "default"


def version_key(version: str) -> tuple[int, ...]:
    """`0.5.6.post2` -> (0, 5, 6): the release numbers, for comparing versions."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("post")[0])[:3])


def newer(version: str) -> bool:
    """True for 0.5.23 and later."""
    return version_key(version) >= V0523


def usage(
    version: str,
    prompt: int,
    completion: int,
    cached: int,
    cache_report: bool,
    drop_none: bool = False,
) -> dict[str, Any]:
    """UsageInfo (usage_processor.py); `drop_none` for the completions usage chunk."""
    if newer(version):
        details = {"cached_tokens": cached} if cache_report else None
    else:
        details = {"cached_tokens": cached} if cache_report and cached > 0 else None
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
    }
    if newer(version):
        out["completion_tokens_details"] = None  # set only when there are reasoning tokens
    if drop_none:
        out = {k: v for k, v in out.items() if v is not None}
    return out


def head(rid: str, obj: str, created: int, model: str) -> dict[str, Any]:
    """The keys every response and chunk starts with."""
    return {"id": rid, "object": obj, "created": created, "model": model}


def choice(
    index: int,
    body: dict[str, Any],
    finish: str | None,
    matched: int | str | None,
    logprobs: dict | None = None,
) -> dict[str, Any]:
    """One choice: `body` is {"text": ...}, {"message": ...} or {"delta": ...}."""
    return {
        "index": index,
        **body,
        "logprobs": logprobs,
        "finish_reason": finish,
        "matched_stop": matched,
    }


def message(version: str, text: str) -> dict[str, Any]:
    """A non-streamed chat message (ChatMessage)."""
    if newer(version):
        return {"role": "assistant", "content": text, "reasoning_content": None}
    return {
        "role": "assistant",
        "content": text or None,
        "reasoning_content": None,
        "tool_calls": None,
    }


def delta(version: str, role: str | None = None, content: str | None = None) -> dict[str, Any]:
    """A chat stream delta: pydantic DeltaMessage (0.5.6.post2) or msgspec StreamDelta."""
    if not newer(version):
        return {"role": role, "content": content, "reasoning_content": None, "tool_calls": None}
    out: dict[str, Any] = {"reasoning_content": None}
    if role is not None:
        out["role"] = role
    if content is not None:
        out["content"] = content
    return out


def chat_chunk(version: str, top: dict[str, Any], one: dict[str, Any]) -> dict[str, Any]:
    """A chat stream chunk with one choice; 0.5.23 omits the null `usage`."""
    out = {**top, "choices": [one]}
    if not newer(version):
        out["usage"] = None
    return out


def completion_chunk(top: dict[str, Any], one: dict[str, Any]) -> dict[str, Any]:
    """A completions stream chunk (CompletionStreamResponse, dumped whole in both versions)."""
    return {**top, "choices": [one], "usage": None}


def whole(
    top: dict[str, Any], choices: list[dict[str, Any]], use: dict[str, Any]
) -> dict[str, Any]:
    """A non-streamed response, with SGLang's weight-version metadata."""
    return {**top, "choices": choices, "usage": use, "metadata": {"weight_version": WEIGHT_VERSION}}


# --- logprobs: values are made up (seeded), the shapes are SGLang's -----------------------------


def token_logprob(seed: int, index: int, rank: int = 0) -> float:
    """A deterministic log-probability for the `rank`-th candidate of a generated token."""
    base = -((seed * 31 + index * 17) % 997) / 997.0
    return round(base - 1.5 * rank, 6)


def completion_logprobs(
    seed: int, start: int, pieces: Sequence[str], alternatives: Sequence[Sequence[str]]
) -> dict[str, Any]:
    """LogProbs of /v1/completions (to_openai_style_logprobs): offsets are -1 in SGLang."""
    n = len(pieces)
    return {
        "text_offset": [-1] * n,
        "token_logprobs": [token_logprob(seed, start + i) for i in range(n)],
        "tokens": list(pieces),
        "top_logprobs": [
            {tok: token_logprob(seed, start + i, r) for r, tok in enumerate(alts)}
            for i, alts in enumerate(alternatives)
        ],
    }


def chat_logprobs(
    seed: int, start: int, pieces: Sequence[str], alternatives: Sequence[Sequence[str]]
) -> dict[str, Any]:
    """ChoiceLogprobs of chat: one entry per token with its bytes and its top alternatives."""
    content = []
    for i, tok in enumerate(pieces):
        top = [
            {"token": t, "bytes": list(t.encode()), "logprob": token_logprob(seed, start + i, r)}
            for r, t in enumerate(alternatives[i])
        ]
        content.append(
            {
                "token": tok,
                "bytes": list(tok.encode()),
                "logprob": token_logprob(seed, start + i),
                "top_logprobs": top,
            }
        )
    return {"content": content}
