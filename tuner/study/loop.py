"""The loop of one `tuner tune` run: optuna asks, the runner measures, outcomes become states.

Outcomes map to optuna states in one place, `STATE_OF` (study/states.py, per library-notes.md):

    measured (feasible or SLO missed), rejected by the pre-check,
    failed to start or died for the config's sake   -> COMPLETE, constraints say feasible or not
    a load run not trusted (the client lagged)       -> FAIL, params re-enqueued (bounded)
    infrastructure failure (InfraError)              -> FAIL, params re-enqueued (bounded)
    interrupted (Ctrl-C / SIGTERM)                   -> FAIL, server stopped, exit 130
    a config already measured                        -> COMPLETE, copied from the earlier trial

    the server failed without evidence (WORLD)       -> FAIL, params re-enqueued (bounded); once
                                                        the retries are spent, the same failure of
                                                        the same params counts as the config's
    the study cannot go on (HaltError, SetupError)   -> FAIL, params re-enqueued, the error ends the run

What happens after a trial (retries, runaway halts, probes, progress) is a callback each
(study/callbacks.py). `budget.trial_timeout` bounds a trial twice: the runner checks a deadline between
its phases, and a SIGALRM watchdog (`watchdog`) interrupts a wait that ignores it.
"""

from __future__ import annotations

import contextlib
import math
import socket
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.config.schema import StudyConfig
from tuner.errors import (
    HaltError,
    InfraError,
    InfraRunaway,
    SetupError,
    StudyMismatchError,
    TrialTimeout,
)
from tuner.outcome import (
    CONSTRAINT_KEYS,
    DASHBOARD_CONSTRAINTS,
    METRIC_ATTRS,
    POOL_ATTR,
    Attr,
    Status,
    TrialOutcome,
    failed_outcome,
    named_constraints,
    retry_attrs,
)
from tuner.search.edge import ProbeEdge
from tuner.search.mode import sampled_space
from tuner.search.space import sample
from tuner.study.baseline import aim_baseline, baseline_params, fixed_client
from tuner.study.callbacks import (
    HaltOnRunaway,
    LeaveTimeToConfirm,
    ProbeConcurrency,
    Progress,
    RetryInfraFailures,
    RideOut,
)
from tuner.study.confirm import Confirmation
from tuner.study.reproduce import counts_as_configs
from tuner.study.states import IDENTITY_ATTR, SERVER_ATTR, STATE_OF, TuneStats
from tuner.study.storage import GRACE_S
from tuner.study.worklock import alive_elsewhere, refuse_twin, stale_trial_ids
from tuner.trial.runner import TrialRunner
from tuner.trial.watchdog import WATCHDOG_GRACE_S, watchdog
from tuner.verdict.trials import completed, measured_before
from tuner.watch.events import TrialStarted

IDENTITY_KEYS = ("version", "gpu")
#: what a duplicate copies from the trial that measured its configuration (not its latency tails:
#: those are the measuring trial's requests, pooled once, and a duplicate is no candidate)
DUPLICATE_ATTRS = (
    Attr.STATUS,
    Attr.REASON,
    Attr.METRICS,
    Attr.SERVER_INFO,
    Attr.FAILURE,
    *METRIC_ATTRS,
    POOL_ATTR,
    Attr.LOAD_POINTS,
    Attr.CLIENT,
)


def default_worker(host: str) -> str:
    """A worker's name when none is given: this machine and the target it drives."""
    return f"{socket.gethostname()}:{host}"


class Untrusted(InfraError):
    """The load run measured the client, not the server: discard, do not learn from it."""


class Tuning:
    """Drives one `tuner tune` run of a study."""

    def __init__(
        self,
        cfg: StudyConfig,
        study: optuna.Study,
        runner: TrialRunner,
        trials_dir: Path,
        worker: str | None = None,
        on_trial: Callable[[FrozenTrial], None] | None = None,
        stop_group: Callable[[int], None] | None = None,
        claim_unowned: Callable[[], bool] | None = None,
        on_progress: Callable[[TrialStarted], None] | None = None,
        say: Callable[[str], None] | None = None,
        home: str | None = None,
    ):
        self.cfg = cfg
        self.study = study
        self.runner = runner
        self.trials_dir = trials_dir
        self.worker = worker or default_worker(cfg.target.host)
        self.on_trial = on_trial
        self.stop_group = stop_group
        #: may RUNNING trials that name no worker be failed as zombies? (a process killed
        #: between optuna creating the trial and its first line); only when no other worker
        #: of the study can be alive
        self.claim_unowned = claim_unowned
        self.stats = TuneStats()
        self.confirm_error: str | None = None
        #: hears a TrialStarted as each trial and confirmation run begins (the live display)
        self.on_progress = on_progress
        self.say = say  # hears why the loop pauses or stops early (study/callbacks.py)
        self.deadline: float | None = None  # the run's --timeout as a runner.clock() value
        #: where this run is (worklock.home_of): a same-named worker live elsewhere is refused
        self.home = home

    # --- start-up ---------------------------------------------------------------------------

    def recover(self) -> list[int]:
        """Fail this worker's zombie trials, stop the servers they left, re-enqueue their params."""
        recovered = []
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        stale = stale_trial_ids(self.study) if self.home is not None else None
        if stale is not None and (twin := alive_elsewhere(running, self.worker, self.home, stale)):
            raise refuse_twin(twin, self.worker, GRACE_S)  # nothing failed, stopped or written
        left = self.study.user_attrs.get(SERVER_ATTR + self.worker)
        if left and self.stop_group:
            self.stop_group(int(left))
        unowned = bool(self.claim_unowned and self.claim_unowned())
        for t in running:
            owner = t.user_attrs.get(Attr.WORKER)
            if owner != self.worker and not (owner is None and unowned):
                continue  # another worker's: its heartbeat decides
            pgid = t.user_attrs.get(Attr.SERVER_PGID)
            if pgid and self.stop_group:
                self.stop_group(int(pgid))
            with warnings.catch_warnings():
                # optuna warns that heartbeats belong to optimize(): failing a dead trial is fine
                warnings.simplefilter("ignore", UserWarning)
                self.study.tell(t.number, state=TrialState.FAIL)
            # an enqueued trial (the baseline, a retry) keeps what it was queued with
            params = {**(t.system_attrs.get("fixed_params") or {}), **t.params}
            self.study.enqueue_trial(params, user_attrs=retry_attrs(t.number, t.user_attrs))
            recovered.append(t.number)
        self.study.set_user_attr(SERVER_ATTR + self.worker, None)
        return recovered

    def enqueue_baseline(self, gpu_mem_mib: float | None = None) -> None:
        """Trial 0 is what runs today: the baseline, else SGLang's defaults (study/baseline.py)."""
        if self.study.trials and not self._baseline_lost():
            return
        params = baseline_params(self.cfg, gpu_mem_mib, self.study.sampler)
        if params:
            self.study.enqueue_trial(params, user_attrs={Attr.BASELINE: True})

    def _baseline_lost(self) -> bool:
        """No try of the baseline completed, waits or runs (world failures spent them)."""
        return not any(
            t.user_attrs.get(Attr.BASELINE) and t.state != TrialState.FAIL
            for t in self.study.get_trials(deepcopy=False)
        )

    def remaining(self, n_trials: int) -> int:
        return max(0, n_trials - len(completed(self.study)))

    # --- the loop -------------------------------------------------------------------------

    def optimize(self, n_trials: int, timeout_s: float | None) -> None:
        """Run until `n_trials` trials are complete in the study (across resumes) or time is up.

        Raises InfraRunaway when budget.max_consecutive_infra_failures trials failed in a row.
        """
        if self.remaining(n_trials) == 0:
            return
        b, clock = self.cfg.budget, self.runner.clock
        self.deadline = None if timeout_s is None else clock() + timeout_s
        runaway = HaltOnRunaway(b.max_consecutive_infra_failures, self.worker, self._ride_out())
        holds = self.runner.inner.holds if self.runner.inner is not None else None
        callbacks: list[Callable[[optuna.Study, FrozenTrial], None]] = [
            MaxTrialsCallback(n_trials, states=(TrialState.COMPLETE,)),
            RetryInfraFailures(b.infra_retries),
            ProbeConcurrency(self.cfg.space.get("concurrency"), b, n_trials),
            ProbeEdge.of(self.cfg, self.runner.flags_for, n_trials, holds, self.runner.hardware),
        ]
        if self.on_trial:
            callbacks.append(Progress(self.on_trial))
        if self.deadline is not None and b.confirm_top:
            runs = b.confirm_top * b.confirm_repeats
            callbacks.append(LeaveTimeToConfirm(self.deadline, runs, clock, self.say))
        callbacks.append(runaway)  # last: the trial is told before an outage's pause
        ended = False
        try:
            self.study.optimize(
                self.objective,
                timeout=timeout_s,
                catch=(InfraError,),
                callbacks=callbacks,
                gc_after_trial=False,
            )
            ended = True
        finally:
            if ended and runaway.halted is None:
                self.runner.stop()
            else:  # a host that is down cannot stop its server: that must not hide why
                self._stop_quietly()
            self.study.set_user_attr(SERVER_ATTR + self.worker, None)
        if runaway.halted:
            raise InfraRunaway(runaway.halted)

    def objective(self, trial: Trial) -> float | tuple[float, ...]:
        """optuna's objective: sample, dedupe, run under the trial's deadline, report."""
        trial.set_user_attr(Attr.WORKER, self.worker)  # first: a zombie must name its owner
        if self.home is not None:
            trial.set_user_attr(Attr.HOME, self.home)
        params = sample(trial, sampled_space(self.cfg))
        if self.on_progress is not None:
            self.on_progress(TrialStarted(trial.number, dict(params)))
        earlier = measured_before(self.study, params, trial.number)
        if earlier is not None:
            return self._duplicate(trial, earlier)
        limit = float(self.cfg.budget.trial_timeout)
        aim_baseline(self.cfg, self.runner, trial.user_attrs, self.study)
        try:
            with watchdog(limit + WATCHDOG_GRACE_S, lambda: self.runner.phase):
                outcome = self.runner.run(
                    trial.number,
                    params,
                    self.trials_dir / str(trial.number),
                    on_start=self._started(trial),
                    deadline=self.runner.clock() + limit,
                )
        except (HaltError, SetupError, KeyboardInterrupt):
            # the run stops; the params are not the culprit, so they run again on resume
            self.study.enqueue_trial(
                dict(params), user_attrs=retry_attrs(trial.number, trial.user_attrs)
            )
            raise
        except TrialTimeout as exc:
            self._stop_quietly()
            trial.set_user_attr(Attr.FAILURE, "timeout")  # what a retry must match
            if self._retries_spent(trial) and self._same_each_time(trial, "timeout"):
                return self.report(trial, self._reproduced(trial, str(exc), "timeout"))
            self._infra_failed(trial, str(exc))
            raise
        except InfraError as exc:
            self._infra_failed(trial, str(exc))
            raise
        finally:
            # the time is spent whatever the end; a storage that fails here must not hide why
            with contextlib.suppress(Exception):
                trial.set_user_attr(Attr.SPENT, self.runner.spent.record())
        self._check_identity(outcome.server_info)
        return self.report(trial, outcome)

    def report(self, trial: Trial, outcome: TrialOutcome) -> float | tuple[float, ...]:
        """Store the outcome on the trial and return its values; raise for a FAIL state."""
        if (
            outcome.status == Status.WORLD
            and self._retries_spent(trial)
            and self._same_each_time(trial, outcome.failure)
        ):
            outcome = self._reproduced(trial, outcome.reason, outcome.failure, outcome)
        attrs = outcome.to_attrs()
        attrs.update(fixed_client(self.cfg, attrs))
        if outcome.restarted:
            self._pool = attrs.get(POOL_ATTR)
        elif outcome.status.measured and self._pool is not None:
            attrs.setdefault(POOL_ATTR, self._pool)  # the reused server's pool
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if outcome.status == Status.REJECTED:
            self.stats.rejected += 1
        if outcome.launched:
            self.stats.launched += 1
        if STATE_OF[outcome.status] == TrialState.FAIL:
            self._infra_failed(trial, outcome.reason)
            raise Untrusted(outcome.reason)
        self._constrain(trial, outcome.constraints)
        return _ret(outcome.values)

    #: the KV pool of the server the last trial started (a reused server's trials carry it)
    _pool: int | None = None

    def _constrain(self, trial: Trial, constraints: Mapping[str, float]) -> None:
        """The constraints as optuna's list attribute, in CONSTRAINT_KEYS order: the one place
        both optuna 5 and optuna-dashboard read (trial.DASHBOARD_CONSTRAINTS). optuna 5 has no
        public writer for it; its deprecated `constraints_func` wrote it through the storage so."""
        values = [float(constraints[k]) for k in CONSTRAINT_KEYS]
        if any(math.isnan(v) for v in values):  # as set_constraint refuses one
            raise ValueError(f"NaN constraint in {dict(constraints)}")
        trial.storage.set_trial_system_attr(trial._trial_id, DASHBOARD_CONSTRAINTS, values)

    def _retries_spent(self, trial: Trial) -> bool:
        """This trial is the last retry its params get (budget.infra_retries)."""
        return int(trial.user_attrs.get(Attr.RETRIES, 0)) >= self.cfg.budget.infra_retries

    def _same_each_time(self, trial: Trial, failure: str | None) -> bool:
        """study/reproduce.py: every try failed as `failure`, on a host known to work before."""
        trials = self.study.get_trials(deepcopy=False)
        return counts_as_configs(trials, trial.user_attrs, failure, self.worker)

    def _reproduced(
        self, trial: Trial, reason: str, failure: str | None, outcome: TrialOutcome | None = None
    ) -> TrialOutcome:
        """A server-side failure that came back the same way on every retry of the same params:
        now it is evidence against the configuration (it never ran), not a passing fault."""
        trial.set_user_attr(Attr.REPRODUCED, True)  # no proof the host works (study/reproduce.py)
        tries = self.cfg.budget.infra_retries + 1
        status = Status.DIED if outcome is not None and outcome.metrics else Status.START_FAILED
        kept = ("metrics", "server_info", "restarted", "launched", "flags")  # what it measured
        kw: dict[str, Any] = {k: getattr(outcome, k) for k in kept} if outcome is not None else {}
        why = f"failed the same way {tries} time{'s' if tries > 1 else ''}: {reason}"
        return failed_outcome(self.cfg.objective, status, why, failure, **kw)

    def _infra_failed(self, trial: Trial, reason: str) -> None:
        self.stats.infra_failures += 1
        trial.set_user_attr(Attr.INFRA_ERROR, reason)

    def _stop_quietly(self) -> None:
        """Stop the server after a timeout; a host that does not answer is the next trial's
        problem (the lifecycle keeps the record until the group is gone)."""
        with contextlib.suppress(InfraError):
            self.runner.stop()

    def _duplicate(self, trial: Trial, earlier: FrozenTrial) -> float | tuple[float, ...]:
        self.stats.duplicates += 1
        trial.set_user_attr(Attr.DUPLICATE_OF, earlier.number)
        for key in DUPLICATE_ATTRS:
            if key in earlier.user_attrs:
                trial.set_user_attr(key, earlier.user_attrs[key])
        named = named_constraints(earlier.constraints)
        self._constrain(trial, {k: named.get(k, 1.0) for k in CONSTRAINT_KEYS})
        return _ret(tuple(earlier.values))

    def _check_identity(self, info: Mapping[str, Any]) -> None:
        """SGLang version and GPU are part of what makes trials comparable: recorded when first
        seen, and a change (an upgraded SGLang, another GPU) stops the study."""
        seen_now = {k: str(info[k]) for k in IDENTITY_KEYS if info.get(k)}
        if not seen_now:
            return
        recorded = dict(self.study.user_attrs.get(IDENTITY_ATTR) or {})
        changed = [k for k in seen_now if k in recorded and recorded[k] != seen_now[k]]
        if changed:
            what = "; ".join(f"{k} was {recorded[k]}, now {seen_now[k]}" for k in changed)
            raise StudyMismatchError(
                f"{self.cfg.source}: the server changed under study '{self.cfg.study}' ({what}): "
                "its trials would not compare with the earlier ones; start a new study "
                "(a new `study:` name) for the new server"
            )
        if any(k not in recorded for k in seen_now):
            self.study.set_user_attr(IDENTITY_ATTR, {**recorded, **seen_now})

    def _started(self, trial: Trial) -> Callable[[int], None]:
        def on_start(pgid: int) -> None:
            trial.set_user_attr(Attr.SERVER_PGID, pgid)
            self._record_server(pgid)

        return on_start

    # --- confirmation -----------------------------------------------------------------------

    def confirm(self, top: int, repeats: int) -> dict[str, list[float]]:
        """Re-run the best few feasible configs on fresh servers (study/confirm.py), then stop
        the last server; `confirm_error` says why confirmation ended early, if it did."""
        confirmation = Confirmation(
            self.cfg,
            self.study,
            self.runner,
            self.worker,
            self.trials_dir,
            ride_out=self._ride_out,
            on_start=self._record_server,
            stop=self._stop_quietly,
            deadline=self.deadline,
            on_progress=self.on_progress,
        )
        try:
            return confirmation.run(top, repeats)
        finally:
            self.stats.infra_failures += confirmation.world_failures
            self.confirm_error = confirmation.error
            self._stop_quietly()
            self.study.set_user_attr(SERVER_ATTR + self.worker, None)

    def _ride_out(self) -> RideOut:
        """How this run waits for a host that worked and went away (callbacks.RideOut)."""
        r, tolerance = self.runner, self.cfg.budget.outage_tolerance
        return RideOut(tolerance, lambda: r.started, r.clock, r.sleep, self.say, self.deadline)

    def _record_server(self, pgid: int) -> None:
        self.study.set_user_attr(SERVER_ATTR + self.worker, pgid)


def _ret(values: tuple[float, ...]) -> float | tuple[float, ...]:
    return values[0] if len(values) == 1 else values
