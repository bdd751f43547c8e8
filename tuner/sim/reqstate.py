"""A request in flight in the real-time simulator: the engine loop writes it, a handler reads it.

Tokens so far, timings, and the event a streaming handler waits on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tuner.sim import tokens


@dataclass
class ReqState:
    """One request in flight, updated by the engine loop and read by its HTTP handler."""

    rid: str
    seed: int
    prompt_tokens: int
    created: float
    completion_tokens: int = 0
    cached_tokens: int = 0
    finished: bool = False
    finish_reason: dict | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: list[int] = field(default_factory=list)
    _text: list[str] = field(default_factory=list)

    def output_ids(self) -> list[int]:
        """Generated ids so far (rendered lazily, once per token)."""
        for i in range(len(self._ids), self.completion_tokens):
            tid = tokens.output_token_id(self.seed, i)
            self._ids.append(tid)
            self._text.append(f"tok{tid} ")
        return self._ids

    def text(self, start: int = 0) -> str:
        """Generated text from token `start` on (cumulative when start is 0)."""
        self.output_ids()
        return "".join(self._text[start : self.completion_tokens])
