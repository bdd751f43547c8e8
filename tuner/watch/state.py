"""What the person watching a study sees, folded from its events. Pure (the clock is a seam).

`StudyWatch.take(event)` and `StudyWatch.finished(trial)` update it; `snapshot()` returns a
frozen `View` the displays (tuner/watch/live.py) draw: trial i of N, elapsed and ETA, the best
feasible trial so far, counts with the top reasons of infeasibility, and the current phase with
its own clock, the server's start-up milestones and the load run's progress.

Counting follows the loop's own rules: "trial i of N" counts COMPLETE trials as
`MaxTrialsCallback` does (a duplicate answered from an earlier trial counts; a FAIL does not);
the best is `outcome.is_feasible` with the first objective, as `verdict.winner.best_trial` ranks before
confirmations. A thread may read `snapshot()` while the loop writes (rich's refresh thread).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.outcome import Attr, Status, is_feasible
from tuner.watch.events import (
    LoadProgress,
    Milestone,
    PhaseChanged,
    ProgressEvent,
    RunStarted,
    TrialStarted,
)


@dataclass(frozen=True)
class Best:
    number: int
    value: float
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Counts:
    complete: int = 0
    feasible: int = 0
    infeasible: int = 0
    rejected: int = 0  # by the pre-check, before any launch
    failed: int = 0  # FAIL: the world's failures, untrusted runs
    server_reuses: int = 0  # measured on the server an earlier trial started
    duplicates: int = 0  # answered from an earlier trial, nothing run
    reasons: tuple[tuple[str, int], ...] = ()  # top reasons of infeasibility, most common first


@dataclass(frozen=True)
class View:
    """One frame of the display."""

    study: str = ""
    metric: str = ""
    n_trials: int = 0
    timeout_s: float | None = None
    elapsed_s: float = 0.0
    eta_s: float | None = None
    counts: Counts = Counts()
    best: Best | None = None
    trial: int | None = None  # the trial running now
    params: Mapping[str, Any] = field(default_factory=dict)
    confirm: int = 0  # > 0: a confirmation run (confirm of confirms)
    confirms: int = 0
    phase: str | None = None
    phase_s: float = 0.0
    milestones: tuple[str, ...] = ()
    load: LoadProgress | None = None

    @property
    def index(self) -> int:
        """The running trial's place in the budget: i of N (COMPLETE trials so far + 1)."""
        return min(self.counts.complete + 1, self.n_trials) if self.n_trials else 0


def reason_key(trial: FrozenTrial) -> str:
    """A short, countable reason why a completed trial is infeasible."""
    a = trial.user_attrs
    status = a.get(Attr.STATUS)
    if status == Status.SLO_MISSED:  # "missed SLO: ttft, tpot"
        missed = str(a.get(Attr.REASON) or "").partition(":")[2].strip()
        return f"SLO {missed.replace(', ', '+')}" if missed else "SLO missed"
    failure = a.get(Attr.FAILURE)
    if failure:
        return str(failure)
    return str(status or "infeasible")


#: a milestone that ends what another began: the beginning drops from the display
_BEGUN = {"weights": "weights_begin", "graphs": "graphs_begin"}


class StudyWatch:
    """Folds a run's events into `View`s."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, top_reasons: int = 3):
        self.clock = clock
        self.top_reasons = top_reasons
        self._lock = threading.Lock()
        self._t0 = clock()
        self._run = RunStarted("", 0, None, "", 0)
        self._counts: Counter[str] = Counter()
        self._reasons: Counter[str] = Counter()
        self._best: Best | None = None
        self._done_here = 0  # COMPLETE trials this run
        self._confirms_started = 0
        self._current: TrialStarted | None = None
        self._current_t0 = self._t0
        self._phase: str | None = None
        self._phase_t0 = self._t0
        self._milestones: list[Milestone] = []
        self._load: LoadProgress | None = None

    # --- events ---------------------------------------------------------------------------

    def take(self, event: ProgressEvent) -> None:
        """Fold one progress event in."""
        with self._lock:
            if isinstance(event, RunStarted):
                self._run, self._t0 = event, self.clock()
                for t in event.trials:
                    self._count(t)
            elif isinstance(event, TrialStarted):
                self._current, self._current_t0 = event, self.clock()
                self._confirms_started += 1 if event.confirm else 0
                self._set_phase(None)
            elif isinstance(event, PhaseChanged):
                self._set_phase(event.phase)
            elif isinstance(event, Milestone):
                # "loading weights" is news until "weights loaded" replaces it
                begun = _BEGUN.get(event.key)
                self._milestones = [m for m in self._milestones if m.key != begun]
                self._milestones.append(event)
            elif isinstance(event, LoadProgress):
                self._load = event

    def finished(self, trial: FrozenTrial) -> None:
        """Fold a finished trial in (optuna's callback, every state)."""
        with self._lock:
            self._count(trial)
            if trial.state == TrialState.COMPLETE:
                self._done_here += 1
            self._current = None
            self._set_phase(None)

    def counted(self, trial: FrozenTrial) -> None:
        """Fold in a trial another worker of the study finished (a fleet): the counts, the best
        and the pace move; this worker's own trial and phase do not."""
        with self._lock:
            self._count(trial)
            if trial.state == TrialState.COMPLETE:
                self._done_here += 1

    def phase_elapsed(self) -> tuple[str | None, float]:
        """The current phase and how long it has lasted (seconds)."""
        with self._lock:
            return self._phase, self.clock() - self._phase_t0

    # --- the view -------------------------------------------------------------------------

    def snapshot(self) -> View:
        """The display's frame now."""
        with self._lock:
            now = self.clock()
            cur = self._current
            c = self._counts
            counts = Counts(
                complete=c["complete"],
                feasible=c["feasible"],
                infeasible=c["infeasible"],
                rejected=c["rejected"],
                failed=c["failed"],
                server_reuses=c["reuse"],
                duplicates=c["duplicate"],
                reasons=tuple(self._reasons.most_common(self.top_reasons)),
            )
            return View(
                study=self._run.study,
                metric=self._run.metric,
                n_trials=self._run.n_trials,
                timeout_s=self._run.timeout_s,
                elapsed_s=now - self._t0,
                eta_s=self._eta(now, counts.complete),
                counts=counts,
                best=self._best,
                trial=cur.number if cur else None,
                params=dict(cur.params) if cur else {},
                confirm=cur.confirm if cur else 0,
                confirms=cur.confirms if cur else 0,
                phase=self._phase,
                phase_s=now - self._phase_t0,
                milestones=tuple(m.text for m in self._milestones),
                load=self._load if self._phase == "load" else None,
            )

    # --- inside ---------------------------------------------------------------------------

    def _set_phase(self, phase: str | None) -> None:
        if phase == self._phase and phase is not None:
            return
        if phase in (None, "restart"):  # a new start: its own milestones
            self._milestones = []
        self._phase, self._phase_t0 = phase, self.clock()
        self._load = None

    def _count(self, t: FrozenTrial) -> None:
        a = t.user_attrs
        if t.state == TrialState.FAIL:
            self._counts["failed"] += 1
            return
        if t.state != TrialState.COMPLETE:
            return
        self._counts["complete"] += 1
        if Attr.DUPLICATE_OF in a:
            self._counts["duplicate"] += 1
            return
        status = a.get(Attr.STATUS)
        if status == Status.REJECTED:
            self._counts["rejected"] += 1
            return
        if status in (Status.OK, Status.SLO_MISSED) and not a.get(Attr.RESTARTED):
            self._counts["reuse"] += 1
        if t.values and is_feasible(t.constraints):
            self._counts["feasible"] += 1
            if self._best is None or t.values[0] > self._best.value:
                self._best = Best(t.number, float(t.values[0]), dict(t.params))
        else:
            self._counts["infeasible"] += 1
            self._reasons[reason_key(t)] += 1

    def _eta(self, now: float, complete: int) -> float | None:
        """Time left: this run's time per completed trial times the trials and confirmation
        runs still to go (the running one counted from its start); the trials stop at the
        time budget. None before the first trial completes."""
        if self._done_here == 0:
            return None
        elapsed = now - self._t0
        per = elapsed / self._done_here
        cur = self._current
        into = now - self._current_t0 if cur is not None else 0.0
        confirms = max(0, self._run.confirm_runs - self._confirms_started)
        if cur is not None and cur.confirm:
            return max(0.0, per * (confirms + 1) - into)
        trials = max(0.0, per * max(0, self._run.n_trials - complete) - into)
        if self._run.timeout_s is not None:
            trials = min(trials, max(0.0, self._run.timeout_s - elapsed))
        return trials + per * confirms
