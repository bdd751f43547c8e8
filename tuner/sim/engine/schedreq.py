"""A request inside the simulated scheduler, and how it ends. Pure."""

from __future__ import annotations

import zlib

from tuner.sim import tokens
from tuner.sim.engine.radix import Node


class SchedReq:
    """A request inside the scheduler (mutable; never leaves the engine)."""

    __slots__ = (
        "alloc",
        "cached",
        "extend",
        "filled",
        "ignore_eos",
        "keys",
        "max_new",
        "out",
        "output_seed",
        "path",
        "prefix",
        "prompt_len",
        "reason",
        "rid",
        "rid_seed",
        "seen",
        "start",
        "state",
        "stop_after",
        "tail",
        "times",
    )

    def __init__(self, rid: str, prompt_len: int, keys: list[int], max_new: int, stop: int | None):
        self.rid = rid
        self.rid_seed = zlib.crc32(rid.encode())
        self.prompt_len = prompt_len
        self.keys = keys  # chain keys of the prompt's full blocks
        self.tail: tuple[int, ...] = ()  # prompt ids after the last full block
        self.output_seed: int | None = None  # the HTTP layer's seed for generated token ids
        self.max_new = max_new
        self.stop_after = stop
        self.ignore_eos = stop is None
        self.out = 0  # tokens generated
        self.path: list[Node] = []  # locked cache nodes (the shared prefix)
        self.alloc = 0  # private KV slots beyond the prefix, page-rounded
        self.prefix = 0  # tokens in `path`
        self.filled = 0  # tokens whose KV exists (prefix + private)
        self.extend = 0  # tokens prefilled in the current batch
        self.cached = 0  # cached tokens at first admission (reported)
        self.seen = False  # admitted at least once
        self.state = "waiting"  # waiting | chunked | running | done
        self.reason: dict | None = None  # finish reason once done
        self.start = 0.0  # virtual time it was added
        self.times: list[float] | None = None  # token times, only when the engine tracks them

    @property
    def fill_len(self) -> int:
        return self.prompt_len + self.out


def abort_reason(message: str) -> dict:
    """SGLang's finish_reason of an aborted request."""
    return {"type": "abort", "message": message}


def finish_reason(req: SchedReq) -> dict | None:
    """SGLang's finish_reason once the request has its last token, else None."""
    if req.out >= req.max_new:
        return {"type": "length", "length": req.max_new}
    if req.stop_after is not None and req.out >= req.stop_after:
        return {"type": "stop", "matched": tokens.EOS_TOKEN_ID}
    return None
