"""The decode step of the simulated scheduler: one token for every running request. Pure.

Before the step, the KV pool must have a slot (a page at a page end) for each request; when it
does not, SGLang retracts requests back to the queue (youngest, longest prompt first) and raises
its new_token_ratio so that admission reserves more.
"""

from __future__ import annotations

from tuner.sim.engine.schedreq import SchedReq, abort_reason, finish_reason
from tuner.sim.engine.schedstate import SchedState, StepOut
from tuner.sim.engine.telemetry import decode_line, retract_line


def run_decode(s: SchedState, out: StepOut) -> float:
    """One decode step of the running batch (retracting first if the pool is full)."""
    s.retracted_last = 0
    if not make_room(s, out):
        return 0.0
    running = s.running
    bs = len(running)
    s.kv_sum += bs
    graph_max = s.params.cuda_graph_max_bs
    cuda_graph = graph_max is None or bs <= graph_max
    duration = s.cost.decode_s(bs, s.kv_sum, cuda_graph)
    t_end = s.clock + duration
    done = next_tokens(s, running, t_end)
    out.touched.extend(running)
    if done:
        leave(s, done, out)
    if s.meter.record(bs, t_end):
        pool = s.pool
        used = pool.used()
        out.logs.append(
            decode_line(
                bs,
                used,
                used / pool.total,
                cuda_graph,
                s.meter.gen_throughput,
                len(s.waiting),
                s.params.log_version,
            )
        )
    return duration


def make_room(s: SchedState, out: StepOut) -> bool:
    """A KV slot for every running request's next token; False if the batch had to be aborted."""
    pool = s.pool
    if pool.ensure_free(pool.decode_need(s.running)):
        s.ratio.decay()
        return True
    out.logs.append(retract(s))
    if pool.ensure_free(pool.decode_need(s.running)):
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
    order = sorted(s.running, key=lambda r: (r.out, -r.prompt_len), reverse=True)
    retracted: list[SchedReq] = []
    first = True
    while first or not pool.ensure_free(pool.decode_need(order)):
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
