"""`--timeout` is the time the night has, confirmation included: the trials stop while the
time left still holds the confirmation's runs (at this run's restart length), and confirmation
itself starts no run past the deadline; what ran is exported."""

from __future__ import annotations

import time
from pathlib import Path

from optuna.trial import TrialState

from tests.helpers.loop import STUDY, FakeServer, setup

RESTART_S = 0.3


class SlowServer(FakeServer):
    """Each restart takes RESTART_S of real time (the trials' lengths are optuna's datetimes)."""

    def restart(self, spec, log_path, on_launch=None):
        time.sleep(RESTART_S)
        return super().restart(spec, log_path, on_launch)


#: a restart's length on TimedServer's clock: long, so optuna's own (wall-clock) timeout, the
#: same number of seconds, never comes first
TIMED_RESTART_S = 100.0


class TimedServer(FakeServer):
    """Each restart takes TIMED_RESTART_S on the runner's clock, which nothing else moves: the
    rule is judged on exact lengths, however busy the machine (with real sleeps the time left
    fell short of its bound beside two busy loops)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def restart(self, spec, log_path, on_launch=None):
        self.now += TIMED_RESTART_S
        return super().restart(spec, log_path, on_launch)


def test_trials_stop_in_time_for_confirmation(tmp_path: Path) -> None:
    data = {**STUDY, "budget": {"confirm_top": 2, "confirm_repeats": 2}}
    server = TimedServer()
    cfg, study, server, tuning = setup(tmp_path, data, server=server)
    tuning.runner.clock = server.clock
    said: list[str] = []
    tuning.say = said.append
    timeout = 12 * TIMED_RESTART_S  # room for ~8 trials alone; 4 confirmation runs are kept free
    began = server.clock()
    tuning.optimize(50, timeout)
    left = timeout - (server.clock() - began)
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert 1 <= len(done) < 50
    assert any("trials stop here" in s and "4 runs" in s for s in said), said
    # the trials stopped once the time left no longer held 4 runs of a restart's length: it
    # held them at the check before, so at least 3 (the last trial took one)
    assert left >= 3 * TIMED_RESTART_S, left
    values = tuning.confirm(top=2, repeats=2)
    assert tuning.confirm_error is None and sum(len(v) for v in values.values()) == 4


def test_confirmation_starts_no_run_past_the_deadline(tmp_path: Path) -> None:
    data = {**STUDY, "budget": {"confirm_top": 2, "confirm_repeats": 2}}
    cfg, study, server, tuning = setup(tmp_path, data)
    tuning.optimize(3, None)
    restarts = len(server.restarts)
    tuning.deadline = tuning.runner.clock() - 1  # the run's --timeout has passed
    assert not any(tuning.confirm(top=2, repeats=2).values())  # no run
    assert "--timeout reached" in (tuning.confirm_error or "")
    assert len(server.restarts) == restarts  # no restart spent
    assert tuning.stats.infra_failures == 0  # running out of time is no failure


def test_with_nothing_feasible_the_time_stays_the_searchs(tmp_path: Path) -> None:
    # every start dies of a CUDA-graph OOM: nothing to confirm, so nothing is held back
    data = {**STUDY, "budget": {"confirm_top": 2, "confirm_repeats": 2}}
    server = SlowServer()
    server.graph_cliff = 0.0
    cfg, study, server, tuning = setup(tmp_path, data, server=server)
    said: list[str] = []
    tuning.say = said.append
    began = time.monotonic()
    tuning.optimize(50, 8 * RESTART_S)
    assert not any("trials stop here" in s for s in said), said
    assert time.monotonic() - began >= 8 * RESTART_S  # optuna's own timeout ended it
