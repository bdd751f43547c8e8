"""A test's servers end with the test process, even when that process is SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.orphans import DIE_WITH_PARENT
from tests.helpers.paths import REPO

SPAWN = (
    "import sys, time\n"
    "from tests.helpers.simproc import SimProc\n"
    "p = SimProc.start(['--sim-profile', 'llama-3.1-8b-h100'])\n"
    "p.wait_ready()\n"
    "print(p.popen.pid, flush=True)\n"
    "time.sleep(120)\n"
)


# Ready first: a parent that dies before setpriv's prctl() ran sends no signal (the kernel only
# signals children that asked while their parent lived); a test process is never that quick.


class _Scratch:
    """A TMPDIR for the killed parent: its `finally` never runs, so the test removes what its
    helpers made there (the simulator's log dir, the cluster's data dir)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tuner-orphans-"))
        self.dir.chmod(0o755)  # the postgres user enters its cluster's dir below it
        self.env = {**os.environ, "TMPDIR": str(self.dir)}

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not DIE_WITH_PARENT, reason="util-linux setpriv is not installed")
def test_simulator_ends_when_the_test_process_is_killed() -> None:
    tmp = _Scratch()
    parent = subprocess.Popen(
        [sys.executable, "-c", SPAWN], cwd=REPO, stdout=subprocess.PIPE, text=True, env=tmp.env
    )
    sim = 0
    try:
        assert parent.stdout is not None
        sim = int(parent.stdout.readline())
        assert _alive(sim)
        parent.kill()  # SIGKILL: no finally, no fixture teardown runs in it
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(sim) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(sim), "the simulator outlived the process that started it"
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
        if sim and _alive(sim):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sim, signal.SIGKILL)  # its own group (start_new_session)
        tmp.remove()


PG_SPAWN = (
    "import sys, time\n"
    "from tests.helpers.pg import cluster\n"
    "with cluster(sys.argv[1], sys.argv[2]) as (url, pid):\n"
    "    print(pid, flush=True)\n"
    "    time.sleep(120)\n"
)


@pytest.mark.skipif(not DIE_WITH_PARENT, reason="util-linux setpriv is not installed")
def test_postgres_ends_when_the_test_process_is_killed() -> None:
    from tests.helpers.pg import require_postgres

    initdb, server = require_postgres()
    tmp = _Scratch()
    parent = subprocess.Popen(
        [sys.executable, "-c", PG_SPAWN, initdb, server],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env=tmp.env,
    )
    pg = 0
    try:
        assert parent.stdout is not None
        pg = int(parent.stdout.readline())
        assert _alive(pg)
        parent.kill()  # SIGKILL: the cluster's `finally` never runs
        parent.wait(10)
        deadline = time.monotonic() + 30
        while _alive(pg) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pg), "PostgreSQL outlived the process that started it"
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
        if pg and _alive(pg):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pg, signal.SIGKILL)  # its own group (start_new_session)
        tmp.remove()
