"""The simulated SGLang server in virtual time: a `trial.runner.ServerControl` with no process and no HTTP.

`VirtualServer.restart(spec)` does what `python -m tuner.sim` does with the same command line,
minus the waiting: parse the flags (argparse's errors, exit 2), play the start-up script
(startup.py: the same memory plan, failure verdicts and log lines), and on success build the
engine the HTTP server would build and run its warm-up request. A failure is classified from its
exit code and log tail by `sglang.failures.explain_failure`, exactly as `server.lifecycle.Server`
classifies the simulator's log; a prefill out of memory under load is a death `check()` reports
with the crash lines the HTTP server prints. What a started server reports (pool size, resolved
mfs, max running requests) is what its `/get_server_info` says, and the resolved flags are
checked against the asked ones as the lifecycle's verification does.

Time is a `VirtualClock`: a start-up takes `--sim-startup-seconds` (the failure's share of it
when start-up fails), a load run its warm-up, flush pause and window. The trial runner reads the
same clock, so `budget.trial_timeout` is judged in virtual time.

Noise as on the HTTP simulator: each start gets its own `--sim-seed` (unless the launch fixes
one), drawn from the study's seed, the command line and how often it was started before, so the
same seed gives the same study. `noise=False` turns the step-time noise off (ground truth).
The version a virtual server reports is marked `(virtual time)`: the study's identity check then
refuses to mix virtual and real trials in one study, and the export says where it came from.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import replace

from tuner.errors import ModelConfigError, TunerError
from tuner.server.info import mismatches
from tuner.server.launch import LaunchSpec
from tuner.server.records import GpuMemory, ServerDeath, StartResult, Timings
from tuner.server.target import SIM_MODULE, sim_args  # noqa: F401  (re-exported: the sim's callers)
from tuner.sglang.failures import FailureClass, explain_failure
from tuner.sim import tokens
from tuner.sim.bootstrap import engine_params
from tuner.sim.engine import DPEngine, Engine, EngineOOM, StepTimeModel, new_engine
from tuner.sim.flags import FlagError, parse_flags
from tuner.sim.http.server import SimServer
from tuner.sim.memplan import smi_used_mib
from tuner.sim.profile import Profile, load_profile
from tuner.sim.startup import Script, build_script
from tuner.sim.virtual.load import Process

#: lines of the log a failure is classified from (lifecycle.Server's default tail)
TAIL_LINES = 40
VIRTUAL_MARK = " (virtual time)"
#: the HTTP server's own warm-up request (realtime.SimServer._warmup)
WARMUP_TEXT = "The capital city of France is"
WARMUP_TOKENS = 8


class VirtualClock:
    """Seconds of virtual time: starts, load runs and the runner's sleeps advance it."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class VirtualServer:
    """One simulated server at a time, restarted per trial, in virtual time."""

    def __init__(
        self,
        seed: int = 0,
        *,
        noise: bool = True,
        clock: VirtualClock | None = None,
        smi: bool = True,
    ):
        self.seed = seed
        self.noise = noise
        #: the host has nvidia-smi (`gpu_memory`), as a GPU host and the HTTP simulator's
        #: (sim/smi.py) have; False plays a host without it
        self.smi = smi
        self.clock = clock or VirtualClock()
        self.process: Process | None = None
        self.starts = 0
        self._started: dict[str, int] = {}
        self._profiles: dict[str, Profile] = {}
        self._log = io.StringIO()
        self._srv: SimServer | None = None
        self._death: ServerDeath | None = None

    # --- ServerControl --------------------------------------------------------------------

    def restart(
        self, spec: LaunchSpec, log_path: str, on_launch: Callable[[int], None] | None = None
    ) -> StartResult:
        """Start `spec` in virtual time. No process exists, so `on_launch` is never called."""
        self.stop()
        self.starts += 1
        self._log = io.StringIO()
        self._death = None
        args = [*(sim_args(spec.argv) or []), *self._secret_args(spec)]
        if "--sim-seed" not in args:
            args += ["--sim-seed", str(self._seed_for(args))]
        started = self._start(args, log_path)
        if isinstance(started, StartResult):
            return started
        srv, script, startup_s = started
        engine = self._engine(srv, script)
        srv.engine = engine
        proc = Process(srv, engine, self.clock.advance)
        if not srv.ns.skip_server_warmup:
            try:
                proc.submit(tokens.encode(WARMUP_TEXT), WARMUP_TOKENS)
                while engine.has_work():
                    proc.step()
            except EngineOOM as exc:
                return self._failed(self._crash_lines(srv, exc), 137, log_path, startup_s)
        srv.state = "ready"
        srv.log("The server is fired up and ready to roll!")
        plan, d = script.plan, script.defaults
        assert plan is not None
        self.clock.advance(startup_s)
        facts = {
            "max_total_num_tokens": plan.max_total_num_tokens,
            "mem_fraction_static": d.mem_fraction_static,
            "max_running_requests": plan.max_running_requests,
            # the version played, as the HTTP simulator's /server_info says (`--sim-sglang-version`)
            "version": (getattr(srv.ns, "sim_sglang_version", None) or srv.profile.version)
            + VIRTUAL_MARK,
        }
        timings = Timings(start_to_ready_s=startup_s, total_s=startup_s)
        wrong = mismatches({**spec.flags, "port": spec.port}, srv.server_args())
        if wrong:
            failure = FailureClass.ARGS_MISMATCH
            return StartResult(
                False, failure, "; ".join(wrong), log_path=log_path, timings=timings, **facts
            )
        self._srv, self.process = srv, proc
        return StartResult(True, None, "ready", log_path=log_path, timings=timings, **facts)

    def check(self) -> ServerDeath | None:
        """None while the server runs; why it died once a load run killed it."""
        proc = self.process
        if self._death is None and proc is not None and proc.dead is not None:
            lines = self._crash_lines(proc.srv, proc.dead)
            tail = lines[-TAIL_LINES:]
            cls, reason = explain_failure(137, tail)
            self._death = ServerDeath(cls, reason, tuple(tail), 137)
        return self._death

    def stop(self) -> float:
        """SIGTERM: drained at once (virtual time); seconds taken, always 0."""
        srv, proc = self._srv, self.process
        if srv is not None and proc is not None and proc.dead is None:
            srv.log(
                "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
            )
            # SGLang's sigterm_watchdog line once nothing is left (realtime.py writes the same)
            srv.log(
                "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]."
            )
        self._srv = self.process = None
        self._death = None
        return 0.0

    def fetch_log(self, local_path: str) -> bool:
        """The last server's log (its start-up, and its crash if it died)."""
        text = self._log.getvalue()
        if not text:
            return False
        with open(local_path, "w") as f:
            f.write(text)
        return True

    def gpu_memory(self) -> GpuMemory | None:
        """What nvidia-smi would say of the live server's busiest GPU: everything start-up
        placed (the memory plan: context, weights, pool, graphs, a draft) and the activations
        of the largest prefill batch since start or the last flush (what PyTorch's caching
        allocator keeps reserved); None without a live server."""
        srv, proc = self._srv, self.process
        if not self.smi or srv is None or proc is None or proc.dead is not None:
            return None
        if srv.script.plan is None:
            return None
        used = smi_used_mib(srv.profile, srv.script.plan, proc.engine.peak_prefill_tokens)
        return GpuMemory(round(used, 1), float(srv.profile.gpu_mem_mib))

    def responsive(self, timeout_s: float) -> bool:
        """A live virtual server always answers /health."""
        return self.process is not None and self.process.dead is None

    # what api.Seams asks of a server: there are no processes to adopt or to find
    def adopt(self, pgid: int, command: str, log_path: str, port: int) -> None:
        return None

    def stop_strays(self) -> list[tuple[int, str]]:
        return []

    # --- start-up -------------------------------------------------------------------------

    def _start(
        self, args: list[str], log_path: str
    ) -> StartResult | tuple[SimServer, Script, float]:
        """Parse and play the start-up script: the started server, or the failed start."""
        # the simulator's own command-line errors (sim/__main__.py): one line, exit 2
        try:
            ns = parse_flags(args)
        except FlagError as exc:
            return self._failed([exc.message], 2, log_path, 0.0)
        except TunerError as exc:
            return self._failed([f"tuner sim: error: {exc}"], 2, log_path, 0.0)
        try:
            profile = self._profile(ns.sim_profile)
        except ModelConfigError as exc:
            line = f"tuner sim: error: {ns.sim_profile}: model_config.{exc}"
            return self._failed([line], 2, log_path, 0.0)
        except TunerError as exc:
            return self._failed([f"tuner sim: error: {exc}"], 2, log_path, 0.0)
        script = build_script(ns, profile)
        srv = SimServer(ns, profile, script, lambda: self._engine(srv, script), stream=self._log)
        for warning in script.warnings:  # ServerArgs' post-init (as the HTTP server prints them)
            srv.log(warning.text, raw=True)
        lev = script.levers
        if lev.refusal is not None or lev.unsimulated is not None:
            assert script.failure is not None
            return self._failed(None, srv._print_failure(), log_path, 0.0)
        server_args = ", ".join(f"{k}={v!r}" for k, v in srv.server_args().items())
        srv.log(f"server_args=ServerArgs({server_args})")
        for phase in script.phases:
            for line in phase.lines:
                srv.log(line.text, scheduler=line.scheduler)
        total = ns.sim_startup_seconds
        if script.failure is not None:
            code = srv._print_failure()
            return self._failed(None, code, log_path, script.failure.at * total)
        return srv, script, total

    def _engine(self, srv: SimServer, script: Script) -> Engine | DPEngine:
        """The engine the HTTP server builds (bootstrap.build_engine), with token times kept."""
        assert script.plan is not None
        timing = StepTimeModel.from_mapping(srv.profile.timing)
        if not self.noise:
            timing = replace(timing, noise_run_pct=0.0, noise_step_pct=0.0)
        params = engine_params(srv.ns, script, srv.profile)
        bpt = script.plan.bytes_per_token
        return new_engine(params, timing, bpt, seed=srv.ns.sim_seed, track_times=True)

    def _failed(
        self, lines: list[str] | None, code: int, log_path: str, startup_s: float
    ) -> StartResult:
        """A failed start, classified from exit code and log tail as the lifecycle does."""
        if lines is not None:
            self._log.write("".join(line + "\n" for line in lines))
        tail = self._log.getvalue().splitlines()[-TAIL_LINES:]
        cls, reason = explain_failure(code, tail)
        self.clock.advance(startup_s)
        timings = Timings(start_to_ready_s=startup_s, total_s=startup_s)
        return StartResult(
            False, cls, reason, tuple(tail), exit_code=code, log_path=log_path, timings=timings
        )

    def _crash_lines(self, srv: SimServer, exc: EngineOOM) -> list[str]:
        """The HTTP server's lines when its scheduler dies (exit 137), appended to the log."""
        srv._print_crash(exc)
        return self._log.getvalue().splitlines()

    def _profile(self, name: str) -> Profile:
        if name not in self._profiles:
            self._profiles[name] = load_profile(name)
        return self._profiles[name]

    def _seed_for(self, args: Sequence[str]) -> int:
        """This start's noise seed: the study's seed, the command line, how often it started."""
        key = "\0".join(args)
        n = self._started.get(key, 0)
        self._started[key] = n + 1
        digest = hashlib.sha256(f"{self.seed}:{n}:{key}".encode()).hexdigest()
        return int(digest[:8], 16) % 2**31

    @staticmethod
    def _secret_args(spec: LaunchSpec) -> list[str]:
        """Secret flags reach the simulator in a --config file on the real path; here, as flags."""
        out: list[str] = []
        for key, value in spec.secret_flags.items():
            out += [f"--{key}", str(value)]
        return out
