"""Admission: SGLang's PrefillAdder (schedule_policy.py) over the simulator's KV accounting. Pure.

A prefill batch takes waiting requests while their prompt plus a reserve for their output fits in
free + evictable KV slots, after what running requests may still write
(`new_token_ratio x remaining max_new_tokens`, clipped at 4096), within `--max-prefill-tokens`
and `--chunked-prefill-size`. With the radix cache disabled, requests that run to max_new_tokens
use SGLang's stricter "can everyone finish" check (add_one_req_ignore_eos).
"""

from __future__ import annotations

import zlib
from bisect import bisect_right
from typing import TYPE_CHECKING

from tuner.sim.radix import Node

if TYPE_CHECKING:
    from tuner.sim.engine import Engine

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
IGNORE_EOS_RESERVE_TOKENS = 1


class SchedReq:
    """A request inside the scheduler (mutable; never leaves the engine)."""

    __slots__ = (
        "alloc", "cached", "extend", "filled", "ignore_eos", "index", "keys", "max_new", "out",
        "output_seed", "path", "prefix", "prompt_len", "reason", "rid", "rid_seed", "seen",
        "start", "state", "stop_after", "tail", "times",
    )  # fmt: skip

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
        self.index = -1  # closed-loop bookkeeping
        self.start = 0.0
        self.times: list[float] | None = None  # token times, only when run_closed_loop tracks

    @property
    def fill_len(self) -> int:
        return self.prompt_len + self.out


def abort_reason(message: str) -> dict:
    """SGLang's finish_reason of an aborted request."""
    return {"type": "abort", "message": message}


CONTINUE, NO_TOKEN, OTHER = 0, 1, 2


class PrefillAdder:
    """One round of SGLang's PrefillAdder: the token budgets of a prefill batch being formed."""

    def __init__(self, eng: Engine, running_bs: int):
        p = eng.params
        self.eng = eng
        self.rem_input = p.max_prefill_tokens
        self.rem_chunk: int | None = p.chunked_prefill_size if p.chunked_prefill_size > 0 else None
        ratio = eng._ratio
        # What running requests may still write, at the current estimate of how much they will.
        self.offset = sum(
            min(max(r.max_new - r.out, 0), CLIP_MAX_NEW_TOKENS) * ratio for r in eng._running
        )
        self.cur_rem = eng._free() + eng._evictable()
        self.can_run: list[SchedReq] = []
        self.new_chunked: SchedReq | None = None
        self.log_hit = 0
        self.log_input = 0
        self.load_tokens = 0
        self.req_states: list[tuple[float, int]] | None = None

    def rem_total(self) -> float:
        return self.eng._free() + self.eng._evictable() - self.offset

    def _budget(self, prefix: int, input_tokens: int, max_new: int) -> None:
        self.offset += input_tokens + max_new
        self.cur_rem -= input_tokens
        self.rem_input -= input_tokens
        if self.rem_chunk is not None:
            self.rem_chunk -= input_tokens
        self.log_hit += prefix
        self.log_input += input_tokens

    def _state(self) -> int:
        if self.rem_total() <= 0 or self.cur_rem <= 0:
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return CONTINUE

    def add_chunked(self, req: SchedReq) -> None:
        """The request being chunk-prefilled gets the next chunk first."""
        assert self.rem_chunk is not None
        rem = min(self.rem_chunk, int(self.rem_total()))
        need = req.fill_len - req.filled
        truncated = need > rem
        req.extend = max(min(need, rem), min(need, self.eng._page))
        self.can_run.append(req)
        self._budget(0, req.extend, 0 if truncated else min(req.max_new, CLIP_MAX_NEW_TOKENS))
        self.new_chunked = req if truncated else None

    def add_one(self, req: SchedReq) -> int:
        """Try to admit one waiting request (SGLang's add_one_req)."""
        eng = self.eng
        cache = eng._cache
        gpu: list[Node] = []
        host: list[Node] = []
        if cache is not None:
            gpu, host = cache.match(req.keys, (req.fill_len - 1) // eng._block)
        prefix = len(gpu) * eng._block
        extend = req.fill_len - prefix
        if cache is None and req.ignore_eos:
            if not self._fits_ignore_eos(req, extend):
                return NO_TOKEN
        else:
            total = extend + min(max(req.max_new - req.out, 0), CLIP_MAX_NEW_TOKENS)
            if total >= self.rem_total():
                return NO_TOKEN
            if eng._page_ceil(extend) >= self.rem_input and self.can_run:
                return OTHER
            if cache is not None:
                cache.lock(gpu)
                if total >= self.rem_total():  # locking our own prefix made it unevictable
                    cache.unlock(gpu, eng._tick)
                    return NO_TOKEN
        load = 0
        if host and cache is not None and eng._ensure_free(len(host) * eng._block):
            cache.load_back(host)
            cache.lock(host)
            gpu = gpu + host
            load = len(host) * eng._block
            prefix += load
            extend -= load
        input_tokens = eng._page_ceil(extend)
        if input_tokens >= self.rem_input and self.can_run:
            if cache is not None:
                cache.unlock(gpu, eng._tick)
            return OTHER
        if self.rem_chunk is None or input_tokens <= self.rem_chunk:
            req.extend = extend
            max_new = min(req.max_new, CLIP_MAX_NEW_TOKENS)
        else:
            trunc = self.rem_chunk // eng._page * eng._page
            if trunc <= 0:
                if cache is not None:
                    cache.unlock(gpu, eng._tick)
                return OTHER
            req.extend = trunc
            input_tokens = trunc
            max_new = 0
            self.new_chunked = req
        eng._accept(req, gpu, prefix, load)
        self.load_tokens += load
        self.can_run.append(req)
        self._budget(prefix, input_tokens, max_new)
        return self._state()

    def _fits_ignore_eos(self, req: SchedReq, extend: int) -> bool:
        """SGLang's add_one_req_ignore_eos: admit only if every request can run to the end."""
        if self.eng._page_ceil(extend) > min(self.cur_rem, self.rem_total()):
            return False
        ratio = self.eng._ratio

        def state(r: SchedReq) -> tuple[float, int] | None:
            left = r.max_new * (1.0 if r.ignore_eos else ratio) - r.out
            return (left, r.prompt_len + r.out) if left > 0 else None

        if self.req_states is None:
            found = [state(r) for r in (req, *self.eng._running, *self.can_run)]
            self.req_states = sorted((s for s in found if s is not None), key=lambda s: s[0])
        else:
            s = state(req)
            if s is not None:
                keys = [x[0] for x in self.req_states]
                self.req_states.insert(bisect_right(keys, s[0]), s)
        cur = self.cur_rem - req.prompt_len
        freed = 0
        n = len(self.req_states)
        for i, (left, occupied) in enumerate(self.req_states):
            bs = n - i
            if cur + freed - left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return False
            freed += occupied
        return True
