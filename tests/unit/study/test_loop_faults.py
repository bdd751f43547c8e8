"""The loop under faults: runaway halts, reproduced crashes, halts that keep their params,
the trial watchdog, confirmation runs the world spoiled, and the one-run-per-worker lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState, create_trial

from tests.helpers.loop import STUDY, FakeServer, setup
from tuner.errors import HostUnreachable, InfraRunaway, PortHeldError, StudyBusyError, TrialTimeout
from tuner.outcome import Attr, Status, named_constraints
from tuner.server.lifecycle import StartResult
from tuner.study.callbacks import HaltOnRunaway
from tuner.study.worklock import WorkerLock, lock_path, marker_for
from tuner.trial.watchdog import watchdog


class DownServer(FakeServer):
    """Every restart fails the way `fail` says."""

    def __init__(self, fail):
        super().__init__()
        self.fail = fail

    def restart(self, spec, log_path, on_launch=None):
        self.restarts.append(dict(spec.flags))
        result = self.fail(len(self.restarts))
        if result is None:  # this one starts as FakeServer's do (which records it itself)
            self.restarts.pop()
            return super().restart(spec, log_path, on_launch)
        return result


def unreachable(n: int) -> StartResult:
    raise HostUnreachable(f"ssh 127.0.0.1:1: connection refused (attempt {n})")


class FakeTime:
    """The runner's clock and sleep: time passes only in pauses, which are recorded."""

    def __init__(self, tuning) -> None:
        self.now = 0.0
        self.pauses: list[float] = []
        self.waits: list[str] = []  # what the loop said while it paused (Tuning.say)
        tuning.runner.clock, tuning.runner.sleep = self.clock, self.sleep
        tuning.say = self.waits.append

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def down_from_restart(first: int, clock, for_s: float):
    """Starts fail unreachable from restart number `first` (1-based) for `for_s` of `clock`."""
    began: list[float] = []

    def fail(n: int) -> StartResult | None:
        if n < first:
            return None
        began.append(began[0] if began else clock())
        if clock() - began[0] < for_s:
            raise HostUnreachable(f"ssh 127.0.0.1:1: connection refused (restart {n})")
        return None

    return fail


def test_consecutive_infra_failures_halt_the_study(tmp_path: Path) -> None:
    cfg, study, server, tuning = setup(tmp_path, server=DownServer(unreachable))
    with pytest.raises(InfraRunaway, match=r"3 trials in a row.*connection refused"):
        tuning.optimize(20, None)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3
    assert len(server.restarts) == 3


def test_a_completed_trial_resets_the_runaway_count(tmp_path: Path) -> None:
    drops = {0, 1, 3, 4}  # two failures, a success, two failures: never three in a row
    server = FakeServer(drop_on=drops)
    cfg, study, server, tuning = setup(
        tmp_path, data={**STUDY, "budget": {"outage_tolerance": 0}}, server=server
    )
    tuning.optimize(3, None)
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 3 and states.count(TrialState.FAIL) == 4


class CrashAt(FakeServer):
    """Starts as FakeServer does, except at mem-fraction-static `mfs`: a crash, no evidence."""

    def __init__(self, mfs: float):
        super().__init__()
        self.mfs = mfs

    def restart(self, spec, log_path, on_launch=None):
        if float(spec.flags.get("mem-fraction-static", 0)) != self.mfs:
            return super().restart(spec, log_path, on_launch)
        self.restarts.append(dict(spec.flags))
        return StartResult(False, "crashed", "exit code 139: Segmentation fault", pgid=4242)


def test_a_crash_without_evidence_is_retried_then_counts_as_the_configs(tmp_path: Path) -> None:
    cfg, study, server, tuning = setup(tmp_path, server=CrashAt(0.9))
    study.enqueue_trial({"mem-fraction-static": 0.86, "concurrency": 32})  # the host works
    study.enqueue_trial({"mem-fraction-static": 0.9, "concurrency": 32})
    tuning.optimize(8, None)  # probes of the first server may come before the retries
    trials = [t for t in study.trials if t.params.get("mem-fraction-static") == 0.9]
    # retried budget.infra_retries (2) times as the world's failure, then recorded as the config's
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    last = trials[-1].user_attrs
    assert last[Attr.STATUS] == Status.START_FAILED and last[Attr.REPRODUCED]
    assert "failed the same way 3 times" in last[Attr.REASON] and last[Attr.FAILURE] == "crashed"
    assert named_constraints(trials[-1].constraints)["c_start"] > 0  # infeasible


def test_three_different_world_failures_are_a_bad_night_not_the_configs(tmp_path: Path) -> None:
    kinds = ["crashed", "timeout", "crashed"]  # a crash, a start not ready in time, a crash

    def flaky(n: int) -> StartResult:
        return StartResult(False, kinds[(n - 1) % 3], f"world fault {n}", pgid=4242)

    cfg, study, server, tuning = setup(tmp_path, server=DownServer(flaky))
    study.enqueue_trial({"mem-fraction-static": 0.86, "concurrency": 32})
    with pytest.raises(InfraRunaway, match="3 trials in a row"):
        tuning.optimize(1, None)
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.FAIL] * 3  # never recorded infeasible
    assert all(t.params == trials[0].params for t in trials) and len(server.restarts) == 3
    assert not any(Attr.REPRODUCED in t.user_attrs for t in trials)


def test_a_host_broken_from_the_start_halts_without_writing_a_cliff(tmp_path: Path) -> None:
    """Every start hangs: the same failure three times, but no server ever ran on this host, so
    it is not the configuration's (a cliff that would outlive the host's repair): the tries stay
    failed and the runaway halt stops the night; once the host works the baseline runs."""

    def hang(n: int) -> StartResult:
        return StartResult(False, "timeout", "not ready within 15 s; killed", pgid=4242)

    data = {**STUDY, "baseline": {"mem-fraction-static": 0.86, "concurrency": 32}}
    cfg, study, server, tuning = setup(tmp_path, data, server=DownServer(hang))
    tuning.enqueue_baseline()
    with pytest.raises(InfraRunaway, match="3 trials in a row"):
        tuning.optimize(20, None)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3 and len(server.restarts) == 3
    assert not any(Attr.REPRODUCED in t.user_attrs for t in study.trials)
    assert all(t.user_attrs.get(Attr.BASELINE) for t in study.trials)  # its retries, spent
    # the host is fixed; the same command again: the baseline is measured, not forgotten
    fixed = setup(tmp_path, data, server=FakeServer())[3]
    fixed.enqueue_baseline()
    fixed.optimize(1, None)
    done = [t for t in fixed.study.trials if t.state == TrialState.COMPLETE]
    assert done and done[0].user_attrs.get(Attr.BASELINE)
    assert done[0].params == study.trials[0].params


def test_a_host_that_breaks_mid_night_costs_at_most_one_false_cliff(tmp_path: Path) -> None:
    def breaks_after_first(n: int) -> StartResult | None:
        if n == 1:
            return None  # the first server starts: the host works
        return StartResult(False, "timeout", "not ready within 15 s; killed", pgid=4242)

    cfg, study, server, tuning = setup(tmp_path, server=DownServer(breaks_after_first))
    time = FakeTime(tuning)
    with pytest.raises(InfraRunaway, match=r"in a row failed .* over \d+ s"):
        tuning.optimize(20, None)
    reproduced = [t for t in study.trials if t.user_attrs.get(Attr.REPRODUCED)]
    assert len(reproduced) == 1  # the first chain after the break, then no more proof
    # ridden out for budget.outage_tolerance (900 s) first, in pauses that double to a minute
    assert 900 <= time.now <= 960 and max(time.pauses) == 60 and time.pauses[:3] == [5, 10, 20]
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert len(failed) <= 900 / 60 + 6  # a bounded number of trials, not a night of them


def test_an_outage_after_the_host_worked_is_ridden_out(tmp_path: Path) -> None:
    """sshd restarts for 25 s mid-night: every start in it fails at once, the first retry at
    once too; the loop pauses (5, 10, 20 s), the host is back, and the study completes, no
    cliff written."""
    server = DownServer(lambda n: None)
    cfg, study, server, tuning = setup(tmp_path, server=server)
    time = FakeTime(tuning)
    server.fail = down_from_restart(2, time.clock, 25.0)
    tuning.optimize(6, None)
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) >= 6 and states.count(TrialState.FAIL) == 4
    assert time.pauses == [5, 10, 20] and len(time.waits) == 3
    assert "4 tries in a row" in time.waits[-1] and "outage_tolerance" in time.waits[-1]
    assert not any(t.user_attrs.get(Attr.REPRODUCED) for t in study.trials)


def test_no_tolerance_stops_at_the_limit_without_waiting(tmp_path: Path) -> None:
    data = {**STUDY, "budget": {"outage_tolerance": "0s"}}
    server = DownServer(lambda n: None)
    cfg, study, server, tuning = setup(tmp_path, data, server=server)
    time = FakeTime(tuning)
    server.fail = down_from_restart(2, time.clock, 25.0)
    with pytest.raises(InfraRunaway, match=r"3 trials in a row failed .*; last: .*refused"):
        tuning.optimize(6, None)
    assert time.pauses == [] and time.waits == []


def test_a_host_down_past_the_tolerance_stops_and_its_stop_failing_hides_nothing(
    tmp_path: Path,
) -> None:
    """The host stays down: the study stops after budget.outage_tolerance with the runaway's
    reason, even though stopping its last server fails too (the host is down)."""

    class Unstoppable(DownServer):
        def stop(self):
            if len(self.restarts) > 1:
                raise HostUnreachable("ssh 127.0.0.1:1: connection refused (stop)")
            super().stop()

    data = {**STUDY, "budget": {"outage_tolerance": "2m", "max_consecutive_infra_failures": 4}}
    server = Unstoppable(lambda n: None)
    cfg, study, server, tuning = setup(tmp_path, data, server=server)
    time = FakeTime(tuning)
    server.fail = down_from_restart(2, time.clock, float("inf"))
    with pytest.raises(InfraRunaway, match=r"trials in a row failed .* over 1[23]\d s"):
        tuning.optimize(20, None)
    assert 120 <= time.now <= 180 and all(p <= 60 for p in time.pauses)


def test_a_halt_keeps_the_params_for_the_resumed_run(tmp_path: Path) -> None:
    def held(n: int) -> StartResult:
        raise PortHeldError("127.0.0.1: port 1 is held by PID 7 (nginx)")

    cfg, study, server, tuning = setup(tmp_path, server=DownServer(held))
    study.enqueue_trial({"mem-fraction-static": 0.86, "concurrency": 32})
    with pytest.raises(PortHeldError):
        tuning.optimize(3, None)
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    queued = [t.system_attrs.get("fixed_params") for t in waiting]
    assert queued == [{"mem-fraction-static": 0.86, "concurrency": 32}]
    assert not any(Attr.STATUS in t.user_attrs for t in study.trials)  # nothing learned


def test_confirmation_runs_the_world_spoiled_are_not_zeros(tmp_path: Path) -> None:
    cfg, study, server, tuning = setup(tmp_path)
    tuning.optimize(4, None)
    server.drop_on = {len(server.restarts)}  # the next restart drops the connection, once
    tuning.runner._running_key = None  # force a restart for the confirmation run
    confirmations = tuning.confirm(top=1, repeats=2)
    assert tuning.confirm_error is None
    (values,) = confirmations.values()
    assert len(values) == 2 and all(v > 0 for v in values)


def test_confirmation_gives_up_after_the_retries(tmp_path: Path) -> None:
    data = {**STUDY, "budget": {"outage_tolerance": 0}}  # no outage is ridden out
    cfg, study, server, tuning = setup(tmp_path, data)
    tuning.optimize(4, None)
    n = len(server.restarts)
    server.drop_on = {n, n + 1, n + 2}
    tuning.runner._running_key = None
    confirmations = tuning.confirm(top=1, repeats=2)
    assert tuning.confirm_error and "3 confirmation runs failed" in tuning.confirm_error
    assert all(v == [] for v in confirmations.values())


def test_confirmation_waits_for_a_host_that_went_away(tmp_path: Path) -> None:
    """The host worked (4 trials), then its next 3 starts fail at once: confirmation pauses
    (5 and 10 s after the second and third) instead of giving up, and its runs complete."""
    cfg, study, server, tuning = setup(tmp_path)
    tuning.optimize(4, None)
    time = FakeTime(tuning)
    n = len(server.restarts)
    server.drop_on = {n, n + 1, n + 2}
    tuning.runner._running_key = None
    confirmations = tuning.confirm(top=1, repeats=2)
    assert tuning.confirm_error is None
    assert [len(v) for v in confirmations.values()] == [2]
    assert time.pauses == [5, 10] and "confirmation run" in time.waits[-1]


def test_watchdog_interrupts_a_wait_that_ignores_deadlines() -> None:
    t0 = time.monotonic()
    with pytest.raises(TrialTimeout, match="during load"), watchdog(0.3, lambda: "load"):
        time.sleep(30)
    assert time.monotonic() - t0 < 20
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)


def test_watchdog_is_disarmed_after_the_block() -> None:
    with watchdog(0.2, lambda: "x"):
        pass
    time.sleep(0.4)  # a late alarm would raise here
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


HOLD = """
import sys, time
from pathlib import Path
from tuner.study.worklock import WorkerLock
with WorkerLock(Path(sys.argv[1]), "study 's' as worker 'w'"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_one_live_run_per_study_and_worker_and_kill_9_frees_it(tmp_path: Path) -> None:
    path = lock_path(tmp_path / "s", "host:gpu-1")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        busy = pytest.raises(StudyBusyError, match=rf"already running \(pid {holder.pid} on")
        with busy, WorkerLock(path, "study 's' as worker 'w'"):
            pass
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        with WorkerLock(path, "study 's' as worker 'w'"):
            assert f"pid {os.getpid()}" in path.read_text()
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()


def test_markers_are_stable_and_distinct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = tmp_path / "runs" / "s"
    monkeypatch.chdir(tmp_path)
    # the same folder named relatively or absolutely is one marker (a resumed run finds its own)
    assert marker_for("s", "w", here) == marker_for("s", "w", Path("runs/s"))
    markers = {
        marker_for("s", "w", here),
        marker_for("s", "w2", here),
        marker_for("s2", "w", here),
        marker_for("s", "w", tmp_path / "other-runs" / "s"),  # another checkout's runs folder
    }
    assert len(markers) == 4


@pytest.mark.parametrize("claim", [True, False])
def test_a_trial_killed_before_naming_its_worker(tmp_path: Path, claim: bool) -> None:
    cfg, study, server, tuning = setup(tmp_path)
    study.enqueue_trial({"mem-fraction-static": 0.9, "concurrency": 64}, user_attrs={"b": 1})
    orphan = study.ask()  # created, then the process died: RUNNING, no worker, no params yet
    tuning.claim_unowned = lambda: claim
    recovered = tuning.recover()
    state = study.trials[orphan.number].state
    if claim:
        assert recovered == [orphan.number] and state == TrialState.FAIL
        (queued,) = [t for t in study.trials if t.state == TrialState.WAITING]
        assert queued.system_attrs["fixed_params"] == {
            "mem-fraction-static": 0.9,
            "concurrency": 64,
        }
    else:
        assert recovered == [] and state == TrialState.RUNNING


def test_others_alive_sees_only_held_locks(tmp_path: Path) -> None:
    from tuner.study.worklock import others_alive

    mine = lock_path(tmp_path, "a")
    with WorkerLock(mine, "a"):
        assert not others_alive(mine)
        other = lock_path(tmp_path, "b")
        with WorkerLock(other, "b"):
            assert others_alive(mine)
        assert other.exists() and not others_alive(mine)  # a released lock is a dead worker


def test_a_trial_stopped_mid_way_says_so_in_the_status(tmp_path: Path) -> None:
    from tuner.report.rows import trial_rows

    def interrupted(n: int) -> StartResult | None:
        if n == 1:
            raise KeyboardInterrupt  # Ctrl-C during the start
        return None

    cfg, study, server, tuning = setup(tmp_path, server=DownServer(interrupted))
    study.enqueue_trial({"mem-fraction-static": 0.86, "concurrency": 32})
    with pytest.raises(KeyboardInterrupt):
        tuning.optimize(2, None)
    tuning.optimize(2, None)  # the same command again
    rows = {r["trial"]: r for r in trial_rows(cfg, study)}
    assert rows[0]["state"] == "FAIL"
    assert (
        rows[0]["reason"]
        == "stopped before it ended (interrupted or killed); its params ran again as #1"
    )
    assert rows[1]["state"] == "COMPLETE" and rows[1]["params"] == rows[0]["params"]


def test_a_log_that_cannot_be_fetched_costs_the_evidence_not_the_trial(tmp_path: Path) -> None:
    class NoSftp(FakeServer):
        def fetch_log(self, local_path):
            raise HostUnreachable("fetch /tmp/x.log failed: Channel closed")  # no SFTP subsystem

    cfg, study, server, tuning = setup(tmp_path, server=NoSftp())
    tuning.optimize(2, None)
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 2 and TrialState.FAIL not in states


@pytest.mark.parametrize(
    "attrs, resets",
    [
        ({Attr.STATUS: Status.OK}, True),
        ({Attr.STATUS: Status.OK, Attr.DUPLICATE_OF: 0}, False),
        ({Attr.STATUS: Status.REJECTED}, False),
        ({Attr.STATUS: Status.START_FAILED, Attr.REPRODUCED: True}, False),
    ],
)
def test_only_a_trial_that_reached_the_host_ends_a_streak(
    attrs: dict[str, object], resets: bool
) -> None:
    """Mid-outage the sampler may repeat a known config (answered from storage) or the pre-check
    reject one: neither touched the host, so neither proves it is back (a reset would restart
    the outage's tolerance, and the night's bound with it)."""

    class Study:  # what a callback may call: stop (optuna's refuses outside optimize())
        def stop(self) -> None:
            pass

    study, halt = Study(), HaltOnRunaway(limit=3, worker="w")

    def told(state: TrialState, a: dict[str, object]) -> None:
        halt(
            study,
            create_trial(
                state=state,
                user_attrs={Attr.WORKER: "w", **a},
                values=None if state == TrialState.FAIL else [1.0],
            ),
        )

    down = {Attr.INFRA_ERROR: "connection refused"}
    told(TrialState.FAIL, down)
    told(TrialState.FAIL, down)
    told(TrialState.COMPLETE, attrs)
    told(TrialState.FAIL, down)
    assert (halt.halted is None) == resets, halt.halted
