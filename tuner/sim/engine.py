"""The simulated SGLang scheduler on a virtual clock. Pure: no asyncio, no wall clock, no I/O.

What it models, after SGLang's scheduler.py / schedule_policy.py (v0.5.6):
- one scheduler iteration per `step()`: a prefill batch when the waiting queue (or a chunked
  request) can be admitted, else one decode step of the running batch; prefill pauses decode;
- admission by free GPU KV slots (free + evictable cache) minus what running requests may still
  need (`new_token_ratio x remaining max_new_tokens`, clipped at 4096), `--max-running-requests`,
  `--max-prefill-tokens`, chunked prefill (`--chunked-prefill-size`), SGLang's `batch_is_full`;
- `new_token_ratio`: starts at 0.7 x conservativeness, decays to 14% of that over 600 decode
  steps, resets when idle, jumps after a retraction (KV full during decode);
- `--disable-radix-cache` with requests that run to max_new_tokens: SGLang's exact "will they
  all finish" admission (add_one_req_ignore_eos), which never retracts;
- a radix prefix cache and HiCache host tier (radix.py); load-back is costed by PCIe. Matches
  are whole 16-token blocks (or pages); a finished request's generated tokens stay cached under
  keys no prompt can match, so a multi-turn follow-up reuses its earlier prompt, not the answer;
- a memory-bound decode step time and a compute-bound prefill time (StepTimeModel) with a
  seeded run-level and step-level noise.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tuner.sim import tokens
from tuner.sim.admission import (
    CONTINUE,
    NO_TOKEN,
    PrefillAdder,
    SchedReq,
    abort_reason,
)
from tuner.sim.radix import Node, RadixCache, block_size, chain_keys
from tuner.sim.timing import StepTimeModel

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
OOM_MESSAGE = "Prefill out of memory. Try to lower your batch size."


class EngineOOM(Exception):
    """The simulated server dies: a prefill batch did not fit in GPU memory."""

    def __init__(self, message: str = OOM_MESSAGE):
        super().__init__(message)


class QueueFull(Exception):
    """`--max-queued-requests` reached (the HTTP layer answers 503 "The request queue is full.")."""


@dataclass(frozen=True)
class EngineParams:
    """The scheduler's resolved configuration (from launch flags + profile, by SIM-SERVER)."""

    max_total_tokens: int
    max_running_requests: int
    page_size: int = 1
    chunked_prefill_size: int = 8192  # <= 0 disables chunking
    max_prefill_tokens: int = 16384
    schedule_conservativeness: float = 1.0
    schedule_policy: str = "fcfs"
    radix_cache: bool = True
    hicache_host_tokens: int = 0  # per-rank host pool in tokens; 0 = HiCache off
    hicache_write_policy: str = "write_through"
    context_len: int = 131072
    decode_log_interval: int = 40
    oom_prefill_tokens: int | None = None  # a prefill batch with more new tokens dies
    max_queued_requests: int | None = None
    seed: int = 0
    cuda_graph_max_bs: int | None = None  # decode batches above it run without CUDA graphs


@dataclass(frozen=True)
class TokenEvent:
    """What one step did to one request (completion_tokens is cumulative)."""

    rid: str
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int
    finished: bool
    finish_reason: dict | None


@dataclass(frozen=True)
class Step:
    """One scheduler iteration: how long it took, what it produced, what SGLang would log."""

    duration_s: float
    events: tuple[TokenEvent, ...]
    log_lines: tuple[str, ...]


@dataclass(frozen=True)
class EngineStats:
    """The scheduler's gauges and counters (SGLang's /metrics names without the prefix)."""

    num_running_reqs: int
    num_queue_reqs: int
    num_used_tokens: int
    token_usage: float
    cache_hit_rate: float
    max_total_num_tokens: int
    num_retracted_reqs: int
    gen_throughput: float
    prompt_tokens_total: int
    generation_tokens_total: int
    cached_tokens_total: int
    num_requests_total: int
    load_back_tokens_total: int
    evicted_tokens_total: int
    retracted_reqs_total: int
    new_token_ratio: float
    host_used_tokens: int
    clock_s: float


class Engine:
    """SGLang's scheduler on a virtual clock: add requests, call `step()` while `has_work()`."""

    def __init__(
        self, params: EngineParams, timing: StepTimeModel, bytes_per_token: int, seed: int = 0
    ):
        if params.max_total_tokens <= 0 or params.max_running_requests <= 0:
            raise ValueError("max_total_tokens and max_running_requests must be positive")
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        self.params = params
        self.timing = replace(timing, bytes_per_token=bytes_per_token)
        self._page = max(1, params.page_size)
        self._block = block_size(self._page)
        self._total = params.max_total_tokens
        self._cache: RadixCache | None = None
        if params.radix_cache:
            self._cache = RadixCache(
                self._block, params.hicache_host_tokens, params.hicache_write_policy
            )
        # One generator per engine; str seeds hash the same in every process.
        self._rng = random.Random(f"sim-engine:{params.seed}:{seed}")
        sigma = timing.noise_run_pct / 100
        self._run_factor = 1.0 + max(-3 * sigma, min(3 * sigma, self._rng.gauss(0.0, sigma)))
        self._step_sigma = timing.noise_step_pct / 100
        self._init_ratio = min(INIT_NEW_TOKEN_RATIO * params.schedule_conservativeness, 1.0)
        self._min_ratio = min(self._init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self._decay = (self._init_ratio - self._min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self._ratio = self._init_ratio
        self._reqs: dict[str, SchedReq] = {}
        self._waiting: list[SchedReq] = []
        self._running: list[SchedReq] = []
        self._chunked: SchedReq | None = None
        self._pending: list[SchedReq] = []  # aborted, reported by the next step
        self._private = 0  # KV slots held by requests outside the cache tree
        self._kv_sum = 0  # KV tokens the running batch attends
        self._batch_full = False
        self._shrunk = False
        self._dead = False
        self._track = False  # run_closed_loop: record token times
        self._clock = 0.0
        self._tick = 0
        self._decode_ct = 0
        self._last_log = 0.0
        self._gen_since_log = 0
        self._gen_throughput = 0.0
        self._retracted_last = 0
        self._c = dict.fromkeys(
            ("prompt", "gen", "cached", "requests", "load_back", "retracted"), 0
        )

    # --- public API ------------------------------------------------------------------------

    def add_request(
        self,
        rid: str,
        input_ids: Sequence[int],
        max_new_tokens: int,
        stop_after: int | None = None,
        output_seed: int | None = None,
    ) -> None:
        """Queue a request.

        `stop_after` ends it with a "stop" reason (EOS) after that many tokens; None means it runs
        to max_new_tokens (ignore_eos). `output_seed` is the seed the HTTP layer renders generated
        tokens with (`tokens.output_token_id`): given, a follow-up prompt that contains the answer
        text hits the cache on it, as multi-turn chat does on SGLang.
        """
        p = self.params
        if rid in self._reqs:
            raise ValueError(f"duplicate request id {rid!r}")
        n = len(input_ids)
        if n == 0:
            raise ValueError("empty prompt")
        if p.max_queued_requests is not None and len(self._waiting) >= p.max_queued_requests:
            raise QueueFull("The request queue is full.")
        keys = chain_keys(input_ids, self._block) if self._cache is not None else []
        max_new = max(1, min(max_new_tokens, p.context_len - n - 1))
        stop = None if stop_after is None else max(1, stop_after)
        req = SchedReq(rid, n, keys, max_new, stop)
        req.output_seed = output_seed
        if output_seed is not None and self._cache is not None:
            req.tail = tuple(input_ids[len(keys) * self._block :])
        req.start = self._clock
        if self._track:
            req.times = []
        limit = min(p.context_len - 1, self._total - 1)
        if n > limit:
            req.state = "done"
            req.reason = abort_reason(
                f"Input length ({n} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )
            self._pending.append(req)
            return
        self._reqs[rid] = req
        self._waiting.append(req)

    def abort(self, rid: str) -> None:
        """Drop a request wherever it is; the next step reports it finished with an abort."""
        req = self._reqs.pop(rid, None)
        if req is None:
            return
        message = "Abort in waiting queue" if req.state == "waiting" else "Abort request"
        if req.state == "waiting":
            self._waiting.remove(req)
        elif req.state == "chunked":
            self._chunked = None
            self._release(req)
        elif req.state == "running":
            self._running.remove(req)
            self._kv_sum -= req.filled
            self._release(req)
            self._shrunk = True
        req.state = "done"
        req.reason = abort_reason(message)
        self._pending.append(req)

    def has_work(self) -> bool:
        """True while any request is queued, running, being prefilled or awaiting its report."""
        return bool(self._waiting or self._running or self._chunked or self._pending)

    def step(self) -> Step:
        """One scheduler iteration. Raises EngineOOM when the simulated server dies."""
        duration, touched, finished, logs = self._advance()
        events = [
            TokenEvent(r.rid, r.out, r.prompt_len, r.cached, r.reason is not None, r.reason)
            for r in touched
        ]
        seen = {id(r) for r in touched}
        events.extend(
            TokenEvent(r.rid, r.out, r.prompt_len, r.cached, True, r.reason)
            for r in finished
            if id(r) not in seen
        )
        return Step(duration, tuple(events), tuple(logs))

    def flush_cache(self) -> bool:
        """Empty the prefix cache (GPU and host); False while requests are pending."""
        if self.has_work():
            return False
        if self._cache is not None:
            self._cache.reset()
        self._ratio = self._init_ratio
        return True

    def stats(self) -> EngineStats:
        """Current gauges and lifetime counters."""
        used = self._used()
        c = self._c
        cache = self._cache
        return EngineStats(
            num_running_reqs=len(self._running),
            num_queue_reqs=len(self._waiting),
            num_used_tokens=used,
            token_usage=used / self._total,
            cache_hit_rate=c["cached"] / c["prompt"] if c["prompt"] else 0.0,
            max_total_num_tokens=self._total,
            num_retracted_reqs=self._retracted_last,
            gen_throughput=self._gen_throughput,
            prompt_tokens_total=c["prompt"],
            generation_tokens_total=c["gen"],
            cached_tokens_total=c["cached"],
            num_requests_total=c["requests"],
            load_back_tokens_total=c["load_back"],
            evicted_tokens_total=cache.evicted_tokens_total if cache else 0,
            retracted_reqs_total=c["retracted"],
            new_token_ratio=self._ratio,
            host_used_tokens=cache.host_used if cache else 0,
            clock_s=self._clock,
        )

    @property
    def clock_s(self) -> float:
        """Virtual seconds elapsed (sum of step durations)."""
        return self._clock

    # --- memory ------------------------------------------------------------------------------

    def _page_ceil(self, tokens: int) -> int:
        page = self._page
        return -(-tokens // page) * page

    def _free(self) -> int:
        cache_tokens = self._cache.gpu_tokens if self._cache is not None else 0
        return self._total - self._private - cache_tokens

    def _evictable(self) -> int:
        return self._cache.evictable if self._cache is not None else 0

    def _used(self) -> int:
        return self._total - self._free() - self._evictable()

    def _ensure_free(self, tokens: int) -> bool:
        free = self._free()
        if free >= tokens:
            return True
        if self._cache is not None:
            self._cache.evict(tokens - free, self._tick)
        return self._free() >= tokens

    def _accept(self, req: SchedReq, path: list[Node], prefix: int, load: int) -> None:
        """The adder took `req` with `path` (locked) as its prefix."""
        req.path = path
        req.prefix = prefix
        req.filled = prefix
        req.alloc = 0
        if self._cache is not None:
            self._cache.touch(path, self._tick)
        if not req.seen:
            req.seen = True
            req.cached = prefix
        self._c["load_back"] += load

    def _release(self, req: SchedReq) -> None:
        """Give back a request's KV: unlock its prefix, free its private slots."""
        if self._cache is not None and req.path:
            self._cache.unlock(req.path, self._tick)
        req.path = []
        req.prefix = 0
        self._private -= req.alloc
        req.alloc = 0
        req.filled = 0

    def _insert(self, req: SchedReq, keys: Sequence[int]) -> None:
        """Move the request's full blocks into the cache tree (SGLang's cache_*_req)."""
        if self._cache is None or len(keys) <= len(req.path):
            return
        added = self._cache.insert(keys, req.path, self._tick) * self._block
        req.prefix += added
        req.alloc -= added
        self._private -= added

    def _finish(self, req: SchedReq, reason: dict) -> None:
        req.state = "done"
        req.reason = reason
        self._reqs.pop(req.rid, None)
        if self._cache is not None:
            self._insert(req, self._sequence_keys(req))
        self._release(req)
        c = self._c
        c["requests"] += 1
        c["prompt"] += req.prompt_len
        c["gen"] += req.out
        c["cached"] += req.cached

    def _sequence_keys(self, req: SchedReq) -> list[int]:
        """Keys of every full block with KV: the prompt's, then the generated tokens'.

        With `output_seed`, generated tokens get the ids their rendered text (`tok<id> `) encodes
        to, so a follow-up turn that sends the answer back matches it; otherwise keys no prompt
        can match.
        """
        block = self._block
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
        out = [tokens.word_id(f"tok{tokens.output_token_id(seed, i)}") for i in range(n_out)]
        return keys + chain_keys((*req.tail, *out), block, start_key=parent)

    def _finish_reason(self, req: SchedReq) -> dict | None:
        if req.out >= req.max_new:
            return {"type": "length", "length": req.max_new}
        if req.stop_after is not None and req.out >= req.stop_after:
            return {"type": "stop", "matched": tokens.EOS_TOKEN_ID}
        return None

    # --- one iteration -----------------------------------------------------------------------

    def _advance(self) -> tuple[float, list[SchedReq], list[SchedReq], list[str]]:
        """(duration, requests given a token, requests finished or aborted, log lines)."""
        if self._dead:
            raise EngineOOM()
        self._tick += 1
        finished, self._pending = self._pending, []
        logs: list[str] = []
        touched: list[SchedReq] = []
        if not self._running:
            self._batch_full = False  # an empty running batch is never full
        duration = self._prefill(touched, finished, logs)
        if duration is None:
            if self._shrunk:  # SGLang's update_running_batch: finished requests left the batch
                self._batch_full = False
                self._shrunk = False
                if not self._running:  # nothing to decode: the next iteration prefills
                    duration = self._prefill(touched, finished, logs)
            if duration is None:
                duration = self._decode(touched, finished, logs) if self._running else 0.0
        if not self._running and not self._chunked:
            self._ratio = self._init_ratio  # SGLang resets the estimate when idle
        self._clock += duration
        return duration, touched, finished, logs

    def _noisy(self, seconds: float) -> float:
        """Apply the run-level factor and a per-step jitter, plus host-write time."""
        if self._cache is not None and self._cache.hicache:
            background, blocking = self._cache.take_io()
            seconds += self.timing.load_back_s(blocking)
            seconds += self.timing.load_back_s(background) * (1 - self.timing.hicache_write_overlap)
        jitter = 1.0 + self._rng.gauss(0.0, self._step_sigma) if self._step_sigma else 1.0
        return seconds * self._run_factor * max(0.5, jitter)

    def _sort_waiting(self) -> None:
        policy = self.params.schedule_policy
        waiting = self._waiting
        if policy in ("lpm", "dfs-weight") and self._cache is not None and len(waiting) <= 128:
            # Longest cached prefix first; SGLang falls back to FCFS above 128 waiting requests.
            cache, block = self._cache, self._block

            def hit(r: SchedReq) -> int:
                gpu, _ = cache.match(r.keys, (r.fill_len - 1) // block)
                return len(gpu)

            waiting.sort(key=hit, reverse=True)
        elif policy == "lof":
            waiting.sort(key=lambda r: r.max_new, reverse=True)
        elif policy == "random":
            self._rng.shuffle(waiting)

    def _prefill(
        self, touched: list[SchedReq], finished: list[SchedReq], logs: list[str]
    ) -> float | None:
        """Form and run a prefill batch (SGLang's get_new_batch_prefill), or return None."""
        if (self._batch_full or not self._waiting) and self._chunked is None:
            return None
        running_bs = len(self._running)
        allocatable = self.params.max_running_requests - running_bs
        if allocatable <= 0 and self._chunked is None:
            self._batch_full = True
            return None
        if self._waiting:
            self._sort_waiting()
        adder = PrefillAdder(self, running_bs)
        old_chunked = self._chunked
        if old_chunked is not None:
            adder.add_chunked(old_chunked)
        taken = 0
        head_blocked = False
        for req in self._waiting:
            if len(adder.can_run) >= allocatable:
                self._batch_full = True
                break
            before = len(adder.can_run)
            res = adder.add_one(req)
            if len(adder.can_run) > before:
                taken += 1
            if res != CONTINUE:
                head_blocked = not adder.can_run
                if res == NO_TOKEN:
                    if self._cache is not None and self._cache.hicache:
                        self._batch_full = bool(adder.can_run) or bool(self._running)
                    else:
                        self._batch_full = True
                break
        if head_blocked and not self._running and old_chunked is None:
            # Nothing runs and the head can never be admitted (prompt + clipped output >= the
            # pool): SGLang would wait forever; the simulator aborts it so a run cannot hang.
            req = self._waiting.pop(0)
            self._reqs.pop(req.rid, None)
            req.state = "done"
            req.reason = abort_reason("The request does not fit in the KV cache pool.")
            finished.append(req)
            self._batch_full = False
            return 0.0
        if not adder.can_run:
            return None
        del self._waiting[:taken]
        batch = adder.can_run
        self._chunked = adder.new_chunked
        if self._chunked is not None:
            self._chunked.state = "chunked"
        new_tokens = sum(r.extend for r in batch)
        logs.append(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {adder.log_input}, "
            f"#cached-token: {adder.log_hit}, token usage: {self._used() / self._total:.2f}, "
            f"#running-req: {running_bs}, #queue-req: {len(self._waiting)},"
        )
        oom = self.params.oom_prefill_tokens
        if oom is not None and new_tokens > oom:
            self._dead = True
            raise EngineOOM()
        need = 0
        pairs = 0.0
        for r in batch:
            end = r.filled + r.extend
            need += self._page_ceil(end - r.prefix) - r.alloc
            pairs += r.extend * r.filled + r.extend * (r.extend + 1) / 2
        if not self._ensure_free(need):
            self._dead = True
            raise EngineOOM()
        compute = self.timing.prefill_s(new_tokens, pairs)
        duration = self._noisy(max(compute, self.timing.load_back_s(adder.load_tokens)))
        t_end = self._clock + duration
        block = self._block
        for r in batch:
            end = r.filled + r.extend
            alloc = self._page_ceil(end - r.prefix)
            self._private += alloc - r.alloc
            r.alloc = alloc
            r.filled = end
            r.extend = 0
            if self._cache is not None:
                self._insert(r, r.keys[: min(len(r.keys), end // block)])
            if r is self._chunked:
                continue
            r.out += 1
            if r.times is not None:
                r.times.append(t_end)
            touched.append(r)
            reason = self._finish_reason(r)
            if reason is not None:
                self._finish(r, reason)
                finished.append(r)
            else:
                r.state = "running"
                self._running.append(r)
                self._kv_sum += r.filled
        return duration

    def _decode(self, touched: list[SchedReq], finished: list[SchedReq], logs: list[str]) -> float:
        """One decode step of the running batch (retracting first if the pool is full)."""
        self._retracted_last = 0
        if not self._ensure_free(self._decode_need(self._running)):
            logs.append(self._retract())
            if not self._ensure_free(self._decode_need(self._running)):
                # One request left whose output outgrew the whole pool (its max_new_tokens
                # above the 4096-token estimate clip): SGLang asserts; the simulator aborts it.
                for r in self._running:
                    self._kv_sum -= r.filled
                    self._finish(r, abort_reason("No space left for only one request"))
                finished.extend(self._running)
                self._running = []
                return 0.0
        else:
            self._ratio = max(self._ratio - self._decay, self._min_ratio)
        running = self._running
        bs = len(running)
        self._kv_sum += bs
        graph_max = self.params.cuda_graph_max_bs
        cuda_graph = graph_max is None or bs <= graph_max
        duration = self._noisy(self.timing.decode_s(bs, self._kv_sum, cuda_graph))
        t_end = self._clock + duration
        page = self._page
        done: list[SchedReq] = []
        if page == 1:
            self._private += bs
        for r in running:
            r.out += 1
            r.filled += 1
            if page == 1:
                r.alloc += 1
            elif r.filled - r.prefix > r.alloc:
                r.alloc += page
                self._private += page
            if r.times is not None:
                r.times.append(t_end)
            if r.out >= r.max_new or (r.stop_after is not None and r.out >= r.stop_after):
                done.append(r)
        touched.extend(running)
        if done:
            gone = {id(r) for r in done}
            self._running = [r for r in running if id(r) not in gone]
            for r in done:
                self._kv_sum -= r.filled
                self._finish(r, self._finish_reason(r) or {})
            finished.extend(done)
            self._shrunk = True
        self._decode_ct += 1
        self._gen_since_log += bs
        if self._decode_ct % max(1, self.params.decode_log_interval) == 0:
            elapsed = t_end - self._last_log
            self._gen_throughput = self._gen_since_log / elapsed if elapsed > 0 else 0.0
            self._last_log = t_end
            self._gen_since_log = 0
            used = self._used()
            logs.append(
                f"Decode batch, #running-req: {bs}, #token: {used}, "
                f"token usage: {used / self._total:.2f}, cuda graph: {cuda_graph}, "
                f"gen throughput (token/s): {self._gen_throughput:.2f}, "
                f"#queue-req: {len(self._waiting)},"
            )
        return duration

    def _decode_need(self, reqs: Sequence[SchedReq]) -> int:
        """KV slots the next decode step allocates (a page for each request at a page end)."""
        page = self._page
        if page == 1:
            return len(reqs)
        return page * sum(1 for r in reqs if r.filled - r.prefix >= r.alloc)

    def _retract(self) -> str:
        """Free KV by sending the youngest, longest-prompt requests back to the queue."""
        order = sorted(self._running, key=lambda r: (r.out, -r.prompt_len), reverse=True)
        retracted: list[SchedReq] = []
        first = True
        while first or not self._ensure_free(self._decode_need(order)):
            if len(order) == 1:
                break
            first = False
            r = order.pop()
            self._kv_sum -= r.filled
            self._release(r)
            r.state = "waiting"
            retracted.append(r)
        gone = {id(r) for r in retracted}
        self._running = [r for r in self._running if id(r) not in gone]
        decoded = sum(r.out for r in self._running)
        max_new = sum(r.max_new for r in self._running)
        old = self._ratio
        self._ratio = min(
            1.0, (decoded + RETRACT_DECODE_STEPS * len(self._running)) / max(max_new, 1)
        )
        self._waiting.extend(retracted)
        self._batch_full = False
        self._retracted_last = len(retracted)
        self._c["retracted"] += len(retracted)
        return (
            "KV cache pool is full. Retract requests. "
            f"#retracted_reqs: {len(retracted)}, #new_token_ratio: {old:.4f} -> {self._ratio:.4f}"
        )


# --- virtual-time closed loop -------------------------------------------------------------------


@dataclass(frozen=True)
class SimRequest:
    """One request of a workload (stop_after: emulate EOS after that many tokens)."""

    input_ids: tuple[int, ...]
    max_new_tokens: int
    stop_after: int | None = None


@dataclass(frozen=True)
class RequestTiming:
    """One request as a client would have timed it (seconds of virtual time)."""

    index: int
    start_s: float
    first_token_s: float | None
    end_s: float
    token_times_s: tuple[float, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None


def run_closed_loop(
    params: EngineParams,
    timing: StepTimeModel,
    bytes_per_token: int,
    requests: Sequence[SimRequest],
    concurrency: int,
    seed: int = 0,
    duration_s: float | None = None,
) -> list[RequestTiming]:
    """Run a closed-loop load (bench_serving's semaphore) in virtual time.

    Without `duration_s` each request is sent once; with it, requests are sent in order (wrapping
    around the list) until the clock passes `duration_s`, and those in flight then complete.
    A request enters as soon as another finishes, at the end of that step, which is when the HTTP
    path would deliver the finishing event. Results are ordered by index.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if not requests:
        return []
    eng = Engine(params, timing, bytes_per_token, seed)
    eng._track = True
    results: list[RequestTiming] = []
    next_index = 0

    def issue(now: float) -> None:
        nonlocal next_index
        if duration_s is None and next_index >= len(requests):
            return
        if duration_s is not None and now >= duration_s:
            return
        sim = requests[next_index % len(requests)]
        index = next_index
        next_index += 1
        try:
            eng.add_request(str(index), sim.input_ids, sim.max_new_tokens, sim.stop_after)
        except QueueFull as exc:
            results.append(
                RequestTiming(index, now, None, now, (), len(sim.input_ids), 0, 0, str(exc))
            )

    for _ in range(concurrency):
        issue(0.0)
    while eng.has_work():
        _, _, finished, _ = eng._advance()
        for r in finished:
            times = tuple(r.times or ())
            reason = r.reason or {}
            error = reason.get("message") if reason.get("type") == "abort" else None
            results.append(
                RequestTiming(
                    index=int(r.rid),
                    start_s=r.start,
                    first_token_s=times[0] if times else None,
                    end_s=eng.clock_s,
                    token_times_s=times,
                    prompt_tokens=r.prompt_len,
                    completion_tokens=r.out,
                    cached_tokens=r.cached,
                    error=error,
                )
            )
            issue(eng.clock_s)
    results.sort(key=lambda t: t.index)
    return results


__all__ = [
    "Engine", "EngineOOM", "EngineParams", "EngineStats", "QueueFull", "RequestTiming",
    "SimRequest", "Step", "StepTimeModel", "TokenEvent", "run_closed_loop",
]  # fmt: skip
