"""An RDBStorage that rides out a database outage (a PostgreSQL restart, a failover).

A storage call that fails on a lost or refused connection is tried again (0.5 s doubling to
5 s) until the database has been unreachable for `outage_s`; then the last error is raised as
it was, and study/storage_failure.py makes it the run's one line. Other errors are never retried. The
outage clock is the storage's, not each call's: past the bound every call tries once, so a run
whose cleanup makes several storage calls still ends after about `outage_s`, not a multiple.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import TrialState
from tenacity import Retrying, retry_if_exception, wait_exponential

log = logging.getLogger(__name__)
T = TypeVar("T")
_inside = threading.local()  # a retried call's nested storage calls are not retried again
_LOCK = threading.Lock()  # the outage clocks' (a module's, so a storage stays picklable)

#: how long the study's database may stay unreachable before the run gives up (seconds)
DB_OUTAGE_S = 120.0
WAIT_FIRST_S, WAIT_MAX_S = 0.5, 5.0

#: the storage API (BaseStorage's public methods) less what needs no database or is wrapped
#: below, and the private methods optuna's _CachedStorage calls on an RDBStorage (create_study
#: wraps every RDBStorage in one); tests/unit/study/test_rdb.py checks them against optuna
NOT_RETRIED = {"remove_session", "check_trial_is_updatable", "set_trial_state_values"}
PRIVATE = "_create_new_trial _set_trial_param _get_trials _get_best_trial_id _get_stale_trial_ids"
RETRIED = [*sorted({n for n in vars(BaseStorage) if n[0] != "_"} - NOT_RETRIED), *PRIVATE.split()]


def is_connection_error(exc: BaseException) -> bool:
    """A lost or refused connection: SQLAlchemy's OperationalError, or a DBAPI error it
    judged a disconnect (psycopg2's InterfaceError "connection already closed"), raised as it
    is or wrapped by optuna as StorageInternalError. An IntegrityError never is."""
    import sqlalchemy.exc as sa

    if not isinstance(exc, (sa.SQLAlchemyError, optuna.exceptions.StorageInternalError)):
        return False  # optuna's own errors and ours are answers, not outages
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, sa.IntegrityError):
            return False
        if isinstance(e, (sa.OperationalError, sa.DisconnectionError)):
            return True
        if isinstance(e, sa.DBAPIError) and e.connection_invalidated:
            return True
        e = e.__cause__ or e.__context__
    return False


class Outage:
    """Since when the database is unreachable (one per storage, its threads share it), and
    `call`, which retries through it; `clock` and `sleep` are the seams of unit tests."""

    def __init__(
        self,
        outage_s: float = DB_OUTAGE_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.outage_s, self.clock, self.sleep = outage_s, clock, sleep
        self.down_since: float | None = None
        self.back_at: float | None = None  # when it last answered again after an outage

    def failed(self, exc: BaseException) -> None:
        with _LOCK:
            if self.down_since is None:
                self.down_since = self.clock()
                e = exc.__cause__ or exc  # optuna's error wraps SQLAlchemy's, which the driver's
                why = str(getattr(e, "orig", None) or e).strip() or type(e).__name__
                log.warning(
                    "the study's database is unreachable (%s); retrying for up to %.0f s",
                    *(why.splitlines()[0], self.outage_s),
                )

    def answered(self) -> None:
        with _LOCK:
            if self.down_since is not None:
                gone = self.clock() - self.down_since
                log.warning("the study's database answers again after %.0f s", gone)
                self.down_since, self.back_at = None, self.clock()

    def lately(self, within: float) -> bool:
        """The database is unreachable now, or answered again less than `within` s ago."""
        with _LOCK:
            if self.down_since is not None:
                return True
            return self.back_at is not None and self.clock() - self.back_at < within

    def over(self, since: float, cap: float | None) -> bool:
        """The outage outlasted the bound, or this call its own cap (the heartbeat's)."""
        now = self.clock()
        down = self.down_since if self.down_since is not None else now
        return now - down >= self.outage_s or (cap is not None and now - since >= cap)

    def call(self, fn: Callable[[], T], cap: float | None = None) -> T:
        """fn(), again after each connection-level failure until the outage is over bound."""
        if getattr(_inside, "active", False):
            return fn()  # the outer call retries the whole of it
        since = self.clock()
        retrying = Retrying(
            retry=retry_if_exception(is_connection_error),
            wait=wait_exponential(multiplier=WAIT_FIRST_S, min=WAIT_FIRST_S, max=WAIT_MAX_S),
            after=lambda rs: self.failed(rs.outcome.exception()),  # type: ignore[union-attr]
            stop=lambda _: self.over(since, cap),
            sleep=self.sleep,
            reraise=True,  # the original error, for study/storage_failure.py's one line
        )
        _inside.active = True
        try:
            result = retrying(fn)
        except Exception as exc:
            if not is_connection_error(exc):
                self.answered()  # optuna's own error (KeyError, ...): the database answered
            raise
        finally:
            _inside.active = False
        self.answered()
        return result


class ResilientRDBStorage(RDBStorage):
    """RDBStorage whose database calls ride out a lost connection (`outage`'s bound)."""

    def __init__(self, url: str, *args: Any, outage: Outage | None = None, **kw: Any) -> None:
        self._outage = outage or Outage()
        super().__init__(url, *args, **kw)

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        """As RDBStorage's, made safe to repeat after a commit whose acknowledgement was lost."""
        tries = 0

        def once() -> bool:
            nonlocal tries
            tries += 1
            try:
                done = RDBStorage.set_trial_state_values(self, trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                # on a retry: did our earlier try commit, the drop losing its acknowledgement?
                t = RDBStorage.get_trial(self, trial_id) if tries > 1 else None
                if t and t.state == state and (values is None or t.values == list(values)):
                    return True
                raise
            if not done and tries > 1 and state == TrialState.RUNNING and self.heartbeat_interval:
                # a pop of a WAITING trial that may have been ours before the drop: a beat
                # makes it stale after the grace period (FAIL, re-queued) if nobody runs it
                RDBStorage.record_heartbeat(self, trial_id)
            return done

        return self._outage.call(once)

    def record_heartbeat(self, trial_id: int) -> None:
        """A beat that cannot be written is skipped, quietly (optuna's heartbeat thread would
        print a traceback and die, and a trial that outlives the outage needs its beats). It
        retries one heartbeat interval at most, so the join at a trial's end waits no longer.
        Other workers hold off failing it after an outage (`_get_stale_trial_ids`)."""
        try:
            self._outage.call(
                partial(RDBStorage.record_heartbeat, self, trial_id), self.heartbeat_interval
            )
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            log.debug("heartbeat of trial %d skipped: %s", trial_id, exc)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """Trials whose heartbeats stopped, as RDBStorage's; none while the database is away
        or for a grace period after it answers again: every worker's beats were lost alike, and
        a live trial elsewhere would be failed (and run twice) before its worker beats again.
        A dead worker's trial is failed one grace period later than it would have been."""
        grace = self.grace_period or 2 * (self.heartbeat_interval or 0)  # optuna's default
        if self._outage.lately(float(grace)):
            return []
        return self._outage.call(lambda: RDBStorage._get_stale_trial_ids(self, study_id))

    def _get_prepared_new_trial(self, study_id: int, template_trial: Any, session: Any) -> Any:
        """A new RUNNING trial gets its heartbeat row in its own transaction: create_new_trial
        retried after a commit whose acknowledgement the drop lost makes a second trial, and
        the first runs nowhere. optuna's stale check skips a trial with no heartbeat row (it
        would stay RUNNING forever); with one, it fails after the grace period and is re-queued
        like a killed worker's. (An enqueued trial made twice runs twice: study/loop.py dedupes.)"""
        trial = super()._get_prepared_new_trial(study_id, template_trial, session)
        if self.heartbeat_interval and template_trial is None:
            from optuna.storages._rdb import models

            session.add(models.TrialHeartbeatModel(trial_id=trial.trial_id))
        return trial


def _retrying_method(name: str) -> Callable[..., Any]:
    base = getattr(RDBStorage, name)

    def method(self: ResilientRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return self._outage.call(lambda: base(self, *args, **kwargs))

    method.__name__, method.__doc__ = name, base.__doc__
    return method


for _name in RETRIED:
    if _name not in vars(ResilientRDBStorage):  # those written by hand retry on their own
        setattr(ResilientRDBStorage, _name, _retrying_method(_name))
