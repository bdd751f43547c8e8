"""The simulated scheduler's mutable state, shared by its prefill and decode steps. Pure.

`Engine` owns one `SchedState`; prefill.py and decode.py change it, one iteration at a time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tuner.sim.engine.kvpool import KVPool
from tuner.sim.engine.schedreq import SchedReq
from tuner.sim.engine.schedtypes import EngineParams
from tuner.sim.engine.spec import SpecSampler
from tuner.sim.engine.telemetry import Counters, DecodeMeter
from tuner.sim.engine.timing import StepCost

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20


class NewTokenRatio:
    """SGLang's estimate of how much of its max_new_tokens a running request will still write.

    Starts at 0.7 x conservativeness, decays to 14% of that over 600 decode steps, resets when
    the scheduler idles, and jumps after a retraction.
    """

    __slots__ = ("decay_step", "init", "min", "value")

    def __init__(self, conservativeness: float):
        self.init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay_step = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def reset(self) -> None:
        self.value = self.init

    def decay(self) -> None:
        """One decode step ran without retracting."""
        self.value = max(self.value - self.decay_step, self.min)

    def after_retract(self, running: Sequence[SchedReq]) -> None:
        """What the requests still running have written, plus a margin, over what they may."""
        decoded = sum(r.out for r in running)
        max_new = sum(r.max_new for r in running)
        self.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(running)) / max(max_new, 1))


class SchedState:
    """Queues, KV pool, step cost, estimates and counters of one engine."""

    def __init__(self, params: EngineParams, pool: KVPool, cost: StepCost, rng: random.Random):
        self.params = params
        self.pool = pool
        self.cost = cost
        self.rng = rng  # the engine's one generator (step noise, random schedule policy)
        self.ratio = NewTokenRatio(params.schedule_conservativeness)
        self.counters = Counters()
        self.meter = DecodeMeter(params.decode_log_interval)
        self.reqs: dict[str, SchedReq] = {}  # live requests by id
        self.waiting: list[SchedReq] = []
        self.running: list[SchedReq] = []
        self.chunked: SchedReq | None = None  # the request being chunk-prefilled
        self.pending: list[SchedReq] = []  # aborted, reported by the next step
        self.kv_sum = 0  # KV tokens the running batch attends
        self.batch_full = False  # SGLang's batch_is_full: skip prefill until a request leaves
        self.shrunk = False  # requests left the running batch since the last prefill attempt
        self.dead = False  # a prefill OOM killed the server
        #: the most new tokens one prefill batch ran since start or flush_cache: its
        #: activations are what PyTorch's allocator keeps reserved (nvidia-smi's memory.used)
        self.peak_prefill = 0
        self.clock = 0.0  # virtual seconds
        self.prefill_logged_at = 0.0  # when the last Prefill batch line was written (0.5.23)
        self.retracted_last = 0  # requests the last decode step retracted
        self.track_times = False  # record token times (run_closed_loop)
        spec = params.spec
        #: speculative decoding's accept lengths and counters (None: one token per step)
        self.spec = (
            SpecSampler(spec.accept, spec.num_draft_tokens, spec.accept_rate_of_drafts, rng)
            if spec is not None
            else None
        )
        #: free KV slots a decode step needs per running request
        self.decode_reserve = spec.decode_reserve if spec is not None else 1

    def finish(self, req: SchedReq, reason: dict) -> None:
        """End a request: its KV goes to the cache, its tokens to the counters."""
        req.state = "done"
        req.reason = reason
        self.reqs.pop(req.rid, None)
        self.pool.retire(req)
        self.counters.finished(req.prompt_len, req.out, req.cached)


class StepOut:
    """What one scheduler iteration produced, filled in by its prefill or decode step."""

    __slots__ = ("finished", "log_groups", "logs", "touched")

    def __init__(self, finished: list[SchedReq]):
        self.touched: list[SchedReq] = []  # requests given a token
        self.finished = finished  # requests finished or aborted
        self.logs: list[str] = []
        self.log_groups: tuple[int, ...] = ()  # DP attention: each log line's group
