"""One worker's confirmation runs as the study keeps them: a value per run and, index by index,
the run's latency tails (verdict.tails.tails_of), which verdict/winner.py pools into the winner's verdict.

    tuner:confirmations:<worker> = {"12": [1830.2, 0.0, 1795.4]}
    tuner:confirm_tails:<worker> = {"12": [{...}, None, {...}]}     # None: a death, no tails

A run with tails keeps its measured value even when its own p99 missed a limit (the run-to-run
noise reads it) and its tails join the configuration's pooled verdict; verdict/winner.py ranks such a
run 0.0, as a start that would have missed its SLOs. A run that could not measure (a death, a
failed start) counts 0.0 as before, and so does a miss without tails to pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config.objective import ObjectiveSection
from tuner.config.schema import StudyConfig
from tuner.errors import InfraError, TrialTimeout
from tuner.outcome import TrialOutcome, full_params, objective_values
from tuner.study.callbacks import RideOut
from tuner.study.states import ROUNDS_ATTR, STATE_OF
from tuner.trial.runner import TrialRunner
from tuner.trial.watchdog import WATCHDOG_GRACE_S, watchdog
from tuner.verdict.gpuhours import CONFIRM_SPENT_ATTR
from tuner.verdict.trials import CONFIRM_ATTR, CONFIRM_TAILS_ATTR, aligned, completed, top_trials
from tuner.verdict.winner import out_of_reach, shaky_winner, unsettled
from tuner.watch.events import TrialStarted

Tails = Mapping[str, Any] | None


class ConfirmTimeUp(Exception):
    """The run's --timeout passed during confirmation (not a failure: it ends early)."""


def run_value(objective: ObjectiveSection, outcome: TrialOutcome) -> tuple[float, Tails]:
    """A confirmation run's (value, tails) from its outcome (not a FAIL one: those run again)."""
    if outcome.feasible:
        return outcome.values[0], outcome.tails
    if outcome.status.measured and outcome.tails is not None:
        return objective_values(objective, outcome.metrics)[0], outcome.tails  # judged pooled
    return 0.0, None


class ConfirmRecord:
    """This worker's confirmation values and tails, read from the study and written back after
    every run (the tails first: a kill between the two writes leaves a tail without its value,
    which `verdict.winner.aligned` drops, never a value paired with another run's tail)."""

    def __init__(self, study: optuna.Study, worker: str):
        self.study = study
        self.values_key = f"{CONFIRM_ATTR}:{worker}"
        self.tails_key = f"{CONFIRM_TAILS_ATTR}:{worker}"
        self.rounds_key = f"{ROUNDS_ATTR}:{worker}"
        self.worker = worker
        stored = study.user_attrs.get(self.tails_key) or {}
        self.values: dict[str, list[float]] = {
            k: list(v) for k, v in (study.user_attrs.get(self.values_key) or {}).items()
        }
        self.tails: dict[str, list[Tails]] = {
            k: aligned(v, stored.get(k)) for k, v in self.values.items()
        }

    def runs(self, number: int) -> list[float]:
        """The values of trial `number`'s runs so far (the live list)."""
        self.tails.setdefault(str(number), [])
        return self.values.setdefault(str(number), [])

    def add(self, number: int, value: float, tails: Tails) -> None:
        self.runs(number).append(value)
        self.tails[str(number)].append(None if tails is None else dict(tails))
        self.study.set_user_attr(self.tails_key, self.tails)
        self.study.set_user_attr(self.values_key, self.values)

    def spent(self, number: int, record: Mapping[str, Any]) -> None:
        """Where a confirmation run's server time went (trial/spent.py, verdict/gpuhours.py)."""
        key = f"{CONFIRM_SPENT_ATTR}:{self.worker}"
        stored = dict(self.study.user_attrs.get(key) or {})
        stored[str(number)] = [*(stored.get(str(number)) or []), dict(record)]
        self.study.set_user_attr(key, stored)

    @property
    def rounds(self) -> int:
        """The extra rounds (budget.confirm_extra) this worker ran on the study's trials as they
        are: a budget of the study, not of each `tune` (a re-run of a finished study only
        re-exports); more trials since (a raised --n-trials) start it afresh."""
        done, rounds = self.study.user_attrs.get(self.rounds_key) or (None, 0)
        return int(rounds) if done == len(completed(self.study)) else 0

    def add_round(self) -> None:
        count = [len(completed(self.study)), self.rounds + 1]
        self.study.set_user_attr(self.rounds_key, count)


@dataclass
class Confirmation:
    """One worker's confirmation of a study's best configurations (`Tuning.confirm`).

    The best `top` feasible configs run `repeats` times, round by round, each run on a fresh
    server (the luck of a start is most of a configuration's noise); the study keeps every
    value. With `budget.early_stop`, a candidate that trails a steady winner by more than the
    noise after a round (`verdict.winner.out_of_reach`) skips the rounds left: the winner
    always runs every repeat, and a shaky one keeps every candidate in. Then, at most
    `budget.confirm_extra` rounds of `verdict.winner.unsettled`: a winner with a start that
    missed on its own, or unsure of holding its limits (verdict/tails.py), runs again beside the
    best config not yet confirmed, one whose pooled p99 is near a limit runs again, and one
    within the run-to-run noise of the runner-up beside it: luck loses its lead. Then at most
    `budget.confirm_shaky` rounds more while the winner is still shaky, each within --timeout
    (`deadline`): where every candidate found sits at an SLO's edge, two rounds confirm two
    fallbacks at most, and a night that stopped at its trial cap has the hours for more.

    A run the world spoiled (InfraError, WORLD, a lagging client) is not a 0.0: it is run again,
    at most budget.infra_retries times per config, then confirmation stops with `error` set.
    Each run keeps its latency tails: the winner is judged on all its runs' requests together
    (verdict/winner.py).
    """

    cfg: StudyConfig
    study: optuna.Study
    runner: TrialRunner
    worker: str
    trials_dir: Path
    #: how a host that worked and went away is waited for (as between trials)
    ride_out: Callable[[], RideOut]
    on_start: Callable[[int], None]  # a server's process group exists: record it at once
    stop: Callable[[], None]  # stop the server quietly (a run that timed out or failed)
    deadline: float | None = None  # the run's --timeout as a runner.clock() value
    on_progress: Callable[[TrialStarted], None] | None = None
    #: why confirmation ended early (None: it did not), and how many world failures ended it
    error: str | None = None
    world_failures: int = 0
    _repeats: int = 0

    def run(self, top: int, repeats: int) -> dict[str, list[float]]:
        """The confirmation values by trial number (this worker's record: workers sharing a
        study never overwrite each other)."""
        record = ConfirmRecord(self.study, self.worker)
        self._repeats = repeats
        try:
            tops = top_trials(self.study, top)
            # round by round: a candidate out of reach of a steady winner after a round (its
            # gap beyond the noise measured) runs no more repeats with budget.early_stop
            for k in range(1, repeats + 1):
                out = out_of_reach(self.study) if k > 1 and self.cfg.budget.early_stop else set()
                for t in tops:
                    if t.number not in out:
                        self._runs(t, record, k)
            budget = self.cfg.budget
            for done in range(record.rounds, budget.confirm_extra + budget.confirm_shaky):
                # past confirm_extra, a round runs only for a shaky winner: a night that ends
                # on one exports a start that misses its limits one time in ten or more
                if not top or (done >= budget.confirm_extra and not shaky_winner(self.study)):
                    break
                numbers = unsettled(self.study, rounds_left=max(budget.confirm_extra - done, 0))
                if not numbers:
                    break
                for number in numbers:
                    runs = record.runs(number)
                    self._repeats = len(runs) + 1
                    t = self.study.get_trials(deepcopy=False)[number]  # numbers are indexes
                    self._runs(t, record, len(runs) + 1)
                record.add_round()
        except (InfraError, ConfirmTimeUp) as exc:
            # the study itself is done: export what is confirmed so far rather than nothing
            self.world_failures += isinstance(exc, InfraError)
            self.error = str(exc)
        return record.values

    def _runs(self, t: FrozenTrial, record: ConfirmRecord, until: int) -> None:
        """Confirmation runs of `t` until it has `until` of this worker's (spoiled ones retried;
        a host that went away is waited for as between trials: callbacks.RideOut)."""
        runs = record.runs(t.number)
        spoiled, ride = 0, self.ride_out()
        while len(runs) < until:
            run = self._once(t, len(runs) + 1)
            record.spent(t.number, self.runner.spent.record())  # a spoiled run's time too
            if run is None:
                spoiled += 1
                riding = ride.failed(f"a confirmation run of trial {t.number}")
                if spoiled > self.cfg.budget.infra_retries and not riding:
                    raise InfraError(
                        f"trial {t.number}: {spoiled} confirmation runs failed for "
                        "reasons outside the configuration"
                    )
                continue
            record.add(t.number, *run)
            ride.reset()

    def _once(self, t: FrozenTrial, n: int) -> tuple[float, Tails] | None:
        """One confirmation run's (value, tails); None when the world spoiled it."""
        if self.deadline is not None and self.runner.clock() >= self.deadline:
            raise ConfirmTimeUp("--timeout reached: confirmation stopped; what ran is kept")
        if self.on_progress is not None:
            self.on_progress(TrialStarted(t.number, dict(t.params), n, self._repeats))
        limit = float(self.cfg.budget.trial_timeout)
        try:
            with watchdog(limit + WATCHDOG_GRACE_S, lambda: self.runner.phase):
                outcome = self.runner.run(
                    t.number,
                    full_params(t.params, t.user_attrs),  # inner: at its chosen concurrency
                    self.trials_dir / f"{t.number}-confirm{n}",
                    on_start=self.on_start,
                    deadline=self.runner.clock() + limit,
                    fresh=True,
                )
        except (TrialTimeout, InfraError):
            self.stop()
            return None
        if STATE_OF[outcome.status] == TrialState.FAIL:
            return None
        return run_value(self.cfg.objective, outcome)
