"""Text <-> token ids without a tokenizer. Pure.

One token per whitespace-separated word; a word's id is a stable hash, so equal text gives equal
ids and prefix caching works on text prompts too. Generated tokens render as words `tok<id> `.
The load generator uses `count_tokens` when it must estimate a prompt's length.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

#: ids below this are "special" in real tokenizers; keep word ids clear of them
ID_OFFSET = 1000
ID_SPACE = 100_000
#: the id the simulated model emits as its end-of-sequence token (`matched` in a stop reason)
EOS_TOKEN_ID = 2


def word_id(word: str) -> int:
    """The id of one word: stable across processes and Python versions (crc32, not hash())."""
    return zlib.crc32(word.encode("utf-8")) % ID_SPACE + ID_OFFSET


def encode(text: str) -> list[int]:
    """Token ids of a text: one per whitespace-separated word."""
    return [word_id(w) for w in text.split()]


def count_tokens(text: str) -> int:
    """How many tokens `encode(text)` would give, without building the list."""
    return len(text.split())


def output_token_id(rid_seed: int, index: int) -> int:
    """The id of the `index`-th generated token of a request (deterministic, cheap)."""
    return (rid_seed * 1_000_003 + index * 7_919) % ID_SPACE + ID_OFFSET


def render(ids: Sequence[int]) -> str:
    """Text of generated ids: `tok<id> ` per token (a trailing space keeps deltas joinable)."""
    return "".join(f"tok{i} " for i in ids)


def chat_prompt_ids(messages: Sequence[dict]) -> list[int]:
    """Token ids of an OpenAI chat message list: a role word, then the content's words.

    Roughly what a chat template adds (one role token per message), so a shared system prompt
    gives a shared token prefix.
    """
    ids: list[int] = []
    for msg in messages:
        ids.append(word_id(f"<|{msg.get('role', 'user')}|>"))
        content = msg.get("content") or ""
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        ids.extend(encode(str(content)))
    ids.append(word_id("<|assistant|>"))
    return ids
