"""`Engine`: SGLang's scheduler on a virtual clock, the API the HTTP layer and closed loop use.

The engine holds one `SchedState`; each `step()` is one scheduler iteration: a prefill batch
(prefill.py) when the waiting queue or a chunked request can be admitted, else one decode step
(decode.py). Pure: no asyncio, no wall clock, no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from tuner.sim.engine.decode import run_decode
from tuner.sim.engine.kvpool import KVPool
from tuner.sim.engine.prefill import run_prefill
from tuner.sim.engine.radix import chain_keys
from tuner.sim.engine.schedreq import SchedReq, abort_reason
from tuner.sim.engine.schedstate import SchedState, StepOut
from tuner.sim.engine.schedtypes import (
    EngineOOM,
    EngineParams,
    EngineStats,
    QueueFull,
    Step,
    TokenEvent,
)
from tuner.sim.engine.timing import StepCost, StepTimeModel


class Engine:
    """SGLang's scheduler on a virtual clock: add requests, call `step()` while `has_work()`.

    `track_times` records every token's virtual time on the engine's requests (for
    `run_closed_loop`, which reads them from `advance()`).
    """

    def __init__(
        self,
        params: EngineParams,
        timing: StepTimeModel,
        bytes_per_token: int,
        seed: int = 0,
        *,
        track_times: bool = False,
    ):
        if params.max_total_tokens <= 0 or params.max_running_requests <= 0:
            raise ValueError("max_total_tokens and max_running_requests must be positive")
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        self.params = params
        self.timing = replace(timing, bytes_per_token=bytes_per_token)
        pool = KVPool(
            params.max_total_tokens,
            params.page_size,
            params.radix_cache,
            params.hicache_host_tokens,
            params.hicache_write_policy,
        )
        # One generator per engine; str seeds hash the same in every process.
        rng = random.Random(f"sim-engine:{params.seed}:{seed}")
        cost = StepCost(self.timing, rng, pool.cache, params.spec, params.overlap)
        self._s = SchedState(params, pool, cost, rng)
        self._s.track_times = track_times

    # --- requests ----------------------------------------------------------------------------

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
        s = self._s
        p = self.params
        if rid in s.reqs:
            raise ValueError(f"duplicate request id {rid!r}")
        n = len(input_ids)
        if n == 0:
            raise ValueError("empty prompt")
        if p.max_queued_requests is not None and len(s.waiting) >= p.max_queued_requests:
            raise QueueFull("The request queue is full.")
        req = self._new_req(rid, input_ids, max_new_tokens, stop_after, output_seed)
        limit = min(p.context_len - 1, s.pool.total - 1)
        if n > limit:
            req.state = "done"
            req.reason = abort_reason(
                f"Input length ({n} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )
            s.pending.append(req)
            return
        s.reqs[rid] = req
        s.waiting.append(req)

    def _new_req(
        self,
        rid: str,
        input_ids: Sequence[int],
        max_new_tokens: int,
        stop_after: int | None,
        output_seed: int | None,
    ) -> SchedReq:
        s = self._s
        n = len(input_ids)
        block = s.pool.block
        cached = s.pool.cache is not None
        keys = chain_keys(input_ids, block) if cached else []
        max_new = max(1, min(max_new_tokens, self.params.context_len - n - 1))
        req = SchedReq(rid, n, keys, max_new, None if stop_after is None else max(1, stop_after))
        req.output_seed = output_seed
        if output_seed is not None and cached:
            req.tail = tuple(input_ids[len(keys) * block :])
        req.start = s.clock
        if s.track_times:
            req.times = []
        return req

    def abort(self, rid: str) -> None:
        """Drop a request wherever it is; the next step reports it finished with an abort."""
        s = self._s
        req = s.reqs.pop(rid, None)
        if req is None:
            return
        message = "Abort in waiting queue" if req.state == "waiting" else "Abort request"
        if req.state == "waiting":
            s.waiting.remove(req)
        elif req.state == "chunked":
            s.chunked = None
            s.pool.release(req)
        elif req.state == "running":
            s.running.remove(req)
            s.kv_sum -= req.filled
            s.pool.release(req)
            s.shrunk = True
        req.state = "done"
        req.reason = abort_reason(message)
        s.pending.append(req)

    def has_work(self) -> bool:
        """True while any request is queued, running, being prefilled or awaiting its report."""
        s = self._s
        return bool(s.waiting or s.running or s.chunked or s.pending)

    # --- iterations --------------------------------------------------------------------------

    def step(self) -> Step:
        """One scheduler iteration. Raises EngineOOM when the simulated server dies."""
        duration, out = self.advance()
        return Step(duration, events_of(out), tuple(out.logs))

    def advance(self) -> tuple[float, StepOut]:
        """One iteration on the engine's own request objects: (duration, what it produced).

        `step()` turns these into events; `run_closed_loop` reads them directly (no events).
        """
        s = self._s
        if s.dead:
            raise EngineOOM()
        s.pool.tick += 1
        out = StepOut(s.pending)
        s.pending = []
        if not s.running:
            s.batch_full = False  # an empty running batch is never full
        try:
            duration = self._iterate(out)
        except EngineOOM as exc:  # the fatal batch's line, logged before it ran, is kept
            exc.log_lines = tuple(out.logs)
            raise
        if not s.running and not s.chunked:
            s.ratio.reset()  # SGLang resets the estimate when idle
        s.clock += duration
        return duration, out

    def _iterate(self, out: StepOut) -> float:
        """A prefill batch if one forms, else a decode step of the running batch."""
        s = self._s
        duration = run_prefill(s, out)
        if duration is None:
            if s.shrunk:  # SGLang's update_running_batch: finished requests left the batch
                s.batch_full = False
                s.shrunk = False
                if not s.running:  # nothing to decode: the next iteration prefills
                    duration = run_prefill(s, out)
            if duration is None:
                duration = run_decode(s, out) if s.running else 0.0
        return duration

    # --- cache and gauges --------------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Empty the prefix cache (GPU and host); False while requests are pending."""
        if self.has_work():
            return False
        s = self._s
        if s.pool.cache is not None:
            s.pool.cache.reset()
        s.ratio.reset()
        s.peak_prefill = 0  # SGLang's flush_cache ends in torch.cuda.empty_cache()
        return True

    @property
    def peak_prefill_tokens(self) -> int:
        """The largest prefill batch (new tokens) since start or the last flush_cache."""
        return self._s.peak_prefill

    @property
    def pool(self) -> KVPool:
        """The KV pool (slot accounting and prefix cache), for invariant checks."""
        return self._s.pool

    @property
    def clock_s(self) -> float:
        """Virtual seconds elapsed (sum of step durations)."""
        return self._s.clock

    def stats(self) -> EngineStats:
        """Current gauges and lifetime counters."""
        s = self._s
        pool = s.pool
        used = pool.used()
        c = s.counters
        cache = pool.cache
        return EngineStats(
            num_running_reqs=len(s.running),
            num_queue_reqs=len(s.waiting),
            num_used_tokens=used,
            token_usage=used / pool.total,
            cache_hit_rate=c.cache_hit_rate,
            max_total_num_tokens=pool.total,
            num_retracted_reqs=s.retracted_last,
            gen_throughput=s.meter.gen_throughput,
            prompt_tokens_total=c.prompt,
            generation_tokens_total=c.gen,
            cached_tokens_total=c.cached,
            num_requests_total=c.requests,
            load_back_tokens_total=c.load_back,
            evicted_tokens_total=cache.evicted_tokens_total if cache else 0,
            retracted_reqs_total=c.retracted,
            new_token_ratio=s.ratio.value,
            host_used_tokens=cache.host_used if cache else 0,
            clock_s=s.clock,
            spec_accept_length=s.spec.last_len if s.spec is not None else 0.0,
            spec_accept_rate=s.spec.last_rate if s.spec is not None else 0.0,
            avg_spec_accept_length=s.spec.average if s.spec is not None else None,
            max_running_requests=self.params.max_running_requests,
        )


def events_of(out: StepOut) -> tuple[TokenEvent, ...]:
    """What one iteration did to each request it touched or ended (cumulative tokens)."""
    events = [
        TokenEvent(r.rid, r.out, r.prompt_len, r.cached, r.reason is not None, r.reason)
        for r in out.touched
    ]
    seen = {id(r) for r in out.touched}
    events.extend(
        TokenEvent(r.rid, r.out, r.prompt_len, r.cached, True, r.reason)
        for r in out.finished
        if id(r) not in seen
    )
    return tuple(events)
