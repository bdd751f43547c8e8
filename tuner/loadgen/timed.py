"""The timed part of a load run: dispatch (closed loop or Poisson), stop conditions, bookkeeping.

Closed loop at `concurrency` (N workers = bench_serving's semaphore; a request's clock starts
when it holds its slot), optionally fed by seeded Poisson arrivals at `request_rate`. The run
ends when every request ended, at `duration_s` (in-flight requests are cancelled and recorded
as cut), when errors exceed the budget, or when the server went silent for the stall bound
(`Bounds.stall_s`: "unresponsive"). A duration-bound run never ends early because its list ran
out: `more(start, n)` (random and multi-turn lists) adds requests first; a finite list (shared
prefixes, a dataset) used up before the window's end stops "done" with `exhausted` set. Each request's own deadline is the window's end plus a
grace, under the request timeout. The server's /metrics is sampled meanwhile. `on_progress`,
when given, hears a `LoadProgress` about once a second (the live display's bar and tok/s).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from tuner.loadgen.bounds import Bounds
from tuner.loadgen.client import Client, RequestState, make_record, send_one
from tuner.loadgen.metrics import RequestRecord, Samples, server_view, total, ttft_or_wait_s
from tuner.loadgen.monitor import LagMonitor, self_check
from tuner.loadgen.options import MIN_ERRORS, LoadOptions
from tuner.loadgen.result import Cut, LoadProgress, LoadResult
from tuner.loadgen.workload import Request

if TYPE_CHECKING:
    from rich.progress import Progress

#: how often the run looks for a silent server
_WATCH_S = 0.25
#: how often `on_progress` hears from a run
PROGRESS_EVERY_S = 1.0
#: (the next request's index, at least how many) -> more requests of the workload ([]: none)
Refill = Callable[[int, int], Sequence[Request]]


def stock(opt: LoadOptions) -> int:
    """Requests not yet sent below which a duration-bound run asks for more: two per slot
    (a rate without a cap: a few hundred, enough for the next refill's wait)."""
    return 2 * (opt.concurrency or 256)


def first_waits(records: Iterable[RequestRecord], waiting: Iterable[float]) -> tuple[float, ...]:
    """`LoadProgress.first_waits`: each ended request's TTFT (its wait, metrics' ttft_or_wait,
    when none came), then the in-flight ones' `waiting` (a TTFT, or the wait so far)."""
    return (*(ttft_or_wait_s(r) for r in records if r.ok), *waiting)


def ended_early(opt: LoadOptions) -> bool:
    """A run whose every request ended: was a window asked for that the list did not fill
    (its figures measure a shorter window)?"""
    return opt.duration_s is not None and opt.num_requests is None


def _chains(planned: Sequence[Request]) -> tuple[list[Request], dict[int, Request]]:
    """(requests sendable at once, index -> the next turn it unlocks) for multi-turn lists."""
    successor: dict[int, Request] = {}
    last_of: dict[int, Request] = {}
    first: list[Request] = []
    for r in sorted(planned, key=lambda r: (r.turn, r.index)):
        prev = last_of.get(r.conversation) if r.conversation is not None else None
        if prev is None:
            first.append(r)
        else:
            successor[prev.index] = r
        if r.conversation is not None:
            last_of[r.conversation] = r
    first.sort(key=lambda r: r.index)
    return first, successor


class TimedRun:
    """One timed run of `requests` per `options`; `run()` returns its LoadResult."""

    def __init__(
        self,
        client: Client,
        requests: Sequence[Request],
        options: LoadOptions,
        progress: Progress | None,
        bounds: Bounds | None = None,
        on_progress: Callable[[LoadProgress], None] | None = None,
        more: Refill | None = None,
        cut: Cut | None = None,
    ):
        self.client = client
        self.opt = options
        self.bounds = bounds or Bounds.of(options)
        limit = min(len(requests), options.num_requests or len(requests))
        self.planned = list(requests[:limit])
        # a request count bounds the run by itself: only a window's run is topped up
        self.more = more if options.duration_s is not None and not options.num_requests else None
        self.sent = 0
        self.exhausted = False
        first, self.successor = _chains(self.planned)
        self.ready: asyncio.Queue[Request | None] = asyncio.Queue()
        for r in first:
            self.ready.put_nowait(r)
        self.records: list[RequestRecord] = []
        self.inflight: dict[asyncio.Task[RequestRecord], tuple[Request, RequestState]] = {}
        self.gated: set[asyncio.Task[None]] = set()
        self.outstanding = len(self.planned)
        self.errors = 0
        self.finished = asyncio.Event()
        self.stopped = "done"
        self.progress = progress
        self.task_id = progress.add_task("load", total=limit) if progress is not None else None
        self.t0 = 0.0
        self.end = math.inf  # perf_counter() of the window's end
        self.silent_s = 0.0
        self.on_progress = on_progress
        self.cut = cut
        self.cut_reason: str | None = None
        self.tokens_done = 0  # output tokens of the requests that ended
        self.last_sample: Samples | None = None  # the server's last /metrics scrape
        self._told = -math.inf

    def _record(self, rec: RequestRecord, req: Request) -> None:
        self.records.append(rec)
        self.tokens_done += rec.output_len
        self.outstanding -= 1
        if self.progress is not None and self.task_id is not None:
            self.progress.advance(self.task_id)
        if not rec.ok:
            self.errors += 1
            # the budget is a share of the requests sent, in flight included: a failure ends in
            # milliseconds while a success streams for seconds, so at high concurrency the first
            # requests to end are the failures, and a share of ended ones would stop a run whose
            # error rate is well inside the budget
            sent = len(self.records) + len(self.inflight)
            budget = self.opt.max_error_rate * max(sent, 20)
            if self.errors >= MIN_ERRORS and self.errors > budget:
                self._stop("error_budget")
        nxt = self.successor.get(req.index)
        if nxt is not None:
            self.ready.put_nowait(nxt)
        if self.outstanding <= 0:
            self.exhausted = ended_early(self.opt)
            self._stop("done")

    def _refill(self) -> None:
        """Top the list up before a window's run uses it up (same seed, same requests)."""
        if self.more is None or self.finished.is_set():
            return
        if len(self.planned) - self.sent >= stock(self.opt):
            return
        start = max((r.index for r in self.planned), default=-1) + 1
        batch = list(self.more(start, max(stock(self.opt), 256)))
        if not batch:
            self.more = None
            return
        self.planned.extend(batch)
        first, successor = _chains(batch)
        self.successor.update(successor)
        for r in first:
            self.ready.put_nowait(r)
        self.outstanding += len(batch)
        if self.progress is not None and self.task_id is not None:
            self.progress.update(self.task_id, total=len(self.planned))

    def _stop(self, why: str) -> None:
        if not self.finished.is_set():
            self.stopped = why
            self.finished.set()

    async def _send(self, req: Request) -> None:
        self.sent += 1
        self._refill()
        st = RequestState()
        left = self.end - time.perf_counter() if math.isfinite(self.end) else None
        timeout = self.bounds.request_timeout(left)
        task = asyncio.create_task(send_one(self.client, req, self.t0, st, timeout))
        self.inflight[task] = (req, st)
        # shielded: when the run stops, the request stays in `inflight` to be recorded as cut
        rec = await asyncio.shield(task)
        del self.inflight[task]
        self._record(rec, req)

    async def _worker(self) -> None:
        while not self.finished.is_set():
            req = await self.ready.get()
            if req is None:
                return
            await self._send(req)

    async def _poisson(self) -> None:
        rng = random.Random(self.opt.seed)
        sem = asyncio.Semaphore(self.opt.slots)

        async def gated(req: Request) -> None:
            async with sem:
                if not self.finished.is_set():
                    await self._send(req)

        while not self.finished.is_set():
            req = await self.ready.get()
            if req is None:
                return
            t = asyncio.create_task(gated(req))
            self.gated.add(t)
            t.add_done_callback(self.gated.discard)
            await asyncio.sleep(rng.expovariate(self.opt.request_rate))

    async def _sampler(self, during: list[Samples]) -> None:
        while True:
            await asyncio.sleep(self.opt.metrics_interval_s)
            s = await self.client.scrape()
            if s is not None:
                during.append(s)
                self.last_sample = s

    async def run(self) -> LoadResult:
        """Dispatch until a stop condition, then cut what is in flight and sum up."""
        opt = self.opt
        before = await self.client.scrape() if opt.metrics_interval_s > 0 else None
        during: list[Samples] = []
        lag = LagMonitor()
        lag.start()
        cpu0 = time.process_time()
        self.t0 = self._told = time.perf_counter()
        if opt.duration_s is not None:
            self.end = self.t0 + opt.duration_s
        if math.isinf(opt.request_rate):
            drivers = [asyncio.create_task(self._worker()) for _ in range(opt.slots)]
        else:
            drivers = [asyncio.create_task(self._poisson())]
        if before is not None:
            drivers.append(asyncio.create_task(self._sampler(during)))
        await self._watch()
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
        await self._cut([*drivers, *self.gated])
        await lag.stop()
        heard = before is not None and self.stopped != "unresponsive"
        after = await self.client.scrape() if heard else None
        wall = end - self.t0
        limit = getattr(self.client.session.connector, "limit", 0)
        return LoadResult(
            records=tuple(sorted(self.records, key=lambda r: r.start_s)),
            duration_s=wall,
            self_check=self_check(opt, lag.lags, cpu, wall, limit),
            server=server_view(before, after, during, wall) if before and after else None,
            stopped=self.stopped,
            silent_s=self.silent_s,
            options=opt,
            exhausted=self.exhausted,
            cut_reason=self.cut_reason,
        )

    async def _watch(self) -> None:
        """Wait for a stop condition: every request ended (or the error budget), the window's
        end, or a server silent for the stall bound while requests wait on it. A window that
        ends with the server silent for `Bounds.quiet_s` is marked unresponsive too."""
        stall = self.bounds.stall_s
        while not self.finished.is_set():
            now = time.perf_counter()
            self._tell(now)
            self.silent_s = self._silence(now)
            if now >= self.end:
                quiet = self.silent_s >= self.bounds.quiet_s
                self._stop("unresponsive" if quiet else "duration")
            elif self.silent_s >= stall:
                self._stop("unresponsive")
            else:
                wait = min(self.end - now, stall - self.silent_s, _WATCH_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.finished.wait(), timeout=wait)
        self.silent_s = self._silence(time.perf_counter())

    def _tell(self, now: float) -> None:
        """Hand `on_progress` and `cut` the run so far, about once every PROGRESS_EVERY_S; a
        reason from `cut` stops the run as "cut"."""
        if (self.on_progress is None and self.cut is None) or now - self._told < PROGRESS_EVERY_S:
            return
        self._told = now
        s = self.last_sample
        in_flight = sum(st.tokens for _, st in self.inflight.values())
        seen = LoadProgress(
            elapsed_s=now - self.t0,
            window_s=self.opt.duration_s,
            done=len(self.records),
            planned=len(self.planned),
            output_tokens=self.tokens_done + in_flight,
            streaming=sum(1 for _, st in self.inflight.values() if st.tokens),
            first_waits=self._first_waits(now) if self.cut is not None else (),
            running=total(s, "sglang:num_running_reqs") if s else None,
            queued=total(s, "sglang:num_queue_reqs") if s else None,
        )
        if self.on_progress is not None:
            self.on_progress(seen)
        why = self.cut(seen) if self.cut is not None else None
        if why is not None:
            self.cut_reason = why
            self._stop("cut")

    def _first_waits(self, now: float) -> tuple[float, ...]:
        waiting = (
            st.ttft if st.ttft is not None else now - st.t0 for _, st in self.inflight.values()
        )
        return first_waits(self.records, waiting)

    def _silence(self, now: float) -> float:
        """Seconds the server has sent nothing while requests waited on it (0: none waits)."""
        return self.client.silence(now) if self.inflight else 0.0

    async def _cut(self, drivers: list[asyncio.Task[None]]) -> None:
        """Stop the drivers; record the requests still in flight as cut, with what they got."""
        for d in drivers:
            d.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
        cut = list(self.inflight.items())
        for task, _ in cut:
            task.cancel()
        await asyncio.gather(*(t for t, _ in cut), return_exceptions=True)
        for _, (req, st) in cut:
            self.records.append(make_record(req, st, self.t0, "cancelled", cancelled=True))
