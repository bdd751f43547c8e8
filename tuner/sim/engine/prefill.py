"""The prefill step of the simulated scheduler (SGLang's get_new_batch_prefill). Pure.

One prefill step: order the waiting queue by the schedule policy, let the PrefillAdder take
requests while their KV fits (admission.py), take the batch off the queue, check it against the
OOM cliff, allocate its KV, cost it, and give each request its first token.
"""

from __future__ import annotations

from typing import NamedTuple

from tuner.sim.engine.admission import CONTINUE, NO_TOKEN, PrefillAdder
from tuner.sim.engine.schedreq import SchedReq, abort_reason, finish_reason
from tuner.sim.engine.schedstate import SchedState, StepOut
from tuner.sim.engine.schedtypes import EngineOOM
from tuner.sim.engine.telemetry import prefill_line

#: SGLang sorts by cached prefix only up to this many waiting requests, else keeps FCFS
LPM_MAX_WAITING = 128


class Formed(NamedTuple):
    """A prefill batch being formed.

    `taken`: waiting requests admitted; `head_blocked`: stopped at the head with nothing admitted.
    """

    adder: PrefillAdder
    taken: int
    head_blocked: bool


class PrefillPlan(NamedTuple):
    """A prefill batch about to run (empty: the queue's head was aborted, nothing runs)."""

    batch: list[SchedReq]
    tokens: int  # new tokens
    pairs: float  # attention (query, key) pairs
    load: int  # tokens loaded back from the host tier


def run_prefill(s: SchedState, out: StepOut) -> float | None:
    """Form and run a prefill batch; its duration, or None when there is nothing to prefill."""
    if (s.batch_full or not s.waiting) and s.chunked is None:
        return None  # the common case, decided before building a plan
    plan = plan_prefill(s, out)
    if plan is None:
        return None
    if not plan.batch:
        return 0.0
    duration = s.cost.prefill_s(plan.tokens, plan.pairs, plan.load)
    first_tokens(s, plan.batch, s.clock + duration, out)
    return duration


def plan_prefill(s: SchedState, out: StepOut) -> PrefillPlan | None:
    """Form a prefill batch, take it off the queue and check it against the OOM cliff (its
    first tokens come with `first_tokens` at its end); None when there is nothing to prefill."""
    if (s.batch_full or not s.waiting) and s.chunked is None:
        return None
    allocatable = s.params.max_running_requests - len(s.running)
    if allocatable <= 0 and s.chunked is None:
        s.batch_full = True
        return None
    continuing = s.chunked is not None
    formed = form_batch(s, allocatable)
    if formed.head_blocked and not s.running and not continuing:
        abort_head(s, out)
        return PrefillPlan([], 0, 0.0, 0)
    if not formed.adder.can_run:
        return None
    batch = take_batch(s, formed, out)
    check_oom(s, batch)
    return PrefillPlan(
        batch, sum(r.extend for r in batch), attention_pairs(batch), formed.adder.load_tokens
    )


def sort_waiting(s: SchedState) -> None:
    """Order the waiting queue by `--schedule-policy`."""
    policy = s.params.schedule_policy
    waiting = s.waiting
    cache = s.pool.cache
    if policy in ("lpm", "dfs-weight") and cache is not None and len(waiting) <= LPM_MAX_WAITING:
        block = s.pool.block

        def hit(r: SchedReq) -> int:
            gpu, _ = cache.match(r.keys, (r.fill_len - 1) // block)
            return len(gpu)

        waiting.sort(key=hit, reverse=True)  # longest cached prefix first
    elif policy == "lof":
        waiting.sort(key=lambda r: r.max_new, reverse=True)
    elif policy == "random":
        s.rng.shuffle(waiting)


def form_batch(s: SchedState, allocatable: int) -> Formed:
    """The chunked request's next chunk, then waiting requests in order until one does not fit."""
    if s.waiting:
        sort_waiting(s)
    adder = PrefillAdder(s.params, s.pool, s.running, s.ratio.value)
    if s.chunked is not None:
        adder.add_chunked(s.chunked)
    taken = 0
    head_blocked = False
    for req in s.waiting:
        if len(adder.can_run) >= allocatable:
            s.batch_full = True
            break
        before = len(adder.can_run)
        res = adder.add_one(req)
        if len(adder.can_run) > before:
            taken += 1
        if res != CONTINUE:
            head_blocked = not adder.can_run
            if res == NO_TOKEN:
                if s.pool.hicache:
                    s.batch_full = bool(adder.can_run) or bool(s.running)
                else:
                    s.batch_full = True
            break
    return Formed(adder, taken, head_blocked)


def abort_head(s: SchedState, out: StepOut) -> None:
    """Nothing runs and the head can never be admitted (prompt + clipped output >= the pool).

    SGLang would wait forever; the simulator aborts it so a run cannot hang.
    """
    req = s.waiting.pop(0)
    s.reqs.pop(req.rid, None)
    req.state = "done"
    req.reason = abort_reason("The request does not fit in the KV cache pool.")
    out.finished.append(req)
    s.batch_full = False


def take_batch(s: SchedState, formed: Formed, out: StepOut) -> list[SchedReq]:
    """Move the admitted requests off the queue, note the one left chunked, log the batch."""
    adder = formed.adder
    running_bs = len(s.running)
    del s.waiting[: formed.taken]
    batch = adder.can_run
    s.chunked = adder.new_chunked
    if s.chunked is not None:
        s.chunked.state = "chunked"
    s.counters.load_back += adder.load_tokens
    pool = s.pool
    usage = pool.used() / pool.total
    gap = s.clock - s.prefill_logged_at
    s.prefill_logged_at = s.clock
    pending = sum(r.prompt_len for r in s.waiting)  # 0.5.23's #pending-token
    if s.chunked is not None:
        pending += max(0, s.chunked.prompt_len - s.chunked.filled)
    line = prefill_line(
        len(batch),
        adder.log_input,
        adder.log_hit,
        usage,
        running_bs,
        len(s.waiting),
        s.params.log_version,
        pending,
        adder.log_input / gap if gap > 0 else 0.0,
    )
    out.logs.append(line)
    return batch


def check_oom(s: SchedState, batch: list[SchedReq]) -> None:
    """Past the profile's OOM cliff, or without KV room for the batch, the server dies."""
    oom, new = s.params.oom_prefill_tokens, sum(r.extend for r in batch)
    if oom is not None and new > oom:
        s.dead = True
        raise EngineOOM()
    if not s.pool.ensure_free(s.pool.extend_need(batch)):
        s.dead = True
        raise EngineOOM()
    s.peak_prefill = max(s.peak_prefill, new)


def attention_pairs(batch: list[SchedReq]) -> float:
    """(query, key) pairs the batch's attention computes: new tokens x (cached + causal)."""
    pairs = 0.0
    for r in batch:
        pairs += r.extend * r.filled + r.extend * (r.extend + 1) / 2
    return pairs


def first_tokens(s: SchedState, batch: list[SchedReq], t_end: float, out: StepOut) -> None:
    """Allocate each request's prefilled KV; all but the chunked one get their first token."""
    pool = s.pool
    for r in batch:
        pool.extend(r)
        if r is s.chunked:
            continue
        r.out += 1
        if r.times is not None:
            r.times.append(t_end)
        out.touched.append(r)
        reason = finish_reason(r)
        if reason is not None:
            s.finish(r, reason)
            out.finished.append(r)
        else:
            r.state = "running"
            s.running.append(r)
            s.kv_sum += r.filled
