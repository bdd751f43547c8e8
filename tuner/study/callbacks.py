"""What happens after each trial, as optuna callbacks: retries, runaway halts, probes, progress.

Each is a small callable `(study, frozen_trial) -> None` with one job, so the loop in
study/loop.py only lists them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config.schema import BudgetSection
from tuner.config.space import ParamSpec
from tuner.outcome import Attr, Status, retry_attrs
from tuner.verdict.trials import completed, feasible_trials, measured_before

#: a probe moves concurrency up (SLOs held) or down (missed) by this factor
PROBE_FACTOR = 1.5


class RetryInfraFailures:
    """Re-enqueue the params of a trial the infrastructure failed, at most `max_retries` times."""

    def __init__(self, max_retries: int):
        self.max_retries = max_retries

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state != TrialState.FAIL or Attr.INFRA_ERROR not in trial.user_attrs:
            return
        retries = int(trial.user_attrs.get(Attr.RETRIES, 0))
        if retries < self.max_retries:
            study.enqueue_trial(
                dict(trial.params),
                user_attrs=retry_attrs(
                    trial.number, trial.user_attrs, **{Attr.RETRIES: retries + 1}
                ),
            )


class RideOut:
    """The pauses of an outage ridden out: a host that worked (`worked()`) and now fails every
    try at once (an sshd restart, a reboot, a network blip) is waited for, up to `tolerance_s`
    (budget.outage_tolerance) from the first failure in a row. No pause after that first one
    (one failure is a try's bad luck: its retry runs at once), then PAUSE_FIRST_S doubling to
    PAUSE_MAX_S, never past the tolerance or `deadline` (a `clock()` value: the run's
    --timeout), so an outage costs about tolerance / PAUSE_MAX_S + 6 tries at most."""

    PAUSE_FIRST_S = 5.0
    PAUSE_MAX_S = 60.0

    def __init__(
        self,
        tolerance_s: float = 0.0,
        worked: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        say: Callable[[str], None] | None = None,
        deadline: float | None = None,
    ):
        self.tolerance_s, self.worked = tolerance_s, worked
        self.clock, self.sleep, self.say, self.deadline = clock, sleep, say, deadline
        self.count = 0
        self.first: float | None = None  # when this streak's first failure ended
        self.riding = False  # the last failure was ridden out (tolerance on, host worked)

    def reset(self) -> None:
        """A try succeeded: the streak is over."""
        self.count, self.first = 0, None

    def failed(self, what: str) -> bool:
        """One more failure in a row (`what`: what failed and why); pause and True while it is
        ridden out, False when it is not (the host never worked, or the tolerance is spent)."""
        now = self.clock()
        self.first = now if self.first is None else self.first
        self.count += 1
        self.riding = self.tolerance_s > 0 and self.worked()
        left = self.first + self.tolerance_s - now if self.riding else 0.0
        if left <= 0:
            return False
        pause = min(self.PAUSE_FIRST_S * 2 ** (self.count - 2), self.PAUSE_MAX_S, left)
        if self.deadline is not None:
            pause = min(pause, self.deadline - now)
        if self.count > 1 and pause > 0:
            if self.say is not None:
                self.say(
                    f"waiting: {self.count} tries in a row failed for the world's reasons "
                    f"(last: {what[:160]}); waiting {pause:.0f} s before the next, for up to "
                    f"{left:.0f} s more (budget.outage_tolerance)"
                )
            self.sleep(pause)
        return True


class HaltOnRunaway:
    """Stop the study when `limit` trials of this worker in a row failed for the world's reasons,
    unless `ride` rides the failures out (a host that worked, within budget.outage_tolerance).

    Failed trials do not count toward `n_trials`, so without this bound an unreachable host
    turns the night into thousands of failed trials; a host that never worked in this run (a
    typo, a key not trusted) stops at `limit` as soon as it is reached. Any completed trial
    resets the count and proves the host works, except one that did not reach it: a world failure
    counted as the configuration's (study/reproduce.py: no server ran), a duplicate answered from an
    earlier trial, a rejection by the pre-check. `optuna.Study.stop` ends the loop after this
    trial; `halted` says why, for the caller to raise.
    """

    def __init__(self, limit: int, worker: str, ride: RideOut | None = None):
        self.limit = limit
        self.worker = worker
        self.ride = ride or RideOut()
        worked = self.ride.worked
        self.ride.worked = lambda: self.completed or worked()
        self.completed = False  # a trial of this worker completed in this run
        self.halted: str | None = None

    @property
    def count(self) -> int:
        return self.ride.count

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.user_attrs.get(Attr.WORKER) not in (None, self.worker):
            return
        if trial.state == TrialState.COMPLETE:
            if _touched_host(trial.user_attrs):
                self.ride.reset()
                self.completed = True
            return
        if trial.state != TrialState.FAIL or Attr.INFRA_ERROR not in trial.user_attrs:
            return
        last = str(trial.user_attrs[Attr.INFRA_ERROR])[:300]
        if self.ride.failed(f"trial {trial.number}: {last}") or self.count < self.limit:
            return
        r = self.ride
        over = f" over {r.clock() - (r.first or 0):.0f} s" if r.riding else ""
        self.halted = (
            f"{self.count} trials in a row failed for reasons outside their configuration"
            f"{over} (budget.max_consecutive_infra_failures = {self.limit}"
            + (f", budget.outage_tolerance = {r.tolerance_s:g} s" if r.riding else "")
            + f"); last: {last}"
        )
        study.stop()


def _touched_host(attrs: Mapping[str, Any]) -> bool:
    """A completed trial that reached the host: not a reproduced world failure, a duplicate
    (its record is another trial's) or a pre-check rejection."""
    return not (
        attrs.get(Attr.REPRODUCED)
        or Attr.DUPLICATE_OF in attrs
        or attrs.get(Attr.STATUS) == Status.REJECTED
    )


class LeaveTimeToConfirm:
    """Stop the trials while the run's `deadline` (`--timeout`, a `clock()` value) still holds
    the confirmation's `runs` (each a restart and a load run) at the median length of this
    run's trials that restarted a server: a timeout is the time the night has, confirmation
    included, and a winner exported unconfirmed is worth less than one trial fewer."""

    def __init__(
        self,
        deadline: float,
        runs: int,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ):
        self.deadline, self.runs, self.clock, self.say = deadline, runs, clock, say
        self.lengths: list[float] = []
        self.stopped = False
        # a trial's length on the runner's clock (virtual in a virtual study): from the last end
        self.last = clock()

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        now = self.clock()
        length, self.last = now - self.last, now
        if trial.user_attrs.get(Attr.RESTARTED):
            self.lengths.append(length)
        if not self.lengths or self.stopped:
            return
        one = sorted(self.lengths)[len(self.lengths) // 2]
        left = self.deadline - now
        # with nothing feasible yet there is nothing to confirm: the time is the search's
        if left <= self.runs * one and feasible_trials(study):
            self.stopped = True
            if self.say is not None:
                self.say(
                    f"trials stop here: --timeout leaves {left:.0f} s, about what confirmation's "
                    f"{self.runs} runs take (a restart here takes {one:.0f} s)"
                )
            study.stop()


class ProbeConcurrency:
    """After a fresh server measured, queue the same server at a neighbouring concurrency:
    measuring it costs no restart. Up by PROBE_FACTOR while the SLOs hold, down when missed,
    onto the range's `step` grid."""

    def __init__(
        self,
        spec: ParamSpec | None,
        budget: BudgetSection,
        n_trials: int | None = None,
    ):
        self.spec = spec
        self.probes = budget.concurrency_probes
        self.n_trials = n_trials

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        a = trial.user_attrs
        fresh = a.get(Attr.RESTARTED) or Attr.PROBE_OF in a
        if trial.state != TrialState.COMPLETE or not fresh or self.spec is None:
            return
        probes_left = int(a.get(Attr.PROBES_LEFT, self.probes))
        if probes_left <= 0 or a.get(Attr.STATUS) not in (Status.OK, Status.SLO_MISSED):
            return
        if "concurrency" not in trial.params or a.get(Attr.DUPLICATE_OF) is not None:
            return
        if self.n_trials is not None and len(completed(study)) >= self.n_trials:
            return
        c = int(trial.params["concurrency"])
        target = self._next(c, up=a.get(Attr.STATUS) == Status.OK)
        if target is None or target == c:
            return
        params = {**trial.params, "concurrency": target}
        if measured_before(study, params, -1) is None:
            study.enqueue_trial(
                params, user_attrs={Attr.PROBE_OF: trial.number, Attr.PROBES_LEFT: probes_left - 1}
            )

    def _next(self, c: int, up: bool) -> int | None:
        spec = self.spec
        assert spec is not None
        if spec.choices:
            ladder = sorted({int(x) for x in spec.choices})
            i = ladder.index(c) + (1 if up else -1) if c in ladder else -1
            return ladder[i] if 0 <= i < len(ladder) else None
        target = round(c * PROBE_FACTOR) if up else round(c / PROBE_FACTOR)
        low = int(spec.low or 1)
        high = int(spec.high or target)
        step = int(spec.step or 1)
        high = low + (high - low) // step * step  # the range's last point (optuna's grid)
        # the nearest point of the range's grid (low + k * step), at least one step from c
        on = low + round((target - low) / step) * step
        if on == c:
            on = c + step if up else c - step
        return int(min(max(on, low), high))


class Progress:
    """Hands every finished trial to a presentation callback (e.g. one line per trial)."""

    def __init__(self, on_trial: Callable[[FrozenTrial], None]):
        self.on_trial = on_trial

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.on_trial(trial)
