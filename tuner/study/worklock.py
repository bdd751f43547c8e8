"""One live `tuner tune` per study and worker, and the marker its servers carry.

The lock is an `flock` on a file under the study's runs folder, held for the whole run: the
kernel releases it when the process dies, SIGKILL included, so a stale lock cannot exist and a
second run of the same command is refused while the first is alive (it would otherwise take the
first's live trial for a zombie and stop its server).

The marker is derived from (study, worker, the study's runs folder), so it is known before any
server is spawned: every server a worker starts carries it in its environment, and a later run of
the same worker in the same runs folder finds and stops the servers an earlier run lost track of
(killed between spawn and record). The folder is part of it because the lock is: two live runs of
a same-named study and worker from two runs folders (two checkouts, two users) must not take each
other's servers for lost ones.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import StudyBusyError
from tuner.outcome import Attr

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def marker_for(study: str, worker: str, study_dir: Path) -> str:
    """The server marker of this study and worker run from `study_dir` (runs/<study>): stable
    across runs from that folder, unique between workers and between folders."""
    where = str(Path(study_dir).resolve())
    return "tuner-" + hashlib.sha256(f"{study}\0{worker}\0{where}".encode()).hexdigest()[:20]


def home_of(study_dir: Path) -> str:
    """Where a worker runs: this machine and its study's runs folder (the lock's scope)."""
    return f"{socket.gethostname()}:{Path(study_dir).resolve()}"


def alive_elsewhere(
    running: Iterable[FrozenTrial], worker: str, home: str, stale_ids: Collection[int]
) -> FrozenTrial | None:
    """A RUNNING trial of `worker` started from another home (machine or runs folder) whose
    heartbeat is still fresh (not in `stale_ids`): a live run under the same worker name that
    the lock cannot see (a shared storage). Its trials are not this run's zombies to fail."""
    for t in running:
        a = t.user_attrs
        mine = a.get(Attr.HOME) in (None, home)  # None: a trial from before homes were kept
        if a.get(Attr.WORKER) == worker and not mine and t._trial_id not in stale_ids:
            return t
    return None


def stale_trial_ids(study: optuna.Study) -> set[int] | None:
    """Ids of the study's RUNNING trials whose heartbeat went stale (as optuna's own
    fail_stale_trials reads them); None when the storage keeps no heartbeats."""
    from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

    storage = study._storage
    if not isinstance(storage, BaseHeartbeat) or not is_heartbeat_enabled(storage):
        return None
    return set(storage._get_stale_trial_ids(study._study_id))


def refuse_twin(trial: FrozenTrial, worker: str, grace_s: float) -> StudyBusyError:
    """The one line for a worker name already live elsewhere (alive_elsewhere)."""
    return StudyBusyError(
        f"worker '{worker}' is already running this study from {trial.user_attrs[Attr.HOME]} "
        f"(trial {trial.number}, its heartbeat fresh): give this run another --worker name "
        f"(if that run is dead, its trial goes stale within {grace_s:.0f} s)"
    )


def lock_path(study_dir: Path, worker: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", worker)[:80]
    digest = hashlib.sha256(worker.encode()).hexdigest()[:8]
    return study_dir / "locks" / f"{slug}-{digest}.lock"


class WorkerLock:
    """`with WorkerLock(path, what):` holds the lock or raises StudyBusyError naming the holder."""

    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what
        self._fd: int | None = None

    def __enter__(self) -> WorkerLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StudyBusyError(
                f"{self.what} is already running ({holder}); wait for it, stop it, or give "
                "this run another --worker name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def others_alive(path: Path) -> bool:
    """True when another lock file next to `path` is held: a worker of this study is alive."""
    for other in path.parent.glob("*.lock"):
        if other == path:
            continue
        try:
            fd = os.open(other, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the shared lock we may have taken
    return False
