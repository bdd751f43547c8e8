"""The GPU KV pool of the simulated scheduler: free, cached and private slots. Pure.

Every KV slot is free, held by the prefix cache (evictable when no request locks it), or private
to one request (its tokens past the cached prefix, page-rounded). SGLang counts evictable cache
as free when it admits; the pool evicts it (LRU, radix.py) only when an allocation needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.sim import tokens
from tuner.sim.engine.radix import Node, RadixCache, block_size, chain_keys
from tuner.sim.engine.schedreq import SchedReq


class KVPool:
    """KV slot accounting over an optional radix cache; `tick` is the cache's LRU clock."""

    def __init__(
        self, total: int, page_size: int, cache: bool, host_tokens: int, write_policy: str
    ):
        self.total = total
        self.page = max(1, page_size)
        self.block = block_size(self.page)
        self.cache: RadixCache | None = None
        if cache:
            self.cache = RadixCache(self.block, host_tokens, write_policy)
        self.private = 0  # KV slots held by requests outside the cache tree
        self.tick = 0  # scheduler iterations: the cache's notion of "now"

    @property
    def hicache(self) -> bool:
        """True when evicted prefixes go to a host tier."""
        return self.cache is not None and self.cache.hicache

    def page_ceil(self, n_tokens: int) -> int:
        """`n_tokens` rounded up to whole pages."""
        page = self.page
        return -(-n_tokens // page) * page

    def free(self) -> int:
        """Slots neither private nor in the cache tree."""
        cache_tokens = self.cache.gpu_tokens if self.cache is not None else 0
        return self.total - self.private - cache_tokens

    def evictable(self) -> int:
        """Cached slots no request locks."""
        return self.cache.evictable if self.cache is not None else 0

    def used(self) -> int:
        """Slots SGLang reports as used (private plus locked cache)."""
        return self.total - self.free() - self.evictable()

    def ensure_free(self, n_tokens: int) -> bool:
        """Evict until `n_tokens` slots are free; False if even that is not enough."""
        free = self.free()
        if free >= n_tokens:
            return True
        if self.cache is not None:
            self.cache.evict(n_tokens - free, self.tick)
        return self.free() >= n_tokens

    def accept(self, req: SchedReq, path: list[Node], prefix: int) -> None:
        """Admission took `req` with `path` (locked) as its prefix."""
        req.path = path
        req.prefix = prefix
        req.filled = prefix
        req.alloc = 0
        if self.cache is not None:
            self.cache.touch(path, self.tick)
        if not req.seen:
            req.seen = True
            req.cached = prefix

    def release(self, req: SchedReq) -> None:
        """Give back a request's KV: unlock its prefix, free its private slots."""
        if self.cache is not None and req.path:
            self.cache.unlock(req.path, self.tick)
        req.path = []
        req.prefix = 0
        self.private -= req.alloc
        req.alloc = 0
        req.filled = 0

    def extend_need(self, batch: Sequence[SchedReq]) -> int:
        """Slots a prefill batch allocates for the tokens it extends by."""
        page_ceil = self.page_ceil
        return sum(page_ceil(r.filled + r.extend - r.prefix) - r.alloc for r in batch)

    def extend(self, req: SchedReq) -> None:
        """Allocate a prefilled request's new tokens; its full prompt blocks join the cache."""
        end = req.filled + req.extend
        alloc = self.page_ceil(end - req.prefix)
        self.private += alloc - req.alloc
        req.alloc = alloc
        req.filled = end
        req.extend = 0
        if self.cache is not None:
            self.insert(req, req.keys[: min(len(req.keys), end // self.block)])

    def decode_need(self, reqs: Sequence[SchedReq], reserve: int = 1) -> int:
        """Slots the next decode step allocates (a page for each request at a page end), or,
        under speculative decoding, `reserve` slots (in whole pages) per request."""
        page = self.page
        if page == 1:
            return len(reqs) * reserve
        if reserve > 1:
            return len(reqs) * self.page_ceil(reserve)
        return page * sum(1 for r in reqs if r.filled - r.prefix >= r.alloc)

    def retire(self, req: SchedReq) -> None:
        """A finished request leaves its KV to the cache (SGLang's cache_finished_req)."""
        if self.cache is not None:
            self.insert(req, self.sequence_keys(req))
        self.release(req)

    def insert(self, req: SchedReq, keys: Sequence[int]) -> None:
        """Move the request's full blocks into the cache tree (SGLang's cache_*_req)."""
        if self.cache is None or len(keys) <= len(req.path):
            return
        added = self.cache.insert(keys, req.path, self.tick) * self.block
        req.prefix += added
        req.alloc -= added
        self.private -= added

    def sequence_keys(self, req: SchedReq) -> list[int]:
        """Keys of every full block with KV: the prompt's, then the generated tokens'.

        With `output_seed`, generated tokens get the ids their rendered text encodes back to
        (tokens.py), so a follow-up turn that sends the answer back matches it; otherwise keys no prompt
        can match.
        """
        block = self.block
        blocks = req.filled // block
        keys = req.keys[:blocks]
        if blocks <= len(keys):
            return keys
        parent = keys[-1] if keys else 0
        if req.output_seed is None:
            for j in range(len(keys), blocks):
                parent = hash((parent, req.rid_seed, j))
                keys.append(parent)
            return keys
        n_out = req.filled - req.prompt_len
        seed = req.output_seed
        out = [tokens.output_token_id(seed, i) for i in range(n_out)]
        return keys + chain_keys((*req.tail, *out), block, start_key=parent)
