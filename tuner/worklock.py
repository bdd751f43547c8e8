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
from pathlib import Path

from tuner.errors import StudyBusyError


def marker_for(study: str, worker: str, study_dir: Path) -> str:
    """The server marker of this study and worker run from `study_dir` (runs/<study>): stable
    across runs from that folder, unique between workers and between folders."""
    where = str(Path(study_dir).resolve())
    return "tuner-" + hashlib.sha256(f"{study}\0{worker}\0{where}".encode()).hexdigest()[:20]


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
