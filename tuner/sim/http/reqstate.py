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
    #: a stop string SGLang would match: (tokens when it matches, the string, text length kept)
    stop: tuple[int, str, int] | None = None
    #: the client asked for a stream (SGLang 0.5.23's `is_streaming` metric label)
    stream: bool = False
    _ids: list[int] = field(default_factory=list)
    _text: list[str] = field(default_factory=list)

    def output_ids(self) -> list[int]:
        """Generated ids so far (rendered lazily, once per token)."""
        for i in range(len(self._ids), self.completion_tokens):
            tid = tokens.output_token_id(self.seed, i)
            self._ids.append(tid)
            self._text.append(tokens.piece(tid))
        return self._ids

    @property
    def stopped_by_string(self) -> bool:
        """Finished on its stop string (not EOS, not length)."""
        return (
            self.stop is not None
            and self.finished
            and self.completion_tokens == self.stop[0]
            and (self.finish_reason or {}).get("type") == "stop"
        )

    def reason(self) -> dict | None:
        """SGLang's finish_reason: the engine's, with `matched` the stop string when it matched."""
        if self.stopped_by_string:
            assert self.stop is not None
            return {"type": "stop", "matched": self.stop[1]}
        return self.finish_reason

    def text(self, start: int = 0) -> str:
        """Generated text from token `start` on (cumulative when start is 0).

        Ended by a stop string, the text ends before it, as SGLang trims it (the part of a
        multi-token stop string that an earlier chunk already carried stays sent).
        """
        self.output_ids()
        out = "".join(self._text[start : self.completion_tokens])
        if self.stopped_by_string:
            assert self.stop is not None
            before = sum(len(t) for t in self._text[:start]) if start else 0
            out = out[: max(0, self.stop[2] - before)]
        return out
