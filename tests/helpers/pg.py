"""A test-owned PostgreSQL server on 127.0.0.1 (Debian's postgresql), for shared-study tests.

The cluster lives in a temp dir owned by the `postgres` user (initdb refuses root), listens on a
free port, and is stopped by its process group at the end of the session, or by the kernel's
parent-death signal when pytest is killed first.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.net import free_port


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else None


def require_postgres() -> tuple[str, str]:
    initdb, server = _bin("initdb"), _bin("postgres")
    ok = initdb and server and os.geteuid() == 0 and shutil.which("runuser")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        ok = False
    if not ok:
        msg = "PostgreSQL tests need Debian's postgresql, psycopg2 and root (.ci/run installs them)"
        if os.environ.get("CI"):
            pytest.fail(msg)  # in CI these tests must run, never skip
        pytest.skip(msg)
    return initdb, server  # type: ignore[return-value]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of an empty database `tuner` on a fresh cluster."""
    initdb, server = require_postgres()
    with cluster(initdb, server) as (url, _):
        yield url


@contextlib.contextmanager
def cluster(initdb: str, server: str) -> Iterator[tuple[str, int]]:
    """(URL of an empty database `tuner`, the postmaster's pid) on a fresh cluster."""
    # not under pytest's temp root: it is mode 0700 and the postgres user could not enter it
    root = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    data = root / "data"
    data.mkdir()
    shutil.chown(root, "postgres")
    shutil.chown(data, "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    initdb_argv = [*as_postgres, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"]
    subprocess.run(initdb_argv, check=True, capture_output=True)
    port = free_port()
    log = root / "postgres.log"
    server_argv = [*_as_postgres_dying_with_us(), server, "-D", str(data), "-p", str(port)]
    server_argv += ["-k", str(root)]
    server_argv += ["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            server_argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_ready(port, proc, log)
        createdb = _bin("createdb") or "createdb"
        createdb_argv = [createdb, "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "tuner"]
        subprocess.run(createdb_argv, check=True, capture_output=True)
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/tuner", proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # fast shutdown
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        shutil.rmtree(root, ignore_errors=True)


def _as_postgres_dying_with_us() -> list[str]:
    """Run as `postgres`, and shut down fast (SIGINT) when this process dies, even by SIGKILL
    (the fixture's `finally` never runs then): setpriv sets the parent-death signal after the
    user change, which would clear it. runuser where setpriv is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ["runuser", "-u", "postgres", "--"]
    ids = ["--reuid=postgres", "--regid=postgres", "--init-groups"]
    return [setpriv, *ids, "--pdeathsig", "INT", "--"]


def _wait_ready(port: int, proc: subprocess.Popen, log: Path, deadline_s: float = 30.0) -> None:
    isready = _bin("pg_isready") or "pg_isready"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited: {log.read_text()[-2000:]}")
        if (
            subprocess.run(
                [isready, "-h", "127.0.0.1", "-p", str(port)], capture_output=True
            ).returncode
            == 0
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"postgres not ready after {deadline_s} s: {log.read_text()[-2000:]}")
