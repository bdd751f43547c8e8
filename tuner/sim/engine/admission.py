"""Admission: SGLang's PrefillAdder (schedule_policy.py) over the simulator's KV accounting. Pure.

A prefill batch takes waiting requests while their prompt plus a reserve for their output fits in
free + evictable KV slots, after what running requests may still write
(`new_token_ratio x remaining max_new_tokens`, clipped at 4096), within `--max-prefill-tokens`
and `--chunked-prefill-size`. With the radix cache disabled, requests that run to max_new_tokens
use SGLang's stricter "can everyone finish" check (add_one_req_ignore_eos).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from tuner.sim.engine.kvpool import KVPool
from tuner.sim.engine.radix import Node
from tuner.sim.engine.schedreq import SchedReq
from tuner.sim.engine.schedtypes import EngineParams

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
IGNORE_EOS_RESERVE_TOKENS = 1


CONTINUE, NO_TOKEN, OTHER = 0, 1, 2


class PrefillAdder:
    """One round of SGLang's PrefillAdder: the token budgets of a prefill batch being formed."""

    def __init__(
        self, params: EngineParams, pool: KVPool, running: Sequence[SchedReq], ratio: float
    ):
        self.pool = pool
        self.running = running
        self.ratio = ratio  # new_token_ratio: how much of its max_new_tokens a request writes
        self.rem_input = params.max_prefill_tokens
        chunk = params.chunked_prefill_size
        self.rem_chunk: int | None = chunk if chunk > 0 else None
        # What running requests may still write, at the current estimate of how much they will.
        self.offset = sum(
            min(max(r.max_new - r.out, 0), CLIP_MAX_NEW_TOKENS) * ratio for r in running
        )
        self.cur_rem = pool.free() + pool.evictable()
        self.can_run: list[SchedReq] = []
        self.new_chunked: SchedReq | None = None
        self.log_hit = 0
        self.log_input = 0
        self.load_tokens = 0
        self.req_states: list[tuple[float, int]] | None = None

    def rem_total(self) -> float:
        return self.pool.free() + self.pool.evictable() - self.offset

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
        req.extend = max(min(need, rem), min(need, self.pool.page))
        self.can_run.append(req)
        self._budget(0, req.extend, 0 if truncated else min(req.max_new, CLIP_MAX_NEW_TOKENS))
        self.new_chunked = req if truncated else None

    def add_one(self, req: SchedReq) -> int:
        """Try to admit one waiting request (SGLang's add_one_req)."""
        pool = self.pool
        gpu: list[Node] = []
        host: list[Node] = []
        if pool.cache is not None:
            gpu, host = pool.cache.match(req.keys, (req.fill_len - 1) // pool.block)
        prefix = len(gpu) * pool.block
        extend = req.fill_len - prefix
        verdict = self._reserve(req, gpu, extend)
        if verdict != CONTINUE:
            return verdict
        load = self._load_back(host)
        if load:
            gpu = gpu + host
            prefix += load
            extend -= load
        input_tokens = pool.page_ceil(extend)
        if input_tokens >= self.rem_input and self.can_run:
            self._unlock(gpu)
            return OTHER
        if self.rem_chunk is None or input_tokens <= self.rem_chunk:
            req.extend = extend
            max_new = min(req.max_new, CLIP_MAX_NEW_TOKENS)
        else:
            trunc = self.rem_chunk // pool.page * pool.page
            if trunc <= 0:
                self._unlock(gpu)
                return OTHER
            req.extend = trunc
            input_tokens = trunc
            max_new = 0
            self.new_chunked = req
        pool.accept(req, gpu, prefix)
        self.load_tokens += load
        self.can_run.append(req)
        self._budget(prefix, input_tokens, max_new)
        return self._state()

    def _reserve(self, req: SchedReq, gpu: list[Node], extend: int) -> int:
        """Room for the prompt and its output reserve; locks the GPU prefix when there is."""
        cache = self.pool.cache
        if cache is None and req.ignore_eos:
            return CONTINUE if self._fits_ignore_eos(req, extend) else NO_TOKEN
        total = extend + min(max(req.max_new - req.out, 0), CLIP_MAX_NEW_TOKENS)
        if total >= self.rem_total():
            return NO_TOKEN
        if self.pool.page_ceil(extend) >= self.rem_input and self.can_run:
            return OTHER
        if cache is not None:
            cache.lock(gpu)
            if total >= self.rem_total():  # locking our own prefix made it unevictable
                cache.unlock(gpu, self.pool.tick)
                return NO_TOKEN
        return CONTINUE

    def _load_back(self, host: list[Node]) -> int:
        """Bring a host-tier prefix back to the GPU (locked) if it fits; the tokens loaded."""
        pool = self.pool
        if not host or pool.cache is None or not pool.ensure_free(len(host) * pool.block):
            return 0
        pool.cache.load_back(host)
        pool.cache.lock(host)
        return len(host) * pool.block

    def _unlock(self, path: list[Node]) -> None:
        if self.pool.cache is not None:
            self.pool.cache.unlock(path, self.pool.tick)

    def _fits_ignore_eos(self, req: SchedReq, extend: int) -> bool:
        """SGLang's add_one_req_ignore_eos: admit only if every request can run to the end."""
        if self.pool.page_ceil(extend) > min(self.cur_rem, self.rem_total()):
            return False
        ratio = self.ratio

        def state(r: SchedReq) -> tuple[float, int] | None:
            left = r.max_new * (1.0 if r.ignore_eos else ratio) - r.out
            return (left, r.prompt_len + r.out) if left > 0 else None

        if self.req_states is None:
            found = [state(r) for r in (req, *self.running, *self.can_run)]
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
