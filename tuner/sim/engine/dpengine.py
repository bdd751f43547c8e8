"""DP attention: D schedulers in lockstep, SGLang's `--enable-dp-attention --dp-size D`. Pure.

Each DP group is one `Engine` (its own waiting queue, running batch, KV pool of one GPU's size,
`max_running_requests` of flag // D, decode meter and log lines); `DPEngine` dispatches each new
request to a group by SGLang's load-balance method (round robin by default, both versions:
0.5.6.post2 managers/data_parallel_controller.py:471-484, 0.5.23 arg_groups/serving_hook.py:
217-236 resolves `auto` to it) and steps the groups together. One step: every group plans its
own iteration (a prefill batch if one forms, else a decode of its running batch, else idle),
the step's time comes from all the plans at once (`StepTimeModel.dp_step_s`: the slowest
group's attention plus the MoE part on the gathered batch, as SGLang's groups meet in the MoE
layers' all-gather), then every group commits its plan at the step's common end.

It has `Engine`'s API (the HTTP server, `run_closed_loop` and the virtual load run use either);
`new_engine` builds the one the params ask for. Gauges are the groups' summed (ratios averaged,
as a Prometheus reader sums the groups' series); `group_stats()` has each group's own.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from tuner.sim.engine.decode import DecodePlan, commit_decode, plan_decode
from tuner.sim.engine.kvpool import KVPool
from tuner.sim.engine.prefill import PrefillPlan, first_tokens, plan_prefill
from tuner.sim.engine.schedstate import SchedState, StepOut
from tuner.sim.engine.schedtypes import EngineOOM, EngineParams, EngineStats, Step
from tuner.sim.engine.scheduler import Engine, events_of
from tuner.sim.engine.timing import DECODE, PREFILL, StepCost, StepTimeModel, Work

#: dispatch by the fewest requests (running + waiting) or the fewest tokens in use
BY_REQUESTS = ("shortest_queue", "total_requests")
BY_TOKENS = ("total_tokens",)


def new_engine(
    params: EngineParams,
    timing: StepTimeModel,
    bytes_per_token: int,
    seed: int = 0,
    *,
    track_times: bool = False,
) -> Engine | DPEngine:
    """The engine `params` asks for: DP attention groups in lockstep, or one scheduler."""
    if params.dp_groups > 1:
        return DPEngine(params, timing, bytes_per_token, seed, track_times=track_times)
    return Engine(params, timing, bytes_per_token, seed, track_times=track_times)


class DPEngine:
    """`params.dp_groups` schedulers in lockstep (module docstring)."""

    def __init__(
        self,
        params: EngineParams,
        timing: StepTimeModel,
        bytes_per_token: int,
        seed: int = 0,
        *,
        track_times: bool = False,
    ):
        self.params = params
        one = replace(params, dp_groups=1)
        self.groups = [
            Engine(one, timing, bytes_per_token, seed * 64 + g, track_times=track_times)
            for g in range(params.dp_groups)
        ]
        self.timing = self.groups[0].timing
        rng = random.Random(f"sim-dp:{params.seed}:{seed}")
        self._cost = StepCost(self.timing, rng, None, params.spec, params.overlap)
        self._where: dict[str, Engine] = {}
        self._next = 0  # round robin's counter
        self._clock = 0.0

    # --- requests ----------------------------------------------------------------------------

    def _pick(self) -> Engine:
        method = self.params.load_balance_method
        if method in BY_REQUESTS:
            return min(self.groups, key=lambda e: len(e._s.running) + len(e._s.waiting))
        if method in BY_TOKENS:
            return min(self.groups, key=lambda e: e._s.pool.used())
        eng = self.groups[self._next]
        self._next = (self._next + 1) % len(self.groups)
        return eng

    def add_request(
        self,
        rid: str,
        input_ids: Sequence[int],
        max_new_tokens: int,
        stop_after: int | None = None,
        output_seed: int | None = None,
    ) -> None:
        """Queue a request on the group the load-balance method picks (`Engine.add_request`)."""
        if rid in self._where:
            raise ValueError(f"duplicate request id {rid!r}")
        eng = self._pick()
        eng.add_request(rid, input_ids, max_new_tokens, stop_after, output_seed)
        self._where[rid] = eng

    def abort(self, rid: str) -> None:
        eng = self._where.get(rid)
        if eng is not None:
            eng.abort(rid)

    def has_work(self) -> bool:
        return any(e.has_work() for e in self.groups)

    # --- iterations --------------------------------------------------------------------------

    def step(self) -> Step:
        """One lockstep step of every group. Raises EngineOOM when the server dies."""
        duration, out = self.advance()
        return Step(duration, events_of(out), tuple(out.logs), out.log_groups)

    def advance(self) -> tuple[float, StepOut]:
        """Every group plans, the step is costed once, every group commits at its end."""
        merged = StepOut([])
        logs: list[tuple[int, str]] = []
        plans: list[tuple[SchedState, StepOut, object]] = []
        works: list[Work] = []
        outs: list[StepOut] = []
        try:
            for eng in self.groups:
                s = eng._s
                if s.dead:
                    raise EngineOOM()
                s.pool.tick += 1
                out = StepOut(s.pending)
                outs.append(out)
                s.pending = []
                if not s.running:
                    s.batch_full = False
                plan, work = _plan(s, out)
                plans.append((s, out, plan))
                works.append(work)
        except EngineOOM as exc:  # the fatal batch's line, and what the groups before logged
            for g, out in enumerate(outs):
                logs.extend((g, line) for line in out.logs)
            exc.log_lines = tuple(line for _, line in logs)
            exc.log_groups = tuple(g for g, _ in logs)
            raise
        if not all(w.graph for w in works if w.kind == DECODE) or any(
            w.kind == PREFILL for w in works
        ):  # SGLang all-reduces can_cuda_graph: one group's extend or large batch stops all
            plans = [
                (s, out, p._replace(graph=False) if isinstance(p, DecodePlan) else p)
                for s, out, p in plans
            ]
        duration = 0.0
        if any(w.kind for w in works):
            seconds = self.timing.dp_step_s(
                works, len(self.groups), self.params.dp_extra_weights_gib, self.params.spec
            )
            duration = self._cost.noisy(seconds + self._host_io_s() + self._cost.exposed_s)
        t_end = self._clock + duration
        for g, (s, out, plan) in enumerate(plans):
            _commit(s, out, plan, t_end)
            if not s.running and not s.chunked:
                s.ratio.reset()
            s.clock = t_end
            merged.touched.extend(out.touched)
            merged.finished.extend(out.finished)
            logs.extend((g, line) for line in out.logs)
        for r in merged.finished:
            self._where.pop(r.rid, None)
        merged.logs = [line for _, line in logs]
        merged.log_groups = tuple(g for g, _ in logs)
        self._clock = t_end
        return duration, merged

    def _host_io_s(self) -> float:
        """HiCache copies: each group's GPU moves its own over its own PCIe link (the longest)."""
        worst = 0.0
        model = self.timing
        for eng in self.groups:
            cache = eng._s.pool.cache
            if cache is None or not cache.hicache:
                continue
            background, blocking = cache.take_io()
            t = model.load_back_s(blocking)
            t += model.load_back_s(background) * (1 - model.hicache_write_overlap)
            worst = max(worst, t)
        return worst

    # --- cache and gauges --------------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Every group's prefix cache; False while any request is pending."""
        if self.has_work():
            return False
        return all(e.flush_cache() for e in self.groups)

    @property
    def peak_prefill_tokens(self) -> int:
        """The largest prefill batch any group ran since start or the last flush_cache."""
        return max(e.peak_prefill_tokens for e in self.groups)

    @property
    def pool(self) -> KVPool:
        """Group 0's KV pool (each group has one like it: `pools`)."""
        return self.groups[0].pool

    @property
    def pools(self) -> list[KVPool]:
        return [e.pool for e in self.groups]

    @property
    def clock_s(self) -> float:
        return self._clock

    def group_stats(self) -> list[EngineStats]:
        """Each group's gauges and counters (SGLang's per-DP-rank scheduler metrics)."""
        return [e.stats() for e in self.groups]

    def stats(self) -> EngineStats:
        """The groups summed: counts and tokens added, ratios averaged."""
        each = self.group_stats()
        n = len(each)

        def total(name: str) -> int:
            return sum(getattr(x, name) for x in each)

        def mean(name: str) -> float:
            return sum(getattr(x, name) for x in each) / n

        avgs = [x.avg_spec_accept_length for x in each if x.avg_spec_accept_length is not None]
        prompt = total("prompt_tokens_total")
        return EngineStats(
            num_running_reqs=total("num_running_reqs"),
            num_queue_reqs=total("num_queue_reqs"),
            num_used_tokens=total("num_used_tokens"),
            token_usage=mean("token_usage"),
            cache_hit_rate=total("cached_tokens_total") / prompt if prompt else 0.0,
            max_total_num_tokens=total("max_total_num_tokens"),
            num_retracted_reqs=total("num_retracted_reqs"),
            gen_throughput=total("gen_throughput"),
            prompt_tokens_total=prompt,
            generation_tokens_total=total("generation_tokens_total"),
            cached_tokens_total=total("cached_tokens_total"),
            num_requests_total=total("num_requests_total"),
            load_back_tokens_total=total("load_back_tokens_total"),
            evicted_tokens_total=total("evicted_tokens_total"),
            retracted_reqs_total=total("retracted_reqs_total"),
            new_token_ratio=mean("new_token_ratio"),
            host_used_tokens=total("host_used_tokens"),
            clock_s=self._clock,
            spec_accept_length=mean("spec_accept_length"),
            spec_accept_rate=mean("spec_accept_rate"),
            avg_spec_accept_length=sum(avgs) / len(avgs) if avgs else None,
            max_running_requests=total("max_running_requests"),
        )


def _plan(s: SchedState, out: StepOut) -> tuple[object, Work]:
    """One group's iteration, as `Engine._iterate` chooses it, planned but not yet run."""
    plan = plan_prefill(s, out)
    if plan is None and s.shrunk:  # SGLang's update_running_batch: the batch shrank
        s.batch_full = False
        s.shrunk = False
        if not s.running:
            plan = plan_prefill(s, out)
    if plan is not None:
        if not plan.batch:  # the head was aborted: nothing runs
            return None, Work(0)
        return plan, Work(PREFILL, plan.tokens, pairs=plan.pairs, load=plan.load)
    if s.running:
        dec = plan_decode(s, out)
        if dec is not None:
            return dec, Work(DECODE, dec.bs, kv=dec.kv, graph=dec.graph)
    return None, Work(0)


def _commit(s: SchedState, out: StepOut, plan: object, t_end: float) -> None:
    if plan is None:
        return
    if isinstance(plan, PrefillPlan):
        first_tokens(s, plan.batch, t_end, out)
    else:
        commit_decode(s, out, t_end, plan)  # type: ignore[arg-type]
