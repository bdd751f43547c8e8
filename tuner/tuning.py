"""The loop of one `tuner tune` run: optuna asks, the runner measures, outcomes become states.

Outcomes map to optuna states in one place, `STATE_OF` (per library-notes.md):

    measured (feasible or SLO missed), rejected by the pre-check,
    failed to start or died for the config's sake   -> COMPLETE, constraints say feasible or not
    a load run not trusted (the client lagged)       -> FAIL, params re-enqueued (bounded)
    infrastructure failure (InfraError)              -> FAIL, params re-enqueued (bounded)
    interrupted (Ctrl-C / SIGTERM)                   -> FAIL, server stopped, exit 130
    a config already measured                        -> COMPLETE, copied from the earlier trial

What happens after a trial (retries, probes, progress) is a callback each (callbacks.py).
`budget.trial_timeout` is parsed but not yet enforced: its place is `Tuning.objective`, around
`runner.run` (the reliability issue).
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.callbacks import ProbeConcurrency, Progress, RetryInfraFailures
from tuner.config import StudyConfig
from tuner.errors import InfraError, StudyMismatchError
from tuner.results import CONFIRM_ATTR, completed, measured_before, top_trials
from tuner.runner import TrialRunner
from tuner.space import active_params, sample, sglang_defaults
from tuner.trial import CONSTRAINT_KEYS, Attr, Status, TrialOutcome

IDENTITY_ATTR = "tuner:server_identity"
IDENTITY_KEYS = ("version", "gpu")
SERVER_ATTR = "tuner:server_pgid:"  # + worker: the live server a worker left running
#: what a duplicate copies from the trial that measured its configuration
DUPLICATE_ATTRS = (Attr.STATUS, Attr.REASON, Attr.METRICS, Attr.SERVER_INFO, Attr.FAILURE)

#: the one place an outcome becomes an optuna state: FAIL teaches the sampler nothing
STATE_OF: Mapping[Status, TrialState] = {
    Status.OK: TrialState.COMPLETE,
    Status.SLO_MISSED: TrialState.COMPLETE,
    Status.REJECTED: TrialState.COMPLETE,
    Status.START_FAILED: TrialState.COMPLETE,
    Status.DIED: TrialState.COMPLETE,
    Status.FLAGGED: TrialState.FAIL,
}


def default_worker(host: str) -> str:
    """A worker's name when none is given: this machine and the target it drives."""
    return f"{socket.gethostname()}:{host}"


class Untrusted(InfraError):
    """The load run measured the client, not the server: discard, do not learn from it."""


@dataclass
class TuneStats:
    launched: int = 0
    rejected: int = 0
    duplicates: int = 0
    infra_failures: int = 0


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
    ):
        self.cfg = cfg
        self.study = study
        self.runner = runner
        self.trials_dir = trials_dir
        self.worker = worker or default_worker(cfg.target.host)
        self.on_trial = on_trial
        self.stop_group = stop_group
        self.stats = TuneStats()
        self.confirm_error: str | None = None

    # --- start-up ---------------------------------------------------------------------------

    def recover(self) -> list[int]:
        """Fail this worker's zombie trials, stop the servers they left, re-enqueue their params."""
        recovered = []
        left = self.study.user_attrs.get(SERVER_ATTR + self.worker)
        if left and self.stop_group:
            self.stop_group(int(left))
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get(Attr.WORKER) != self.worker:
                continue  # another worker's: its heartbeat decides
            pgid = t.user_attrs.get(Attr.SERVER_PGID)
            if pgid and self.stop_group:
                self.stop_group(int(pgid))
            with warnings.catch_warnings():
                # optuna warns that heartbeats belong to optimize(): failing a dead trial is fine
                warnings.simplefilter("ignore", UserWarning)
                self.study.tell(t.number, state=TrialState.FAIL)
            self.study.enqueue_trial(dict(t.params), user_attrs={Attr.RETRY_OF: t.number})
            recovered.append(t.number)
        self.study.set_user_attr(SERVER_ATTR + self.worker, None)
        return recovered

    def enqueue_baseline(self, gpu_mem_mib: float | None = None) -> None:
        """Trial 0 is what runs today: the study file's baseline, else SGLang's defaults (the
        sampler picks whatever neither gives, such as the client's concurrency)."""
        if self.study.trials:
            return
        if self.cfg.baseline:
            params = active_params(self.cfg.baseline, self.cfg.space)
        else:
            params = sglang_defaults(self.cfg, gpu_mem_mib)
        if params:
            self.study.enqueue_trial(params, user_attrs={Attr.BASELINE: True})

    def remaining(self, n_trials: int) -> int:
        return max(0, n_trials - len(completed(self.study)))

    # --- the loop -------------------------------------------------------------------------

    def optimize(self, n_trials: int, timeout_s: float | None) -> None:
        """Run until `n_trials` trials are complete in the study (across resumes) or time is up."""
        if self.remaining(n_trials) == 0:
            return
        callbacks: list[Callable[[optuna.Study, FrozenTrial], None]] = [
            MaxTrialsCallback(n_trials, states=(TrialState.COMPLETE,)),
            RetryInfraFailures(self.cfg.budget.infra_retries),
            ProbeConcurrency(self.cfg.space.get("concurrency"), self.cfg.budget, n_trials),
        ]
        if self.on_trial:
            callbacks.append(Progress(self.on_trial))
        try:
            self.study.optimize(
                self.objective,
                timeout=timeout_s,
                catch=(InfraError,),
                callbacks=callbacks,
                gc_after_trial=False,
            )
        finally:
            self.runner.stop()
            self.study.set_user_attr(SERVER_ATTR + self.worker, None)

    def objective(self, trial: Trial) -> float | tuple[float, ...]:
        """optuna's objective: sample, dedupe, run, and report the outcome."""
        params = sample(trial, self.cfg.space)
        trial.set_user_attr(Attr.WORKER, self.worker)
        earlier = measured_before(self.study, params, trial.number)
        if earlier is not None:
            return self._duplicate(trial, earlier)
        try:
            outcome = self.runner.run(
                trial.number,
                params,
                self.trials_dir / str(trial.number),
                on_start=self._started(trial),
            )
        except InfraError as exc:
            self.stats.infra_failures += 1
            trial.set_user_attr(Attr.INFRA_ERROR, str(exc))
            raise
        self._check_identity(outcome.server_info)
        return self.report(trial, outcome)

    def report(self, trial: Trial, outcome: TrialOutcome) -> float | tuple[float, ...]:
        """Store the outcome on the trial and return its values; raise for a FAIL state."""
        for key, value in outcome.to_attrs().items():
            trial.set_user_attr(key, value)
        if outcome.status == Status.REJECTED:
            self.stats.rejected += 1
        if outcome.launched:
            self.stats.launched += 1
        if STATE_OF[outcome.status] == TrialState.FAIL:
            self.stats.infra_failures += 1
            trial.set_user_attr(Attr.INFRA_ERROR, outcome.reason)
            raise Untrusted(outcome.reason)
        for key in CONSTRAINT_KEYS:
            trial.set_constraint(key, outcome.constraints[key])
        return _ret(outcome.values)

    def _duplicate(self, trial: Trial, earlier: FrozenTrial) -> float | tuple[float, ...]:
        self.stats.duplicates += 1
        trial.set_user_attr(Attr.DUPLICATE_OF, earlier.number)
        for key in DUPLICATE_ATTRS:
            if key in earlier.user_attrs:
                trial.set_user_attr(key, earlier.user_attrs[key])
        for key in CONSTRAINT_KEYS:
            trial.set_constraint(key, earlier.constraints.get(key, 1.0))
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
            self.study.set_user_attr(SERVER_ATTR + self.worker, pgid)

        return on_start

    # --- confirmation -----------------------------------------------------------------------

    def confirm(self, top: int, repeats: int) -> dict[str, list[float]]:
        """Re-run the best few feasible configs `repeats` times; the study keeps every value."""
        # each worker writes its own record: workers sharing a study never overwrite each other
        key = f"{CONFIRM_ATTR}:{self.worker}"
        confirmations: dict[str, list[float]] = dict(self.study.user_attrs.get(key) or {})
        try:
            for t in top_trials(self.study, top):
                runs = confirmations.setdefault(str(t.number), [])
                while len(runs) < repeats:
                    outcome = self.runner.run(
                        t.number,
                        dict(t.params),
                        self.trials_dir / f"{t.number}-confirm{len(runs) + 1}",
                    )
                    runs.append(outcome.values[0] if outcome.feasible else 0.0)
                    self.study.set_user_attr(key, confirmations)
        except InfraError as exc:
            # the study itself is done: export what is confirmed so far rather than nothing
            self.stats.infra_failures += 1
            self.confirm_error = str(exc)
        finally:
            self.runner.stop()
        return confirmations


def _ret(values: tuple[float, ...]) -> float | tuple[float, ...]:
    return values[0] if len(values) == 1 else values
