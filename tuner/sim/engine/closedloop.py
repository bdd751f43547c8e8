"""A closed-loop load (bench_serving's semaphore) on the engine, in virtual time. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.sim.engine.dpengine import new_engine
from tuner.sim.engine.schedreq import SchedReq
from tuner.sim.engine.schedtypes import EngineParams, QueueFull
from tuner.sim.engine.timing import StepTimeModel


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
    eng = new_engine(params, timing, bytes_per_token, seed, track_times=True)
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
        _, out = eng.advance()
        for r in out.finished:
            results.append(request_timing(r, eng.clock_s))
            issue(eng.clock_s)
    results.sort(key=lambda t: t.index)
    return results


def request_timing(req: SchedReq, end_s: float) -> RequestTiming:
    """A finished request as its client timed it."""
    times = tuple(req.times or ())
    reason = req.reason or {}
    error = reason.get("message") if reason.get("type") == "abort" else None
    return RequestTiming(
        index=int(req.rid),
        start_s=req.start,
        first_token_s=times[0] if times else None,
        end_s=end_s,
        token_times_s=times,
        prompt_tokens=req.prompt_len,
        completion_tokens=req.out,
        cached_tokens=req.cached,
        error=error,
    )
