"""storageretry: which errors are an outage, how long one is ridden out, and the writes that
must stay right when a commit's acknowledgement is lost. A fake clock that sleep advances; the
storage cases use a temp SQLite file (the class works on any URL, study/storage.py uses it for servers)."""

from __future__ import annotations

import inspect
import logging
import re
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc as sa
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.trial import TrialState

from tuner.study.rdb import (
    DB_OUTAGE_S,
    RETRIED,
    WAIT_MAX_S,
    Outage,
    ResilientRDBStorage,
    is_connection_error,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def outage(bound: float = DB_OUTAGE_S) -> tuple[Outage, FakeClock]:
    clock = FakeClock()
    return Outage(bound, clock=clock, sleep=clock.sleep), clock


def refused() -> optuna.exceptions.StorageInternalError:
    """What RDBStorage raises when PostgreSQL is down: optuna's error from SQLAlchemy's."""
    orig = Exception('connection to server at "127.0.0.1", port 5432 failed: Connection refused')
    try:
        try:
            raise sa.OperationalError("SELECT 1", {}, orig)
        except sa.OperationalError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised") from e
    except optuna.exceptions.StorageInternalError as exc:
        return exc


def failing(times: int, exc: BaseException, result: object = 42) -> Callable[[], object]:
    calls = {"n": 0}

    def fn() -> object:
        calls["n"] += 1
        if calls["n"] <= times:
            raise exc
        return result

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def test_a_connection_error_is_retried_with_backoff_then_the_call_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    o, clock = outage()
    fn = failing(5, refused())
    with caplog.at_level(logging.WARNING, logger="tuner.study.rdb"):
        assert o.call(fn) == 42
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0]  # doubling from 0.5 s, at most 5 s
    assert o.down_since is None  # answered: the next outage gets its full bound
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # one line when it goes, one when it is back
    assert "unreachable (connection to server" in lines[0] and "120 s" in lines[0]
    assert "answers again after 12 s" in lines[1]


def test_after_the_bound_the_original_exception_is_raised() -> None:
    o, clock = outage(30)
    exc = refused()
    fn = failing(1000, exc)
    with pytest.raises(optuna.exceptions.StorageInternalError) as raised:
        o.call(fn)
    assert raised.value is exc  # not tenacity's RetryError
    assert 30 <= clock.now <= 30 + WAIT_MAX_S
    assert max(clock.sleeps) == WAIT_MAX_S
    # the outage is the storage's: a later call tries once and fails at once
    again = failing(1000, refused())
    with pytest.raises(optuna.exceptions.StorageInternalError):
        o.call(again)
    assert again.calls["n"] == 1  # type: ignore[attr-defined]
    # and a success ends the outage: the next one is ridden out in full
    assert o.call(lambda: "up") == "up"
    assert o.call(failing(3, refused())) == 42


@pytest.mark.parametrize(
    "exc",
    [
        sa.IntegrityError("INSERT", {}, Exception("duplicate key value")),
        optuna.exceptions.UpdateFinishedTrialError("trial 3 is finished"),
        optuna.exceptions.DuplicatedStudyError("exists"),
        KeyError("no study"),
        sa.DataError("INSERT", {}, Exception("value too long")),
        sa.InterfaceError("SELECT", {}, Exception("cursor already closed")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_other_errors_are_never_retried(exc: BaseException) -> None:
    o, clock = outage()
    fn = failing(1, exc)
    with pytest.raises(type(exc)):
        o.call(fn)
    assert fn.calls["n"] == 1 and clock.sleeps == []  # type: ignore[attr-defined]


def test_which_errors_are_a_lost_connection() -> None:
    assert is_connection_error(refused())
    assert is_connection_error(sa.OperationalError("SELECT", {}, Exception("server closed")))
    dropped = sa.InterfaceError("SELECT", {}, Exception("connection already closed"))
    dropped.connection_invalidated = True  # SQLAlchemy's dialect judged it a disconnect
    assert is_connection_error(dropped)
    try:
        raise optuna.exceptions.StorageInternalError("commit") from sa.IntegrityError(
            "INSERT", {}, Exception("dup")
        )
    except optuna.exceptions.StorageInternalError as wrapped:
        assert not is_connection_error(wrapped)
    assert not is_connection_error(ConnectionRefusedError())  # not the storage's


def test_a_call_with_its_own_cap_gives_up_sooner() -> None:
    o, clock = outage(120)
    with pytest.raises(optuna.exceptions.StorageInternalError):
        o.call(failing(1000, refused()), cap=10)
    assert 10 <= clock.now <= 10 + WAIT_MAX_S
    assert o.down_since == 0.0  # the outage goes on for the others' calls


def test_nested_calls_are_retried_once_by_the_outermost() -> None:
    o, clock = outage(20)
    inner = failing(1000, refused())
    with pytest.raises(optuna.exceptions.StorageInternalError):
        o.call(lambda: o.call(inner))
    assert clock.now <= 20 + WAIT_MAX_S  # not 20 s per level


def test_every_database_method_optuna_calls_is_covered() -> None:
    # _CachedStorage, which create_study wraps around every RDBStorage, calls these on it
    called = set(re.findall(r"self\._backend\.(\w+)\(", inspect.getsource(_CachedStorage)))
    own = {"set_trial_state_values", "record_heartbeat"}  # wrapped by hand
    no_db = {"get_heartbeat_interval", "get_heartbeat_stale_trial_callback"}
    assert called - set(RETRIED) - own - no_db == set()
    for name in [*RETRIED, *own, "_get_prepared_new_trial"]:
        assert callable(getattr(RDBStorage, name)), name
        assert getattr(ResilientRDBStorage, name) is not getattr(RDBStorage, name), name


def storage(tmp_path: Path, bound: float = 30) -> tuple[ResilientRDBStorage, FakeClock]:
    o, clock = outage(bound)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        s = ResilientRDBStorage(
            f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=5, grace_period=20, outage=o
        )
    return s, clock


def test_a_new_trial_has_its_heartbeat_row_so_an_orphan_becomes_stale(tmp_path: Path) -> None:
    s, _ = storage(tmp_path)
    study = optuna.create_study(storage=s, study_name="s")
    trial_id = s.create_new_trial(study._study_id)
    with sqlite3.connect(tmp_path / "study.db") as db:
        rows = db.execute("SELECT trial_id FROM trial_heartbeats").fetchall()
    assert rows == [(trial_id,)]
    s.record_heartbeat(trial_id)  # the heartbeat thread's first beat updates that row
    enqueued = s.create_new_trial(
        study._study_id, optuna.trial.create_trial(state=TrialState.WAITING)
    )
    with sqlite3.connect(tmp_path / "study.db") as db:
        beats = {r[0] for r in db.execute("SELECT trial_id FROM trial_heartbeats")}
    assert enqueued not in beats  # a WAITING trial is nobody's yet


def test_a_finish_whose_acknowledgement_was_lost_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, clock = storage(tmp_path)
    study = optuna.create_study(storage=s, study_name="s")
    trial_id = s.create_new_trial(study._study_id)
    original = RDBStorage.set_trial_state_values
    lost = {"n": 0}

    def commit_then_drop(self: RDBStorage, *args: object, **kw: object) -> bool:
        done = original(self, *args, **kw)  # type: ignore[arg-type]
        lost["n"] += 1
        if lost["n"] == 1:
            raise refused()  # committed, but the connection dropped before the answer
        return done

    monkeypatch.setattr(RDBStorage, "set_trial_state_values", commit_then_drop)
    assert s.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.5]) is True
    assert s.get_trial(trial_id).state == TrialState.COMPLETE and clock.sleeps == [0.5]
    # a trial someone else finished differently is still optuna's error
    other = s.create_new_trial(study._study_id)
    lost["n"] = 0
    original(s, other, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        s.set_trial_state_values(other, TrialState.COMPLETE, [2.0])


def test_a_heartbeat_that_cannot_be_written_is_skipped_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s, clock = storage(tmp_path, bound=DB_OUTAGE_S)
    study = optuna.create_study(storage=s, study_name="s")
    trial_id = s.create_new_trial(study._study_id)

    def down(self: RDBStorage, trial_id: int) -> None:
        raise refused()

    monkeypatch.setattr(RDBStorage, "record_heartbeat", down)
    s.record_heartbeat(trial_id)  # no exception: the thread keeps beating
    assert 5 <= clock.now <= 5 + WAIT_MAX_S  # one heartbeat interval, not the outage bound
    assert "Traceback" not in capsys.readouterr().err


def test_no_trial_is_failed_as_stale_while_heartbeats_were_lost_to_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another worker's live trial: its beats were lost in the outage like everyone's, and it
    # beats again within a heartbeat interval of the database's return
    s, clock = storage(tmp_path)  # heartbeat 5 s, grace 20 s
    study = optuna.create_study(storage=s, study_name="s")
    trial_id = s.create_new_trial(study._study_id)
    monkeypatch.setattr(RDBStorage, "_get_stale_trial_ids", lambda self, sid: [trial_id])
    assert s._get_stale_trial_ids(study._study_id) == [trial_id]  # no outage seen: as optuna's
    s._outage.failed(refused())
    assert s._get_stale_trial_ids(study._study_id) == []  # down now
    clock.now += 100
    s._outage.answered()
    clock.now += 19
    assert s._get_stale_trial_ids(study._study_id) == []  # back 19 s ago, within the grace
    clock.now += 1
    assert s._get_stale_trial_ids(study._study_id) == [trial_id]  # a grace period later: stale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # optuna's own check goes through it
    assert s.get_trial(trial_id).state == TrialState.FAIL
