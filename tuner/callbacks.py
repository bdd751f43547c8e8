"""What happens after each trial, as optuna callbacks: retries, runaway halts, probes, progress.

Each is a small callable `(study, frozen_trial) -> None` with one job, so the loop in
tuning.py only lists them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config import BudgetSection, ParamSpec
from tuner.results import completed, feasible_trials, measured_before
from tuner.trial import Attr, Status, retry_attrs

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


class HaltOnRunaway:
    """Stop the study when `limit` trials of this worker in a row failed for the world's reasons,
    unless the host worked in this run and the failures began less than `tolerance_s` ago.

    Failed trials do not count toward `n_trials`, so without this bound an unreachable host
    turns the night into thousands of failed trials. But a host that worked and then failed
    (an sshd restart, a reboot, a network blip) fails every trial at once, three in a few
    seconds: that is ridden out for `tolerance_s` (budget.outage_tolerance), with a pause
    after each failure but a streak's first that doubles from PAUSE_FIRST_S to PAUSE_MAX_S, so
    an outage costs a bounded number of trials (about tolerance / PAUSE_MAX_S + 6). A host that never worked
    in this run (a typo, a key not trusted) stops at `limit` as soon as it is reached.

    Any completed trial resets the count and proves the host works, except a world failure
    counted as the configuration's (reproduce.py: no server ran). `worked()` says whether a
    server of this run started (one that later died also proves the host was up).
    `optuna.Study.stop` ends the loop after this trial; `halted` says why, for the caller to
    raise. `deadline` (a `clock()` value: the run's timeout) bounds each pause.
    """

    PAUSE_FIRST_S = 5.0
    PAUSE_MAX_S = 60.0

    def __init__(
        self,
        limit: int,
        worker: str,
        tolerance_s: float = 0.0,
        *,
        worked: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_wait: Callable[[str], None] | None = None,
        deadline: float | None = None,
    ):
        self.limit = limit
        self.worker = worker
        self.tolerance_s = tolerance_s
        self.worked = worked
        self.clock, self.sleep, self.on_wait, self.deadline = clock, sleep, on_wait, deadline
        self.count = 0
        self.since: float | None = None  # when this streak's first failure ended
        self.completed = False  # a trial of this worker completed in this run
        self.paused_s = 0.0
        self.halted: str | None = None

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.user_attrs.get(Attr.WORKER) not in (None, self.worker):
            return
        if trial.state == TrialState.COMPLETE:
            if not trial.user_attrs.get(Attr.REPRODUCED):
                self.count, self.since, self.completed = 0, None, True
            return
        if trial.state != TrialState.FAIL or Attr.INFRA_ERROR not in trial.user_attrs:
            return
        now = self.clock()
        self.since = now if self.since is None else self.since
        self.count += 1
        last = str(trial.user_attrs[Attr.INFRA_ERROR])[:300]
        riding = self.tolerance_s > 0 and (self.completed or self.worked())
        left = self.since + self.tolerance_s - now if riding else 0.0
        if self.count >= self.limit and left <= 0:
            over = f" over {now - self.since:.0f} s" if riding else ""
            self.halted = (
                f"{self.count} trials in a row failed for reasons outside their configuration"
                f"{over} (budget.max_consecutive_infra_failures = {self.limit}"
                + (f", budget.outage_tolerance = {self.tolerance_s:g} s" if riding else "")
                + f"); last: {last}"
            )
            study.stop()
            return
        if not riding:
            return
        if self.count == 1:  # one failure is a trial's bad luck: its retry runs at once
            return
        pause = min(self.PAUSE_FIRST_S * 2 ** (self.count - 2), self.PAUSE_MAX_S, left)
        if self.deadline is not None:
            pause = min(pause, self.deadline - now)
        if pause <= 0:
            return
        if self.on_wait is not None:
            self.on_wait(
                f"{self.count} trial(s) in a row failed for the world's reasons (last: "
                f"{last[:120]}); waiting {pause:.0f} s before the next, for up to "
                f"{left:.0f} s more (budget.outage_tolerance)"
            )
        self.paused_s += pause
        self.sleep(pause)


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
