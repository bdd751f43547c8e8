"""One trial end to end: pre-check -> (re)start or reuse -> load -> score -> `TrialOutcome`.

No optuna here: `TrialRunner.run` returns a `TrialOutcome` (tuner/outcome.py) and study/loop.py maps
it to a trial state. The server and the load run are seams (constructor arguments): the real
`server.lifecycle.Server` and `loadgen` in a study, the simulator or scripted fakes in tests.

Decisions made here: whether a restart is needed (the live server's flags differ, or it died or
hung), what a failed start teaches the pre-check (tuner/trial/learning.py), whose failure a failed
start, a death or a hang was, and whether a command line SGLang refused stops the study.

Whose failure it was, by evidence (design principle 11):

- a start that failed with SGLang's own evidence against the flags (a class in
  `sglang.failures.CONFIG_FAILURES`: OOM, not enough memory, host memory, args mismatch) is the
  configuration's: `start_failed`, infeasible. `bad_flag` stops the study before any server of
  this run started (tuner/trial/rejected.py), and is the configuration's after one did.
- any other failed start (a crash without an SGLang message, not ready in time, a port race)
  is the world's: `world` (study/loop.py fails it and retries within bounds; a failure that
  reproduces on every retry becomes the configuration's there).
- a death under load is the configuration's (`died`) only with evidence (e.g. `oom_runtime`);
  a death without it (killed by a signal, no SGLang message) is `world`.
- a server that stopped answering (the load run ended `unresponsive`) and then does not answer
  /health either, while its process lives, hung: it is stopped and the trial is `world` with
  failure `hung` -- never a measured 0. A server that answered none of the load's requests is
  the same. A slow server that still answers /health is measured as it ran.
- a reused server is checked alive and answering before its load run; a dead or hung one is
  restarted instead of measured.

Deadlines: `run(..., deadline=clock() + trial_timeout)`. Each phase gets min(its own bound,
the time left) where the seam takes one (the load run's `time_limit_s`, the /health probe);
between phases a passed deadline raises TrialTimeout naming the phase. `phase` is the phase the
current trial reached; every change is appended to `<trial_dir>/phases.log` as
`<unix time, ms> <phase>` (phases: restart, spawn, ready, warmup, load, scoring, done), and
`spent` (trial/spent.py) times them on `clock`: where the trial's server time went.
`on_progress`, when set, hears every phase change (`watch.events.PhaseChanged`) and, from a load
seam that takes the keyword, the load run's own `LoadProgress`: the live display's feed.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner.capacity.layout import parallel_of
from tuner.capacity.precheck import Hardware, Knowledge, precheck
from tuner.config.schema import StudyConfig
from tuner.errors import InfraError, TrialTimeout
from tuner.loadgen.metrics import goodput
from tuner.loadgen.names import trial_run_keys
from tuner.outcome import Status, TrialOutcome, cut_outcome, failed_outcome, measured_outcome
from tuner.search.mode import inner_mode
from tuner.search.space import canonical, client_params, server_flags
from tuner.server.launch import LaunchSpec, build_launch, server_log_path, shown_command
from tuner.server.lifecycle import ServerDeath, StartResult
from tuner.server.probes import http_status
from tuner.server.records import GpuMemory
from tuner.sglang.failures import FailureClass, is_config_failure
from tuner.sglang.flags import LaunchFlags, effective_flags
from tuner.trial.inner import InnerSearch
from tuner.trial.learning import learned_death, learned_failure, learned_start, recalled
from tuner.trial.rejected import rejected_flags, study_file_at_fault
from tuner.trial.seams import takes_keywords
from tuner.trial.spent import PhaseTimes
from tuner.verdict.tails import tails_of
from tuner.watch.events import PhaseChanged

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.config.objective import SLOSection
    from tuner.loadgen.result import Cut, LoadResult

#: after a run stopped by errors, how long to watch for the server's death before blaming errors
DEATH_GRACE_S = 5.0
#: the failure class of a server whose process lives but that stopped answering
HUNG = "hung"
#: the phases a trial goes through, in order (a reused server skips restart and spawn)
PHASES = ("restart", "spawn", "ready", "warmup", "load", "scoring", "done")


class ServerControl(Protocol):
    """What a trial needs of the server lifecycle (`server.lifecycle.Server` is the real one)."""

    def restart(
        self, spec: LaunchSpec, log_path: str, on_launch: Callable[[int], None] | None = None
    ) -> StartResult: ...
    def check(self) -> ServerDeath | None: ...
    def stop(self) -> float: ...
    def fetch_log(self, local_path: str) -> bool: ...

    # also, where the lifecycle has it: responsive(timeout_s: float) -> bool (alive servers
    # only: does it answer /health within timeout_s); without it the runner asks /health itself;
    # and gpu_memory() -> GpuMemory | None (nvidia-smi's view: search/ceiling.py reads it)


#: (base_url, client-side params such as concurrency and request-rate) -> one load run; it may
#: also take keywords `time_limit_s` (the trial's time left) and `on_phase` (called with
#: "warmup" and "load"), as `loadgen.run_load_sync` does, `on_progress` (LoadProgress), and
#: `cut` (a rule that may end the run early: search/cut.py)
LoadRun = Callable[..., "LoadResult"]


def score_load(result: LoadResult, slo: SLOSection) -> dict[str, Any]:
    """LoadResult -> metrics JSON: bench_serving's keys, goodput under the SLOs, the server's view."""
    out = result.summary()
    out["goodput"] = goodput(
        result.records,
        result.duration_s,
        ttft_ms=slo.p99_ttft_ms,
        tpot_ms=slo.p99_tpot_ms,
        e2e_ms=slo.p99_e2e_latency_ms,
    )
    return out


class TrialRunner:
    """Runs trials against one server, reusing it when only client-side params change."""

    def __init__(
        self,
        cfg: StudyConfig,
        server: ServerControl,
        run_load: LoadRun,
        base_url: str,
        hardware: Hardware,
        *,
        knowledge: Knowledge | None = None,
        env: Mapping[str, str] | None = None,
        secret_flags: Mapping[str, str] | None = None,
        launch_template: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.cfg = cfg
        self.server = server
        self.run_load = run_load
        self.base_url = base_url
        self.hardware = hardware
        self.knowledge = knowledge or Knowledge()
        self.env = dict(env or {})
        #: e.g. api-key, read from the environment; joins the flags only in the launch
        self.secret_flags = effective_flags(secret_flags or {})
        self.launch_template = list(launch_template or cfg.target.launch)
        self.clock, self.sleep = clock, sleep
        self._running_key: str | None = None  # canonical server flags of the live server
        self.pool: int | None = None  # the live server's KV pool (max_total_num_tokens)
        self.started = False  # a server of this run started: the fixed flags are SGLang's own
        self.version: str | None = None  # the host's SGLang, once a server said (`--no-x` form)
        self.inner = InnerSearch(cfg) if inner_mode(cfg) else None  # concurrency on a server
        self.reuses = 0
        #: the phase the current (or last) trial reached; one of PHASES
        self.phase = "done"
        self.deadline: float | None = None
        self._phases_log: Path | None = None
        self._logged: str | None = None  # the last phase written to this trial's phases.log
        self._load_kw = takes_keywords(run_load, ("time_limit_s", "on_phase"))
        self._progress_kw = takes_keywords(run_load, ("on_progress",))
        self._cut_kw = takes_keywords(run_load, ("cut",))
        #: hears PhaseChanged and the load run's LoadProgress (None: nobody watches)
        self.on_progress: Callable[[Any], None] | None = None
        self.number: int | None = None  # the trial being run
        self.spent = PhaseTimes(clock)  # the current (or last) trial's time by phase
        #: the most GPU memory the server held after one of this trial's runs (nvidia-smi)
        self.gpu_peak: GpuMemory | None = None

    def flags_for(self, params: Mapping[str, Any]) -> LaunchFlags:
        """Fixed server flags plus the trial's server-side params, as the server is launched
        with them: normalized here, once per trial, and passed on as they are (the pre-check,
        what a failure teaches, the launch)."""
        return effective_flags({**self.cfg.server, **server_flags(params)})

    def run(
        self,
        number: int,
        params: Mapping[str, Any],
        trial_dir: Path,
        on_start: Callable[[int], None] | None = None,
        deadline: float | None = None,
        fresh: bool = False,
    ) -> TrialOutcome:
        """One trial; raises InfraError (from the server or host) when the world failed, and
        TrialTimeout (naming the phase) when `deadline` (a `clock()` value) passes.

        `on_start(pgid)` is called as soon as a server process group exists, so a kill of the
        tuner mid-trial still leaves a record of what to stop. `fresh`: restart even a running
        server with these flags (a confirmation samples a start's luck anew)."""
        trial_dir.mkdir(parents=True, exist_ok=True)
        self.number = number
        self.deadline = deadline
        self._phases_log = trial_dir / "phases.log"
        self._logged = None
        self.spent = PhaseTimes(self.clock)
        self.gpu_peak = None
        flags = self.flags_for(params)
        self.spent.gpus = parallel_of(flags).gpus
        objective = self.cfg.objective
        verdict = precheck(flags, self.hardware, self.knowledge, self._least_concurrency(params))
        if not verdict.feasible:
            self._enter("done", check=False)
            return failed_outcome(
                objective, Status.REJECTED, verdict.reason, verdict.kind, flags=flags
            )
        replaced, reuse = None, not fresh and self._running_key == canonical(flags)
        if reuse:
            self._enter("ready")
            replaced = self._unusable()
        restarted = not reuse or replaced is not None
        info: dict[str, Any] = {}
        if restarted:
            self._enter("restart")
            result = self._restart(number, flags, trial_dir, on_start)
            if not result.ok:
                self._enter("done", check=False)
                return self._start_failed(result, flags)
            self._enter("ready")
            info = result.facts()
            if replaced is not None:
                info["replaced"] = replaced
        else:
            self.reuses += 1

        def measure(p: Mapping[str, Any], where: Path, cut: Cut | None = None) -> TrialOutcome:
            return self.measure(p, flags, info, restarted, where, cut)

        if self.inner is not None and "concurrency" not in params:
            cap = self.knowledge.death_cap(flags)
            args = (self.pool, cap, self._left, self.clock)
            outcome = self.inner.run(params, trial_dir, measure, *args)
        else:
            outcome = measure(params, trial_dir)
        self._learn_death(outcome, flags, params)
        self._enter("done", check=False)
        if self.gpu_peak is not None and outcome.server_info:  # reused: its starter's stands
            outcome = replace(outcome, server_info={**outcome.server_info, **self.gpu_peak.facts()})
        return outcome

    def measure(
        self,
        params: Mapping[str, Any],
        flags: LaunchFlags,
        info: dict[str, Any],
        restarted: bool,
        trial_dir: Path,
        cut: Cut | None = None,
    ) -> TrialOutcome:
        """One load run on the live server at `params`' client side, judged; `cut` may end it
        early (search/cut.py), where the load seam takes it."""
        trial_dir.mkdir(parents=True, exist_ok=True)
        load = self._load(params, cut)
        self._enter("scoring")
        keys = trial_run_keys(self.cfg.workload, client_params(params))
        return self._judge(load, flags, info, restarted, trial_dir, keys)

    def stop(self) -> None:
        self._running_key = None
        self.server.stop()

    # --- phases and deadlines --------------------------------------------------------------

    def _enter(self, phase: str, *, check: bool = True) -> None:
        """Move to `phase` (logged when it changes); first, a passed deadline ends the trial
        in the phase it passed in."""
        if check and self.deadline is not None and self.clock() >= self.deadline:
            raise TrialTimeout(self._timeout_reason())
        if phase == self._logged:
            return
        self.phase = self._logged = phase
        self.spent.enter(phase)
        if self.on_progress is not None and self.number is not None:
            self.on_progress(PhaseChanged(self.number, phase))
        if self._phases_log is not None:
            # the tests' kill points and a person's post-mortem read this; losing it is harmless
            with contextlib.suppress(OSError), self._phases_log.open("a") as f:
                f.write(f"{time.time():.3f} {phase}\n")

    def _timeout_reason(self) -> str:
        return f"trial_timeout {self.cfg.budget.trial_timeout:g} s passed during {self.phase}"

    def _left(self) -> float | None:
        """Seconds until the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - self.clock()

    def _on_load_phase(self, phase: str) -> None:
        # called from the load run's event loop: no deadline check here, the run has its own
        self._enter(phase, check=False)

    # --- the server ---------------------------------------------------------------------

    def _unusable(self) -> str | None:
        """Why the live server cannot be reused (dead, or alive and not answering), or None."""
        died = self.server.check()
        if died is not None:
            return f"died before this trial ({died.failure}: {died.reason})"
        if not self._responsive():
            self._stop_hung()
            return f"{HUNG}: alive but /health did not answer"
        return None

    def _responsive(self) -> bool:
        """Does the (alive) server answer /health within min(timeouts.http_s, time left)?"""
        left, own = self._left(), float(self.cfg.target.timeouts.http_s)
        timeout = own if left is None else max(0.5, min(own, left))
        probe = getattr(self.server, "responsive", None)
        if probe is not None:
            return bool(probe(timeout))
        return http_status(self.base_url.rstrip("/") + "/health", None, timeout) == 200

    def _stop_hung(self) -> None:
        self._running_key = None
        self.server.stop()

    def _start_failed(self, result: StartResult, flags: LaunchFlags) -> TrialOutcome:
        """A failed start: the configuration's with SGLang's evidence, else the world's."""
        status = Status.START_FAILED if is_config_failure(result.failure) else Status.WORLD
        return failed_outcome(
            self.cfg.objective,
            status,
            result.reason,
            result.failure,
            server_info=result.facts(),
            restarted=True,
            launched=True,
            flags=flags,
        )

    # --- the load run and its verdict ---------------------------------------------------------

    def _load(self, params: Mapping[str, Any], cut: Cut | None = None) -> LoadResult:
        self._enter("warmup")
        kw: dict[str, Any] = {}
        if self._load_kw:
            kw = {"time_limit_s": self._left(), "on_phase": self._on_load_phase}
        if self._progress_kw and self.on_progress is not None:
            kw["on_progress"] = self.on_progress
        if self._cut_kw and cut is not None:
            kw["cut"] = cut
        try:
            return self.run_load(self.base_url, client_params(params), **kw)
        except TrialTimeout as exc:
            raise TrialTimeout(f"{self._timeout_reason()} ({exc})") from exc

    def _judge(
        self,
        load: LoadResult,
        flags: LaunchFlags,
        info: dict[str, Any],
        restarted: bool,
        trial_dir: Path,
        keys: Mapping[str, Any] | None = None,
    ) -> TrialOutcome:
        """The outcome of a load run: measured, died (config's or world's), or hung. `keys`:
        bench_serving's identifying keys of the run, first in its metrics.json."""
        objective = self.cfg.objective
        died = self._death_after(load)
        hung = None if died is not None else self._hang_after(load)
        metrics = {**(keys or {}), **score_load(load, objective.slo)}
        self._save_metrics(trial_dir, metrics, load)
        self._save_log(trial_dir)
        kw = {"server_info": info, "restarted": restarted, "launched": restarted, "flags": flags}
        if died is not None:
            self._running_key = None
            if is_config_failure(died.failure):
                reason = f"server died under load ({died.failure})"
                return failed_outcome(
                    objective, Status.DIED, reason, died.failure, metrics=metrics, **kw
                )
            reason = f"server died under load without SGLang's evidence ({died.reason})"
            return failed_outcome(
                objective, Status.WORLD, reason, died.failure, metrics=metrics, **kw
            )
        if hung is not None:
            return failed_outcome(objective, Status.WORLD, hung, HUNG, metrics=metrics, **kw)
        self._note_gpu_memory()
        if load.stopped == "cut":
            return cut_outcome(objective, metrics, load.cut_reason or "cut", **kw)
        # a run cut by its error budget is the server's doing, not a client that lagged
        lagged = load.flagged and load.stopped != "error_budget"
        tails = tails_of(load.records, objective.slo) if load.records else None  # poolable
        return measured_outcome(objective, metrics, client_lagged=lagged, tails=tails, **kw)

    def _note_gpu_memory(self) -> None:
        """The most GPU memory the server held after a run it survived (search/ceiling.py)."""
        read, seen = getattr(self.server, "gpu_memory", None), None
        with contextlib.suppress(InfraError):  # a reading lost costs a prediction, not the run
            seen = read() if read is not None else None
        if seen is not None and (self.gpu_peak is None or seen.used_mib > self.gpu_peak.used_mib):
            self.gpu_peak = seen

    def _hang_after(self, load: LoadResult) -> str | None:
        """Why the run measured a hang rather than the configuration (the server is stopped
        then), or None. Only a run that ended `unresponsive` is suspect."""
        if load.stopped != "unresponsive":
            return None
        silent = float(getattr(load, "silent_s", 0.0))
        if not self._responsive():
            self._stop_hung()
            return (
                f"server stopped answering during the load run (silent {silent:.0f} s, "
                "/health did not answer either); stopped it"
            )
        if not load.records:
            self._stop_hung()
            return "server answered /health but none of the load run's requests; stopped it"
        return None

    def _restart(
        self,
        number: int,
        flags: LaunchFlags,
        trial_dir: Path,
        on_start: Callable[[int], None] | None,
    ) -> StartResult:
        target = self.cfg.target
        spec = build_launch(
            self.launch_template,
            LaunchFlags({**flags, **self.secret_flags}),
            target.port,
            self.env,
            target.workdir,
            self.version,
        )
        (trial_dir / "launch.txt").write_text(shown_command(spec.argv) + "\n")
        self._running_key = None
        log = server_log_path(target.workdir, self.cfg.study, number, str(trial_dir.resolve()))

        def launched(pgid: int) -> None:
            # the record first: a kill right after must still find the group
            if on_start is not None:
                on_start(pgid)
            self._enter("spawn", check=False)

        result = self.server.restart(spec, log, launched)
        self.spent.stopped(result.timings.stop_s)
        self._save_log(trial_dir)
        if result.ok:
            self.started, self.version = True, result.version or self.version
            self._running_key = canonical(flags)
            self.pool = result.max_total_num_tokens
            self.knowledge = learned_start(
                self.knowledge, self.pool, result.mem_fraction_static, flags
            )
        elif result.failure == FailureClass.BAD_FLAG and study_file_at_fault(self.started):
            raise rejected_flags(self.cfg, result)
        else:
            self.knowledge = learned_failure(
                self.knowledge, result.failure, flags, number, result.reason
            )
        return result

    def _death_after(self, load: LoadResult) -> ServerDeath | None:
        """Did the server die during the run? A run cut by errors often races the death itself."""
        deadline = self.clock() + (DEATH_GRACE_S if load.stopped == "error_budget" else 0.0)
        while True:
            died = self.server.check()
            if died is not None or self.clock() >= deadline:
                return died
            self.sleep(0.2)

    # --- learning and records ------------------------------------------------------------

    def _learn_death(
        self, outcome: TrialOutcome, flags: LaunchFlags, params: Mapping[str, Any]
    ) -> None:
        self.knowledge = learned_death(self.knowledge, outcome, flags, params, self.number)

    def recall(self, trials: Sequence[FrozenTrial], worker: str | None = None) -> None:
        """Before a trial: what the study's trials (every worker's, a resumed run's earlier
        ones) taught the pre-check and the inner search, on top of what this run saw
        (`worker`: this run's, whose host alone its host-memory failures speak for)."""
        self.knowledge = recalled(self.knowledge, trials, self.flags_for, worker)
        if self.inner is not None:
            self.inner.recall(trials)

    def _least_concurrency(self, params: Mapping[str, Any]) -> int | None:
        """The least concurrency this trial loads its server with (inner: the range's low)."""
        if "concurrency" in params:
            return int(params["concurrency"])
        spec = self.cfg.space.get("concurrency")
        if inner_mode(self.cfg) and spec is not None and spec.low is not None:
            return int(spec.low)
        return None

    def _save_log(self, trial_dir: Path) -> None:
        # a missing log is evidence lost, not a reason to fail the trial (nor is a host without
        with contextlib.suppress(OSError, InfraError):  # SFTP, or a copy the link dropped)
            self.server.fetch_log(str(trial_dir / "server.log"))

    @staticmethod
    def _save_metrics(trial_dir: Path, metrics: Mapping[str, Any], load: LoadResult) -> None:
        (trial_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        with (trial_dir / "requests.jsonl").open("w") as f:
            for rec in load.records:
                # vars, not asdict: a record is flat, and asdict's deep copies of thousands
                # of records took seconds per trial
                f.write(json.dumps(vars(rec), default=str) + "\n")
