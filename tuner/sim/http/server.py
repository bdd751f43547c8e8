"""The simulated SGLang server in real time: start-up script, engine loop, HTTP API (aiohttp).

Life of a process:
  1. The HTTP port is bound at once so `/health` answers 503 during the simulated load. If the
     port is taken, nothing is printed then: like uvicorn, which binds only after the model has
     loaded, the bind error comes after the simulated load (exit 1).
  2. The start-up script (startup.py) plays its log lines over `--sim-startup-seconds`; a
     failure prints SGLang's exception and the parent's sigquit line, exit 137.
  3. Warm-up request, `The server is fired up and ready to roll!`, /health 200.
  4. The engine loop calls `Engine.step()`, sleeps until the step's end on a monotonic schedule,
     then hands each TokenEvent to its waiting request (O(events) per step). A stream writes
     whatever accumulated since its last write, so chunks coalesce when the loop runs behind.
  5. SIGTERM: log, /health 503, drain in-flight requests, exit 0. EngineOOM: crash, exit 137.
Injected faults (`--sim-fault`, faults.py) hook into steps 2 (crash, hang, slow start-up) and 4
(crash, hang once serving; the per-request ones in the HTTP handlers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import random
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from aiohttp import web

from tuner.sim import faults as fault_actions
from tuner.sim import tokens
from tuner.sim.engine import DPEngine, Engine, EngineOOM, TokenEvent
from tuner.sim.faults import Faults
from tuner.sim.faultspec import FaultSpec
from tuner.sim.flags import server_args_dict
from tuner.sim.http.gpumeter import GpuMeter
from tuner.sim.http.native import add_routes
from tuner.sim.http.promtext import Histograms
from tuner.sim.http.reqstate import ReqState
from tuner.sim.http.simlog import Log
from tuner.sim.http.world import PeerLost, World, print_join_failure, watch_world
from tuner.sim.profile import Profile
from tuner.sim.startup import (
    EXIT_CHILD_FAILED,
    EXIT_MAIN_EXCEPTION,
    SIGQUIT_LINE,
    Script,
    bind_error_line,
)

#: the step loop may run this far behind its schedule before it stops trying to catch up
MAX_LAG_S = 0.5
#: how long to wait when a step did nothing (work queued that cannot be scheduled yet)
IDLE_STALL_S = 0.01


class SimServer:
    """One simulated SGLang process; `await run()` returns its exit code."""

    def __init__(
        self,
        ns: argparse.Namespace,
        profile: Profile,
        script: Script,
        engine_factory: Callable[[], Engine | DPEngine],
        faults: Faults | None = None,
        stream: TextIO = sys.stderr,
    ):
        self.ns = ns
        self.profile = profile
        self.script = script
        self.plan = script.plan
        self.engine_factory = engine_factory
        self.engine: Engine | DPEngine | None = None
        self.log = Log(stream, ns.tp_size, script.levers.dp_groups)
        self.rng = random.Random(ns.sim_seed)
        self.state = "starting"  # starting -> loaded -> ready -> draining (or crashed)
        self.requests: dict[str, ReqState] = {}
        self.inflight = 0
        self.work = asyncio.Event()
        self.stop = asyncio.Event()
        self.crash: BaseException | None = None
        self.hist = Histograms()
        self.last_gen_throughput = 0.0
        self.served_model_name = script.defaults.served_model_name
        self.faults = faults or Faults()
        self.paused = False
        self._start_fault: FaultSpec | None = None
        self._fault_tasks: list[asyncio.Task] = []
        #: the torch.distributed world of a server across nodes (--nnodes > 1), else None
        self.world: World | None = None
        self.gpu: GpuMeter | None = None  # what the simulated nvidia-smi reads, while serving
        if ns.nnodes > 1 and script.failure is None:
            self.world = World(ns, self.log)
            self.log.tag = f" TP{self.world.first_rank}"  # this node's first scheduler rank

    # --- start-up ------------------------------------------------------------------------

    def server_args(self) -> dict[str, Any]:
        """Every server arg after ServerArgs' defaults, by SGLang's field names."""
        d = self.script.defaults
        args = server_args_dict(self.ns)
        # the resolved decode-graph batch size, under the played version's field name
        graph_bs = (
            "cuda_graph_max_bs" if "cuda_graph_max_bs" in args else "cuda_graph_max_bs_decode"
        )
        args.update(
            mem_fraction_static=d.mem_fraction_static,
            chunked_prefill_size=d.chunked_prefill_size,
            **{graph_bs: d.cuda_graph_max_bs},
            served_model_name=d.served_model_name,
            tokenizer_path=self.ns.tokenizer_path or self.ns.model_path,
            random_seed=self.ns.random_seed
            if self.ns.random_seed is not None
            else self.ns.sim_seed,
        )
        return args

    def _print_failure(self) -> int:
        failure = self.script.failure
        assert failure is not None
        if failure.exit_code == EXIT_MAIN_EXCEPTION:
            self.log("Traceback (most recent call last):", raw=True)
            self.log(
                '  File "/sgl-workspace/sglang/python/sglang/launch_server.py", line 24, in <module>',
                raw=True,
            )
            for line in failure.lines:
                self.log(line.text, raw=True)
            return failure.exit_code
        for line in failure.lines:
            prefixed = line.text.startswith("Scheduler hit") or line.text == SIGQUIT_LINE
            self.log(line.text, scheduler=line.scheduler, raw=not prefixed)
        return failure.exit_code

    async def _until(self, when: float) -> bool:
        """Sleep until loop time `when`; True if SIGTERM came first (start-up is abandoned)."""
        delay = when - asyncio.get_running_loop().time()
        if not self.stop.is_set() and delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)
        return self.stop.is_set()

    async def _at(self, when: float, t0: float, total: float) -> int | None:
        """Sleep until `when`; an exit code if start-up ends first (SIGTERM, an injected fault)."""
        fault = self._start_fault
        if fault is not None and t0 + fault.at * total <= when:
            self._start_fault = None
            if await self._until(t0 + fault.at * total):
                return 0
            self.log(fault_actions.fired_line(fault))
            if fault.kind == "crash-start":
                fault_actions.die()
            await self.stop.wait()  # hang-start: alive, /health 503, until SIGTERM
            return 0
        return 0 if await self._until(when) else None

    async def _play_script(self, t0: float) -> int | None:
        """Print the start-up lines on schedule; an exit code if start-up fails or is stopped."""
        total = self.ns.sim_startup_seconds + self.faults.extra_startup_s
        self._start_fault = self.faults.start_fault()
        for warning in self.script.warnings:  # ServerArgs' post-init, before logging is set up
            self.log(warning.text, raw=True)
        lev = self.script.levers
        if lev.refusal is not None or lev.unsimulated is not None:
            return self._print_failure()  # refused before ServerArgs exists: no server_args line
        args = ", ".join(f"{k}={v!r}" for k, v in self.server_args().items())
        self.log(f"server_args=ServerArgs({args})")
        summary = self.faults.summary()
        if summary is not None:
            self.log(summary)
        if self.world is not None:  # the ranks meet before the weights load
            if (joined := await self.world.join(self.stop)) is not None:
                return print_join_failure(self.log, joined) if joined else 0
            self._fault_tasks.append(asyncio.create_task(watch_world(self, self.world)))
            t0 = asyncio.get_running_loop().time()  # the load starts once the ranks met
        for phase in self.script.phases:
            if (code := await self._at(t0 + phase.at * total, t0, total)) is not None:
                return code
            for line in phase.lines:
                self.log(line.text, scheduler=line.scheduler)
        if self.script.failure is not None:
            if (code := await self._at(t0 + self.script.failure.at * total, t0, total)) is not None:
                return code
            return self._print_failure()
        if (code := await self._at(t0 + self.script.bind_at * total, t0, total)) is not None:
            return code
        if self._start_fault is not None:  # due after the last start-up step (at close to 1)
            return await self._at(t0 + total, t0, total)
        return None

    async def run(self) -> int:
        """Start-up, serve until SIGTERM or a crash; the process exit code."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_sigterm)
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 2**20)
        add_routes(app, self)
        runner = web.AppRunner(
            app,
            handle_signals=False,
            shutdown_timeout=0.5,
            handler_cancellation=True,
            access_log=None,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.ns.host, self.ns.port, backlog=4096)
        bound = True
        try:
            await site.start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            bound = False  # report it after the simulated load, as uvicorn would
        try:
            code = await self._play_script(t0)
            if self.crash is not None:  # a peer lost during start-up
                return self._print_crash(self.crash)
            if code is not None:
                return code
            if not bound:
                self.log(bind_error_line(self.ns.host, self.ns.port), raw=True)
                return EXIT_MAIN_EXCEPTION
            return await self._serve()
        finally:
            await runner.cleanup()
            if self.world is not None:  # rank 0's shutdown tells the followers (ShutdownReq)
                await self.world.leave()

    async def _serve(self) -> int:
        self.log(f"INFO:     Started server process [{os.getpid()}]", raw=True)
        self.log("INFO:     Waiting for application startup.", raw=True)
        self.log("INFO:     Application startup complete.", raw=True)
        self.log(
            f"INFO:     Uvicorn running on http://{self.ns.host}:{self.ns.port} (Press CTRL+C to quit)",
            raw=True,
        )
        engine = self.engine = self.engine_factory()
        self.state = "loaded"
        if self.world is None and self.plan is not None:  # one host's GPUs: one node's server
            self.gpu = GpuMeter(self.ns.port, self.profile, self.plan, self.ns.tp_size)
        self.note_gpu()
        loop_task = asyncio.create_task(self._engine_loop(engine))
        try:
            if not self.ns.skip_server_warmup:
                await self._warmup()
            if self.crash is None and not self.stop.is_set():
                self.state = "ready"
                self.log("The server is fired up and ready to roll!")
                self._arm_load_faults()
            await self.stop.wait()
            if self.crash is not None:
                return self._print_crash(self.crash)
            self.state = "draining"
            if self.requests:
                self._draining_line()
            while self.inflight > 0 and self.crash is None:
                await asyncio.sleep(0.05)
            if self.crash is not None:
                return self._print_crash(self.crash)
            self._draining_line()
            return 0
        finally:
            for task in (loop_task, *self._fault_tasks):
                task.cancel()
            for task in (loop_task, *self._fault_tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self.gpu is not None:
                self.gpu.close()

    def _draining_line(self) -> None:
        """SGLang's sigterm_watchdog line (tokenizer_manager.py), as it drains and at the end."""
        rids = list(self.requests)
        self.log(
            f"Gracefully exiting... Remaining number of requests {len(rids)}. "
            f"Remaining requests remaining_rids={rids!r}."
        )

    def _arm_load_faults(self) -> None:
        """Ready: serving time starts for the faults; one watcher per armed crash/hang-load."""
        loop = asyncio.get_running_loop()
        self.faults.mark_ready(loop.time())
        for spec in self.faults.load_faults():
            self._fault_tasks.append(asyncio.create_task(self._load_fault(spec)))

    async def _load_fault(self, spec: FaultSpec) -> None:
        await self.faults.wait_due(spec, asyncio.get_running_loop().time)
        if self.state != "ready":
            return  # draining: SIGTERM came first
        self.log(fault_actions.fired_line(spec))
        if spec.kind == "crash-load":
            fault_actions.die()
        else:
            fault_actions.hang(spec.how)

    async def _warmup(self) -> None:
        ids = tokens.encode("The capital city of France is")
        st = self.submit(ids, max_new_tokens=8, ignore_eos=True)
        waiter = asyncio.create_task(self.wait_finished(st))
        stopper = asyncio.create_task(self.stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()
        self.release(st)  # the warm-up is no request the drain should wait for

    def _print_crash(self, exc: BaseException) -> int:
        self.state = "crashed"  # handlers cancelled from here on are the server's, not clients'
        if isinstance(exc, PeerLost):  # NCCL's watchdog aborted a scheduler (sim/nodes.py)
            for line in exc.lines:
                self.log(line, raw=True)
            self.log(SIGQUIT_LINE)
            return EXIT_CHILD_FAILED
        groups = getattr(exc, "log_groups", ())
        for i, line in enumerate(getattr(exc, "log_lines", ())):
            self.log(line, scheduler=True, group=groups[i] if groups else None)
        self.log("Scheduler hit an exception: Traceback (most recent call last):", scheduler=True)
        self.log(
            '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1118, in event_loop_overlap',
            raw=True,
        )
        self.log(f"RuntimeError: {exc}", raw=True)
        self.log("", raw=True)
        self.log(SIGQUIT_LINE)
        return EXIT_CHILD_FAILED

    def _on_sigterm(self) -> None:
        if self.state != "draining":
            self.log(
                "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
            )
            self.state = "draining"
        self.stop.set()

    # --- the engine loop ---------------------------------------------------------------------

    async def _engine_loop(self, engine: Engine | DPEngine) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            if not engine.has_work():
                self.work.clear()
                await self.work.wait()
                due = loop.time()
            try:
                step = engine.step()
            except EngineOOM as exc:
                self.crash = exc
                self.stop.set()
                return
            if step.duration_s <= 0 and not step.events and not step.log_lines:
                # the engine has work it cannot schedule yet: do not spin the CPU
                await asyncio.sleep(IDLE_STALL_S)
                due = loop.time()
                continue
            due += step.duration_s
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let handlers run even when behind schedule
                if delay < -MAX_LAG_S:
                    due = loop.time()
            groups = step.log_groups
            for i, line in enumerate(step.log_lines):
                self.log(line, scheduler=True, group=groups[i] if groups else None)
            now = loop.time()
            for ev in step.events:
                self._deliver(ev, now)
            self.note_gpu()

    def note_gpu(self) -> None:
        """Publish what nvidia-smi would read now (after a step, a flush)."""
        if self.gpu is not None and self.engine is not None:
            self.gpu.note(self.engine.peak_prefill_tokens)

    def _deliver(self, ev: TokenEvent, now: float) -> None:
        st = self.requests.get(ev.rid)
        if st is None:
            return
        new = ev.completion_tokens - st.completion_tokens
        if new > 0:
            if st.first_token_at is None:
                st.first_token_at = now
                self.hist.observe("time_to_first_token_seconds", now - st.created, st.stream)
            elif st.last_token_at is not None:
                self.hist.observe("inter_token_latency_seconds", (now - st.last_token_at) / new)
            st.last_token_at = now
        st.completion_tokens = ev.completion_tokens
        st.prompt_tokens = ev.prompt_tokens
        st.cached_tokens = ev.cached_tokens
        if ev.finished and not st.finished:
            st.finished = True
            st.finish_reason = ev.finish_reason
            st.finished_at = now
            self.hist.observe("e2e_request_latency_seconds", now - st.created, st.stream)
            self.hist.finished(st.prompt_tokens, st.completion_tokens, st.cached_tokens, st.stream)
        st.event.set()

    # --- what the HTTP handlers call -----------------------------------------------------------

    def new_rid(self) -> str:
        """A request id like SGLang's uuid4 hex, from the server's seeded generator."""
        return f"{self.rng.getrandbits(128):032x}"

    def submit(
        self,
        input_ids: list[int],
        max_new_tokens: int,
        ignore_eos: bool,
        rid: str | None = None,
        stop: Sequence[str] = (),
    ) -> ReqState:
        """Hand one request to the engine; the caller waits on the returned state."""
        rid = rid or self.new_rid()
        stop_after = None
        if not ignore_eos and max_new_tokens > 1:
            # Emulates EOS: a seeded length, most often near the end of the budget.
            stop_after = max(
                1, min(max_new_tokens, int(max_new_tokens * (0.3 + 0.7 * self.rng.random())))
            )
        loop = asyncio.get_running_loop()
        st = ReqState(rid, self.rng.getrandbits(31), len(input_ids), loop.time())
        if stop:  # stop strings apply with ignore_eos too; the generated text is known ahead
            st.stop = tokens.first_stop(st.seed, max_new_tokens, stop)
            if st.stop is not None and (stop_after is None or st.stop[0] < stop_after):
                stop_after = st.stop[0]
        # output_seed: the engine caches the answer under the ids its text re-encodes to (multi-turn)
        self.engine.add_request(
            rid, input_ids, max_new_tokens, stop_after, output_seed=st.seed
        )  # may raise QueueFull
        self.requests[rid] = st
        self.work.set()
        return st

    async def wait_finished(self, st: ReqState) -> None:
        """Wait until the engine finishes a request (the state is updated in place)."""
        while not st.finished:
            await st.event.wait()
            st.event.clear()

    def abort(self, rid: str) -> None:
        """/abort_request: the engine ends the request with an abort at its next step."""
        if rid in self.requests and self.engine is not None and self.crash is None:
            self.engine.abort(rid)
            self.work.set()

    def release(self, st: ReqState) -> None:
        """Forget a request; abort it in the engine if the client left before it finished."""
        self.requests.pop(st.rid, None)
        if not st.finished and self.engine is not None and self.crash is None:
            self.engine.abort(st.rid)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        path = request.path
        key = self.ns.api_key
        guarded = key and not path.startswith("/health") and path != "/metrics"
        if guarded and request.headers.get("Authorization", "") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        self.inflight += 1
        try:
            resp = await handler(request)
        except ConnectionResetError:  # the client left mid-request: SGLang aborts it quietly
            return web.Response(status=499)  # never sent: the connection is gone
        finally:
            self.inflight -= 1
        if self.state != "starting" and path not in ("/health", "/metrics"):
            peer = request.transport.get_extra_info("peername") if request.transport else None
            where = f"{peer[0]}:{peer[1]}" if peer else "127.0.0.1:0"
            reason = getattr(resp, "reason", "") or ""
            self.log(
                f'INFO:     {where} - "{request.method} {path} HTTP/1.1" {resp.status} {reason}',
                raw=True,
            )
        return resp
