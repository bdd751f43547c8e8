"""The decode step of the simulated scheduler: one token for every running request (or, under
speculative decoding, 1 + the accepted drafts). Pure.

Before the step, the KV pool must have a slot (a page at a page end) for each request; when it
does not, SGLang retracts requests back to the queue (youngest, longest prompt first) and raises
its new_token_ratio so that admission reserves more. Under speculative decoding a step needs
`SpecParams.decode_reserve` free slots per request (SGLang checks them before the draft and
verify allocate, and keeps only the accepted tokens).

A step is planned (`plan_decode`: room, batch, KV attended), costed, then committed at its end
(`commit_decode`: tokens, finished requests, the log line); `run_decode` does all three for one
scheduler, DP attention's lockstep (dpengine.py) costs the groups' plans together.
"""

from __future__ import annotations

from typing import NamedTuple

from tuner.sim.engine.schedreq import SchedReq, abort_reason, finish_reason
from tuner.sim.engine.schedstate import SchedState, StepOut
from tuner.sim.engine.telemetry import decode_line, retract_line


class DecodePlan(NamedTuple):
    """A decode step about to run: `bs` requests attending `kv` tokens, in CUDA graphs or not."""

    bs: int
    kv: int
    graph: bool


def run_decode(s: SchedState, out: StepOut) -> float:
    """One decode step of the running batch (retracting first if the pool is full)."""
    s.retracted_last = 0
    if not make_room(s, out):
        return 0.0
    bs = len(s.running)
    s.kv_sum += bs
    graph_max = s.params.cuda_graph_max_bs
    cuda_graph = graph_max is None or bs <= graph_max
    duration = s.cost.decode_s(bs, s.kv_sum, cuda_graph)
    _commit(s, out, s.clock + duration, bs, cuda_graph)
    return duration


def plan_decode(s: SchedState, out: StepOut) -> DecodePlan | None:
    """Room for the step (retracting if need be) and its size; None if the batch was aborted."""
    s.retracted_last = 0
    if not make_room(s, out):
        return None
    bs = len(s.running)
    s.kv_sum += bs
    graph_max = s.params.cuda_graph_max_bs
    return DecodePlan(bs, s.kv_sum, graph_max is None or bs <= graph_max)


def commit_decode(s: SchedState, out: StepOut, t_end: float, plan: DecodePlan) -> None:
    """The step ended at `t_end`: tokens, finished requests, and the log line when due."""
    _commit(s, out, t_end, plan.bs, plan.graph)


def _commit(s: SchedState, out: StepOut, t_end: float, bs: int, cuda_graph: bool) -> None:
    running = s.running
    if s.spec is None:
        done = next_tokens(s, running, t_end)
        generated = bs
    else:
        done, generated = spec_tokens(s, running, t_end)
    out.touched.extend(running)
    if done:
        leave(s, done, out)
    if s.meter.record(generated, t_end):
        pool = s.pool
        used = pool.used()
        accept = s.spec.log() if s.spec is not None else None
        out.logs.append(
            decode_line(
                bs,
                used,
                used / pool.total,
                cuda_graph,
                s.meter.gen_throughput,
                len(s.waiting),
                s.params.log_version,
                accept,
            )
        )


def make_room(s: SchedState, out: StepOut) -> bool:
    """A KV slot for every running request's next token; False if the batch had to be aborted."""
    pool = s.pool
    reserve = s.decode_reserve
    if pool.ensure_free(pool.decode_need(s.running, reserve)):
        s.ratio.decay()
        return True
    out.logs.append(retract(s))
    if pool.ensure_free(pool.decode_need(s.running, reserve)):
        return True
    # One request left whose output outgrew the whole pool (its max_new_tokens above the
    # 4096-token estimate clip): SGLang asserts; the simulator aborts it.
    for r in s.running:
        s.kv_sum -= r.filled
        s.finish(r, abort_reason("No space left for only one request"))
    out.finished.extend(s.running)
    s.running = []
    return False


def next_tokens(s: SchedState, running: list[SchedReq], t_end: float) -> list[SchedReq]:
    """Give every running request one token (and its KV slot); those now finished."""
    pool = s.pool
    page = pool.page
    done: list[SchedReq] = []
    if page == 1:
        pool.private += len(running)
    for r in running:
        r.out += 1
        r.filled += 1
        if page == 1:
            r.alloc += 1
        elif r.filled - r.prefix > r.alloc:
            r.alloc += page
            pool.private += page
        if r.times is not None:
            r.times.append(t_end)
        if r.out >= r.max_new or (r.stop_after is not None and r.out >= r.stop_after):
            done.append(r)
    return done


def spec_tokens(s: SchedState, running: list[SchedReq], t_end: float) -> tuple[list[SchedReq], int]:
    """Speculative decoding: each request keeps 1 + its accepted drafts (drawn from the
    acceptance model, cut at its end) and their KV slots; (finished, tokens generated)."""
    spec = s.spec
    assert spec is not None
    pool = s.pool
    page = pool.page
    draw = spec.draw
    done: list[SchedReq] = []
    generated = 0
    for r in running:
        n = draw()
        left = r.max_new - r.out
        if r.stop_after is not None:
            left = min(left, r.stop_after - r.out)
        if n > left:
            n = left
        r.out += n
        r.filled += n
        generated += n
        if page == 1:
            r.alloc += n
            pool.private += n
        else:
            while r.filled - r.prefix > r.alloc:
                r.alloc += page
                pool.private += page
        if r.times is not None:
            r.times.extend([t_end] * n)
        if r.out >= r.max_new or (r.stop_after is not None and r.out >= r.stop_after):
            done.append(r)
    s.kv_sum += generated - len(running)  # plan_decode counted one token each
    spec.record(len(running), generated)
    return done, generated


def leave(s: SchedState, done: list[SchedReq], out: StepOut) -> None:
    """Finished requests leave the running batch."""
    gone = {id(r) for r in done}
    s.running = [r for r in s.running if id(r) not in gone]
    for r in done:
        s.kv_sum -= r.filled
        s.finish(r, finish_reason(r) or {})
    out.finished.extend(done)
    s.shrunk = True


def retract(s: SchedState) -> str:
    """Free KV by sending the youngest, longest-prompt requests back to the queue; the log line."""
    pool = s.pool
    reserve = s.decode_reserve
    order = sorted(s.running, key=lambda r: (r.out, -r.prompt_len), reverse=True)
    retracted: list[SchedReq] = []
    first = True
    while first or not pool.ensure_free(pool.decode_need(order, reserve)):
        if len(order) == 1:
            break
        first = False
        r = order.pop()
        s.kv_sum -= r.filled
        pool.release(r)
        r.state = "waiting"
        retracted.append(r)
    gone = {id(r) for r in retracted}
    s.running = [r for r in s.running if id(r) not in gone]
    old = s.ratio.value
    s.ratio.after_retract(s.running)
    s.waiting.extend(retracted)
    s.batch_full = False
    s.retracted_last = len(retracted)
    s.counters.retracted += len(retracted)
    return retract_line(len(retracted), old, s.ratio.value)
