"""A load run in virtual time: what `loadgen.run_load` measures, on a simulated server's engine.

Mirrors tuner/loadgen step by step, without HTTP and without waiting: the warm-up requests
(untimed, all sent at once behind the concurrency limit), the optional cache flush and the pause
after it, then the timed run -- a closed loop at `concurrency`, or seeded Poisson arrivals gated
by it -- which ends when every planned request ended, at `duration_s` (requests in flight are
cut and recorded with what they had received) or when errors pass the budget. Each request is
sent once, in list order; a multi-turn follow-up is sent once its previous turn finished. A
window's run tops its list up with `more` as loadgen does, or ends `exhausted`.

A request's clock starts when it holds its slot; its tokens arrive at the end of the engine step
that made them, which is when the HTTP server would stream them. The server's own checks
(`httpcommon.check_input`, the queue limit) answer as HTTP errors. A prefill out of memory kills
the server (`EngineOOM`): the requests in flight fail and the run stops as `error_budget`, as a
client sees a server that died. Times are virtual seconds; the run advances `Process.clock`.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from tuner.errors import TrialTimeout
from tuner.loadgen.metrics import RequestRecord
from tuner.loadgen.monitor import SKIPPED
from tuner.loadgen.options import MIN_ERRORS, LoadOptions
from tuner.loadgen.result import Cut, LoadProgress, LoadResult
from tuner.loadgen.timed import PROGRESS_EVERY_S, Refill, ended_early, first_waits, stock
from tuner.loadgen.workload import Request, warmup_requests
from tuner.sim import tokens
from tuner.sim.engine import Engine, EngineOOM, QueueFull
from tuner.sim.engine.schedreq import SchedReq
from tuner.sim.http.common import BadRequest, check_input
from tuner.sim.http.server import SimServer
from tuner.sim.virtual.view import ViewSampler

#: the text of a request the dying server was serving, as aiohttp reports it
DISCONNECTED = "ServerDisconnectedError: Server disconnected"


class Process:
    """One started simulated server: its `SimServer` (flags, plan, log), engine and clock.

    `clock` is the study's virtual clock (seconds); `offset` maps the engine's own clock, which
    only moves while it works, onto it (the engine idles between load runs).
    """

    def __init__(self, srv: SimServer, engine: Engine, clock: Callable[[float], None]):
        self.srv = srv
        self.engine = engine
        self.advance_clock = clock
        self.offset = 0.0
        self.dead: EngineOOM | None = None

    @property
    def now(self) -> float:
        return self.engine.clock_s + self.offset

    def idle_until(self, t: float) -> None:
        """The engine is idle: let virtual time pass until `t`."""
        if t > self.now:
            self.offset += t - self.now

    def submit(self, ids: Sequence[int], max_new: int) -> str:
        """Hand one request to the engine as the HTTP server does (ignore_eos); its rid.
        Raises BadRequest or QueueFull as the server's admission would answer."""
        check_input(self.srv, list(ids), max_new)
        rid = self.srv.new_rid()
        # no output_seed: it keys an answer's blocks by its rendered text, which only a prompt
        # that sends the answer back can match, and no load-generator prompt does (multi-turn
        # lists carry placeholders); the blocks and their accounting are the same without it
        self.engine.add_request(rid, ids, max_new, None)
        return rid

    def step(self) -> tuple[list[SchedReq], list[SchedReq]]:
        """One engine iteration: (requests given tokens, requests that ended). Raises EngineOOM."""
        try:
            _, out = self.engine.advance()
        except EngineOOM as exc:
            self.dead = exc
            raise
        return out.touched, out.finished


@dataclass
class _Flight:
    """A request in flight: what was sent, when, and the engine's record once it appears."""

    req: Request
    rid: str
    start: float
    offset: float
    sched: SchedReq | None = None


def prompt_ids(req: Request, backend: str) -> tuple[int, ...]:
    """The token ids the simulated server sees for `req` on `backend` (as its HTTP API parses)."""
    if backend == "sglang":
        return (
            tuple(req.token_ids)
            if req.token_ids is not None
            else tuple(tokens.encode(req.text or ""))
        )
    if backend == "openai":
        return tuple(tokens.encode(req.prompt_text()))
    return tuple(tokens.chat_prompt_ids([{"role": "user", "content": req.prompt_text()}]))


class VirtualRun:
    """One load run on `proc` per `opt`; `run()` returns the LoadResult the HTTP client would."""

    def __init__(
        self,
        proc: Process,
        requests: Sequence[Request],
        opt: LoadOptions,
        ids_cache: dict[tuple[int, str], tuple[int, ...]] | None = None,
        more: Refill | None = None,
        cut: Cut | None = None,
    ):
        self.proc = proc
        self.requests = requests
        self.opt = opt
        self.more = more
        self.cut = cut  # heard about once a virtual second, as loadgen's rule is
        self._ids = ids_cache if ids_cache is not None else {}

    def ids(self, req: Request) -> tuple[int, ...]:
        key = (req.index, self.opt.backend)
        out = self._ids.get(key)
        if out is None:
            out = self._ids[key] = prompt_ids(req, self.opt.backend)
        return out

    def run(
        self, time_limit_s: float | None = None, on_phase: Callable[[str], None] | None = None
    ) -> LoadResult:
        """Warm-up, flush, the timed run; raises TrialTimeout past `time_limit_s` (virtual)."""
        proc, opt = self.proc, self.opt
        began = proc.now
        if on_phase is not None:
            on_phase("warmup")
        if opt.warmup_requests and proc.dead is None:
            self._warmup()
        if opt.flush_cache and proc.dead is None:
            proc.engine.flush_cache()
            proc.idle_until(proc.now + opt.flush_pause_s)
        warmed = proc.now
        proc.advance_clock(warmed - began)  # the study's clock times warm-up and load apart
        if on_phase is not None:
            on_phase("load")
        result = _Timed(self).run()
        elapsed = proc.now - began
        proc.advance_clock(proc.now - warmed)
        if time_limit_s is not None and elapsed > time_limit_s:
            raise TrialTimeout(f"load run cut at the trial's time left ({time_limit_s:.0f} s)")
        return result

    def _warmup(self) -> None:
        """`warmup_requests` untimed requests behind the concurrency limit, answers capped as
        loadgen caps them (errors ignored)."""
        todo = deque(warmup_requests(self.requests, self.opt.warmup_requests))
        inflight = 0
        try:
            while todo or inflight:
                while todo and inflight < self.opt.slots:
                    req = todo.popleft()
                    try:
                        self.proc.submit(self.ids(req), req.output_len)
                        inflight += 1
                    except (BadRequest, QueueFull):
                        pass
                if not self.proc.engine.has_work():
                    break
                _, finished = self.proc.step()
                inflight -= len(finished)
        except EngineOOM:
            return


class _Timed:
    """The timed part: dispatch, stop conditions, records (loadgen/timed.py's rules)."""

    def __init__(self, vr: VirtualRun):
        self.vr = vr
        self.proc = vr.proc
        self.opt = opt = vr.opt
        limit = min(len(vr.requests), opt.num_requests or len(vr.requests))
        planned = list(vr.requests[:limit])
        self.successor: dict[int, Request] = {}
        self.ready: deque[Request] = deque(self._chain(planned))
        self.outstanding = len(planned)
        self.planned, self.sent = len(planned), 0
        self.next_index = max((r.index for r in planned), default=-1) + 1
        # a request count bounds the run by itself: only a window's run is topped up
        self.more = vr.more if opt.duration_s is not None and not opt.num_requests else None
        self.exhausted = False
        self.records: list[RequestRecord] = []
        self.flights: dict[str, _Flight] = {}
        self.errors = 0
        self.stopped: str | None = None
        self.poisson = not math.isinf(opt.request_rate)
        self.rng = random.Random(opt.seed)
        #: Poisson: arrived requests waiting for a slot, with their arrival times
        self.arrived: deque[tuple[Request, float]] = deque()
        #: Poisson: the earliest time of the next arrival (it waits while nothing is ready)
        self.next_arrival = math.inf
        self.t0 = self.end = 0.0
        self.cut_reason: str | None = None
        self.tokens_done = 0  # output tokens of the requests that ended
        self._told = -math.inf

    def _chain(self, planned: list[Request]) -> list[Request]:
        """The requests sendable at once, in order; later turns wait in `successor`."""
        first: list[Request] = []
        last: dict[int, Request] = {}
        chained = any(r.conversation is not None for r in planned)
        for r in sorted(planned, key=lambda r: (r.turn, r.index)) if chained else planned:
            prev = last.get(r.conversation) if r.conversation is not None else None
            if prev is None:
                first.append(r)
            else:
                self.successor[prev.index] = r
            if r.conversation is not None:
                last[r.conversation] = r
        return sorted(first, key=lambda r: r.index) if chained else first

    def _refill(self) -> None:
        """loadgen's top-up: more requests before a window's run uses its list up."""
        if self.more is None or self.stopped is not None:
            return
        if self.planned - self.sent >= stock(self.opt):
            return
        batch = list(self.more(self.next_index, max(stock(self.opt), 256)))
        if not batch:
            self.more = None
            return
        self.planned += len(batch)
        self.next_index = max(r.index for r in batch) + 1
        self.ready.extend(self._chain(batch))
        self.outstanding += len(batch)
        if self.poisson and self.next_arrival == math.inf:
            self.next_arrival = self.proc.now  # the arrivals waited for a ready request

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> LoadResult:
        proc, opt = self.proc, self.opt
        self.t0 = proc.now
        self.end = self.t0 + opt.duration_s if opt.duration_s is not None else math.inf
        view = ViewSampler(proc.engine, self.t0, opt.metrics_interval_s)
        if proc.dead is not None:
            return self._died(self.t0)
        if self.poisson:
            self.next_arrival = self.t0
        self._arrivals(self.t0)
        self._fill(self.t0)
        while self.stopped is None:
            if not proc.engine.has_work():
                # nothing in flight: the next arrival, the window's end, or nothing left to send
                if self.poisson and self.ready and self.next_arrival < self.end:
                    proc.idle_until(self.next_arrival)
                    self._arrivals(proc.now)
                    continue
                if (self.ready or self.arrived) and self.end < math.inf:
                    proc.idle_until(self.end)
                    self._stop("duration")
                self.exhausted = self.stopped is None and ended_early(opt)
                self._stop("done")
                break
            try:
                touched, finished = proc.step()
            except EngineOOM:
                return self._died(proc.now)
            now = proc.now
            view.sample_until(min(now, self.end))
            # arrivals during the step found the slots as they were before its finishes
            self._arrivals(min(now, self.end))
            if now > self.end:  # this step's tokens come after the window: cut
                self._stop("duration")
                break
            for r in touched:
                f = self.flights.get(r.rid)
                if f is not None and f.sched is None:
                    f.sched = r
            for r in finished:
                self._finished(r, now)
            self._fill(now)
            self._tell(now)
        stop_at = min(proc.now, self.end)
        self._cut(stop_at)
        return self._result(stop_at, view)

    def _stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why

    def _tell(self, now: float) -> None:
        """loadgen's `_tell`: the caller's `cut` hears the run about once a second."""
        if self.vr.cut is None or now - self._told < PROGRESS_EVERY_S or self.stopped:
            return
        self._told = now
        got = [f.sched.out for f in self.flights.values() if f.sched is not None and f.sched.out]
        seen = LoadProgress(
            elapsed_s=now - self.t0,
            window_s=self.opt.duration_s,
            done=len(self.records),
            planned=self.planned,
            output_tokens=self.tokens_done + sum(got),
            streaming=len(got),
            first_waits=self._first_waits(now),
        )
        why = self.vr.cut(seen)
        if why is not None:
            self.cut_reason = why
            self._stop("cut")

    def _first_waits(self, now: float) -> tuple[float, ...]:
        waiting = (
            f.sched.times[0] + f.offset - f.start
            if f.sched is not None and f.sched.times
            else now - f.start
            for f in self.flights.values()
        )
        return first_waits(self.records, waiting)

    # --- sending ----------------------------------------------------------------------------

    def _arrivals(self, upto: float) -> None:
        """Poisson: requests arriving by `upto` take a free slot at once, else wait for one."""
        while self.ready and self.next_arrival <= upto and self.stopped is None:
            req, at = self.ready.popleft(), self.next_arrival
            self.next_arrival += self.rng.expovariate(self.opt.request_rate)
            if len(self.flights) < self.opt.slots and not self.arrived:
                self._send(req, at)
            else:
                self.arrived.append((req, at))

    def _fill(self, now: float) -> None:
        """Free slots take waiting arrivals (Poisson) or the next ready requests (closed loop)."""
        while len(self.flights) < self.opt.slots and self.stopped is None and now < self.end:
            if self.arrived:
                self._send(self.arrived.popleft()[0], now)
            elif self.ready and not self.poisson:
                self._send(self.ready.popleft(), now)
            else:
                return

    def _send(self, req: Request, start: float) -> None:
        self.sent += 1
        self._refill()
        try:
            rid = self.proc.submit(self.vr.ids(req), req.output_len)
        except BadRequest as exc:
            self._error(req, start, f"http 400: {exc}")
            return
        except QueueFull:
            self._error(req, start, "http 503: The request queue is full.")
            return
        self.flights[rid] = _Flight(req, rid, start, self.proc.offset)

    # --- records ------------------------------------------------------------------------------

    def _finished(self, r: SchedReq, now: float) -> None:
        f = self.flights.pop(r.rid, None)
        if f is None:
            return
        reason = r.reason or {}
        error = None
        if reason.get("type") == "abort":
            error = f"abort: {reason.get('message', '')}"
        self._record(f, r, now, error)

    def _record(
        self, f: _Flight, r: SchedReq | None, at: float, error: str | None, cancelled: bool = False
    ) -> None:
        times = [t + f.offset for t in (r.times or ())] if r is not None else []
        times = [t for t in times if t <= at]
        ttft = times[0] - f.start if times else None
        itl = tuple(b - a for a, b in pairwise(times))
        self._add(
            RequestRecord(
                index=f.req.index,
                ok=error is None,
                prompt_len=r.prompt_len if r is not None else f.req.prompt_len,
                output_len=len(times),
                start_s=f.start - self.t0,
                latency_s=at - f.start,
                ttft_s=ttft,
                itl_s=itl,
                error=error,
                cancelled=cancelled,
                cached_tokens=r.cached if r is not None and r.seen else None,
                conversation=f.req.conversation,
                turn=f.req.turn,
            ),
            f.req,
        )

    def _error(self, req: Request, now: float, error: str) -> None:
        self._add(
            RequestRecord(
                index=req.index,
                ok=False,
                prompt_len=req.prompt_len,
                output_len=0,
                start_s=now - self.t0,
                latency_s=0.0,
                error=error,
                conversation=req.conversation,
                turn=req.turn,
            ),
            req,
        )

    def _add(self, rec: RequestRecord, req: Request) -> None:
        """loadgen's bookkeeping: the error budget, the follow-up turn, the end of the list."""
        self.records.append(rec)
        self.tokens_done += rec.output_len
        self.outstanding -= 1
        if not rec.ok and not rec.cancelled:
            self.errors += 1
            sent = len(self.records) + len(self.flights)  # loadgen's rule (timed.py)
            budget = self.opt.max_error_rate * max(sent, 20)
            if self.errors >= MIN_ERRORS and self.errors > budget:
                self._stop("error_budget")
        nxt = self.successor.pop(req.index, None)
        if nxt is not None:
            self.ready.append(nxt)
            # a Poisson arrival process that waited for a ready request goes on from now
            self.next_arrival = max(self.next_arrival, self.proc.now) if self.poisson else math.inf
        if self.outstanding <= 0:
            self.exhausted = ended_early(self.opt)
            self._stop("done")

    def _cut(self, at: float) -> None:
        """The run stopped: requests still in flight are cut with what they had received, and
        aborted in the engine (the client closed their connections)."""
        for rid, f in list(self.flights.items()):
            self._record(f, f.sched, at, "cancelled", cancelled=True)
            if self.proc.dead is None:
                self.proc.engine.abort(rid)
        self.flights.clear()
        if self.proc.dead is None:
            while self.proc.engine.has_work():  # report the aborts (no time passes)
                self.proc.step()

    def _died(self, at: float) -> LoadResult:
        """The server died: what it was serving fails; the client's error budget stops the run."""
        for f in list(self.flights.values()):
            self._record(f, f.sched, at, DISCONNECTED)
        self.flights.clear()
        if not self.records and self.ready:
            self._error(self.ready[0], at, "connection: Cannot connect to host (refused)")
        return LoadResult(
            records=tuple(sorted(self.records, key=lambda r: r.start_s)),
            duration_s=max(at - self.t0, 0.0),
            self_check=SKIPPED,
            server=None,
            stopped="error_budget",
            options=self.opt,
        )

    def _result(self, at: float, view: ViewSampler) -> LoadResult:
        duration = at - self.t0
        server = view.view(duration) if self.proc.srv.ns.enable_metrics else None
        return LoadResult(
            records=tuple(sorted(self.records, key=lambda r: r.start_s)),
            duration_s=duration,
            self_check=SKIPPED,
            server=server,
            stopped=self.stopped or "done",
            options=self.opt,
            exhausted=self.exhausted,
            cut_reason=self.cut_reason,
        )
