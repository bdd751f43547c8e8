"""The simulator's prefix cache: a GPU radix tree of page-aligned token blocks, plus HiCache's
per-rank host tier of evicted prefixes. Pure (no I/O, no clock: the caller passes `now`).

Why blocks: SGLang's RadixCache matches token by token (pages when page_size > 1). Walking a
4k-token prompt token by token on every admission would dominate the simulator, so prompts are
cut into blocks of `block_size(page_size)` tokens (16, or the page size when larger) and each
block is keyed by a chain hash of its tokens and its parent's key. A match is one dict lookup per
block. The cost: cached-token counts are rounded down to a block, which moves throughput by
well under a percent.

Memory accounting follows SGLang's: a node on the GPU holds `block` KV slots; nodes locked by a
running request are not evictable; unlocked GPU nodes are `evictable` (counted as free by the
scheduler) and leave the GPU in LRU order, leaves first. With a host tier, a node evicted from the
GPU stays on the host (write_through: copied when inserted; write_through_selective: copied once
hit twice; write_back: copied at eviction, blocking) and a later match can load it back.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

#: SGLang loads host-only prefixes back only when they are at least this long (tokens)
LOAD_BACK_THRESHOLD = 10
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")


def block_size(page_size: int) -> int:
    """Tokens per cache block: at least 16, always a whole number of pages."""
    page = max(1, page_size)
    return page * max(1, -(-16 // page))


def chain_keys(ids: Sequence[int], block: int, start_key: int = 0, first: int = 0) -> list[int]:
    """Chain-hash keys of the full blocks of `ids`: key i covers ids[0 : (i+1)*block].

    `hash()` of a tuple of ints is the same in every process (no hash randomisation for ints).
    """
    keys: list[int] = []
    parent = start_key
    tup = tuple(ids)
    for start in range(first, len(tup) - block + 1, block):
        parent = hash((parent, tup[start : start + block]))
        keys.append(parent)
    return keys


class Node:
    """One block of KV in the tree (GPU, host, or both)."""

    __slots__ = (
        "children",
        "gpu",
        "hits",
        "host",
        "key",
        "last",
        "lock",
        "n_gpu_children",
        "parent",
    )

    def __init__(self, key: int, parent: Node | None):
        self.key = key
        self.parent = parent
        self.children: set[Node] = set()
        self.lock = 0
        self.last = 0.0
        self.gpu = False
        self.host = False
        self.hits = 0
        self.n_gpu_children = 0


class RadixCache:
    """GPU prefix cache with an optional host LRU tier (HiCache), counted in tokens."""

    def __init__(self, block: int, host_tokens: int = 0, write_policy: str = "write_through"):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache write policy must be one of {', '.join(WRITE_POLICIES)}")
        self.block = block
        self.host_capacity = max(0, host_tokens) // block * block
        self.write_policy = write_policy
        self._seq = 0
        self.reset()
        # Lifetime counters (survive flush, as Prometheus counters do).
        self.evicted_tokens_total = 0
        self.host_written_tokens_total = 0

    def reset(self) -> None:
        """Drop every node on GPU and host (flush_cache); callers hold no locks by then."""
        self.root = Node(0, None)
        self.root.gpu = True
        self.root.lock = 1
        self.nodes: dict[int, Node] = {}
        self.gpu_tokens = 0
        self.evictable = 0
        self.host_used = 0
        self._gpu_heap: list[tuple[float, int, Node]] = []
        self._host_heap: list[tuple[float, int, Node]] = []
        self._async_write = 0  # tokens copied to host in the background since last take_io()
        self._blocking_write = 0  # tokens copied to host while the scheduler waited

    @property
    def hicache(self) -> bool:
        """True when a host tier exists."""
        return self.host_capacity > 0

    # --- matching -------------------------------------------------------------------------

    def match(self, keys: Sequence[int], limit: int) -> tuple[list[Node], list[Node]]:
        """Nodes matching the first `limit` keys: the GPU prefix, then host-only nodes after it."""
        nodes = self.nodes
        gpu: list[Node] = []
        host: list[Node] = []
        for i in range(min(limit, len(keys))):
            node = nodes.get(keys[i])
            if node is None:
                break
            if node.gpu and not host:
                gpu.append(node)
            elif node.host and not node.gpu:
                host.append(node)
            else:
                break
        if self.host_capacity == 0 or len(host) * self.block < LOAD_BACK_THRESHOLD:
            host = []
        return gpu, host

    def touch(self, path: Sequence[Node], now: float) -> None:
        """Record a hit on `path` (LRU time; write_through_selective backs up twice-hit nodes)."""
        selective = self.host_capacity and self.write_policy == "write_through_selective"
        for node in path:
            node.last = now
            node.hits += 1
            if selective and not node.host and node.hits >= 2 and self._host_alloc(now):
                node.host = True
                self._async_write += self.block

    # --- locking ----------------------------------------------------------------------------

    def lock(self, path: Sequence[Node]) -> None:
        """A request uses these nodes: they are no longer evictable."""
        block = self.block
        for node in path:
            if node.lock == 0:
                self.evictable -= block
            node.lock += 1

    def unlock(self, path: Sequence[Node], now: float) -> None:
        """A request released these nodes: unlocked GPU leaves become eviction candidates."""
        block = self.block
        for node in path:
            node.lock -= 1
            if node.lock == 0:
                node.last = now
                self.evictable += block
                if node.n_gpu_children == 0:
                    self._push_gpu(node)

    def unlocked_tokens(self, path: Sequence[Node]) -> int:
        """Tokens of `path` that locking it would take out of `evictable`."""
        return sum(self.block for n in path if n.lock == 0)

    # --- insertion and load-back -------------------------------------------------------------

    def insert(self, keys: Sequence[int], path: list[Node], now: float) -> int:
        """Extend a request's locked `path` along `keys`; returns how many blocks were added.

        The request's own KV slots for those blocks become the tree's (or are freed when another
        request inserted the same block first): the caller drops them from its private count.
        """
        parent = path[-1] if path else self.root
        added = 0
        write_through = self.host_capacity and self.write_policy == "write_through"
        for key in keys[len(path) :]:
            node = self.nodes.get(key)
            if node is None:
                node = Node(key, parent)
                self.nodes[key] = node
                parent.children.add(node)
            if not node.gpu:
                self._to_gpu(node)
                if write_through and not node.host and self._host_alloc(now):
                    node.host = True
                    self._async_write += self.block
            node.last = now
            if node.lock == 0:
                self.evictable -= self.block
            node.lock += 1
            path.append(node)
            parent = node
            added += 1
        return added

    def load_back(self, host_nodes: Sequence[Node]) -> None:
        """Host-only nodes get GPU slots again (the caller made room and will lock them)."""
        for node in host_nodes:
            self._to_gpu(node)

    def _to_gpu(self, node: Node) -> None:
        node.gpu = True
        self.gpu_tokens += self.block
        if node.lock == 0:
            self.evictable += self.block
        parent = node.parent
        if parent is not None:
            parent.n_gpu_children += 1

    # --- eviction ---------------------------------------------------------------------------

    def evict(self, tokens: int, now: float) -> int:
        """Free at least `tokens` GPU slots from unlocked leaves in LRU order; returns freed."""
        freed = 0
        heap = self._gpu_heap
        block = self.block
        while freed < tokens and heap:
            last, _, node = heapq.heappop(heap)
            if (
                not node.gpu
                or node.lock
                or node.n_gpu_children
                or last != node.last
                or self.nodes.get(node.key) is not node
            ):
                continue  # stale entry: the node changed since it was pushed
            node.gpu = False
            self.gpu_tokens -= block
            self.evictable -= block
            self.evicted_tokens_total += block
            freed += block
            parent = node.parent
            if parent is not None:
                parent.n_gpu_children -= 1
                if parent.lock == 0 and parent.n_gpu_children == 0:  # the root stays locked
                    self._push_gpu(parent)
            backup = self.host_capacity and self.write_policy == "write_back"
            if backup and not node.host and self._host_alloc(now):
                node.host = True  # write_back: copied now, and the scheduler waits for it
                self._blocking_write += block
            if node.host:
                if not node.children:
                    self._push_host(node)
            else:
                self._delete(node)
        return freed

    def _host_alloc(self, now: float) -> bool:
        """Room for one block on the host, evicting host-only LRU leaves if needed."""
        block = self.block
        heap = self._host_heap
        while self.host_used + block > self.host_capacity:
            if not heap:
                return False
            last, _, node = heapq.heappop(heap)
            if (
                not node.host
                or node.gpu
                or node.children
                or last != node.last
                or self.nodes.get(node.key) is not node
            ):
                continue
            node.host = False
            self.host_used -= block
            self._delete(node)
        self.host_used += block
        return True

    def _delete(self, node: Node) -> None:
        """Remove a node that is on neither tier, with any host-only descendants."""
        stack = [node]
        while stack:
            cur = stack.pop()
            stack.extend(cur.children)
            cur.children = set()
            if cur.host:
                cur.host = False
                self.host_used -= self.block
            if self.nodes.get(cur.key) is cur:
                del self.nodes[cur.key]
        parent = node.parent
        if parent is not None:
            parent.children.discard(node)
            if parent is not self.root and parent.host and not parent.gpu and not parent.children:
                self._push_host(parent)

    def _push_gpu(self, node: Node) -> None:
        self._seq += 1
        heapq.heappush(self._gpu_heap, (node.last, self._seq, node))

    def _push_host(self, node: Node) -> None:
        self._seq += 1
        heapq.heappush(self._host_heap, (node.last, self._seq, node))

    def take_io(self) -> tuple[int, int]:
        """(background, blocking) tokens written to the host since the last call."""
        out = (self._async_write, self._blocking_write)
        self.host_written_tokens_total += out[0] + out[1]
        self._async_write = self._blocking_write = 0
        return out
