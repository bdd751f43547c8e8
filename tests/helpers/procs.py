"""Find processes by the marker tuner puts in its servers' environment, independently of tuner.

Tests use it to count orphans and to clean up what a killed tuner left behind (by process
group id, only groups whose processes carry the test's own marker)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

MARKER_VAR = "TUNER_SERVER_MARKER"


def marked_groups(marker: str) -> dict[int, str]:
    """pgid -> command line of every live process carrying MARKER_VAR=marker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(fields[2])] = cmd.strip()
    return found


def kill_marked(marker: str, wait_s: float = 10.0) -> list[int]:
    """SIGKILL every group carrying the marker; return the pgids that were alive."""
    groups = list(marked_groups(marker))
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while marked_groups(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return groups


def health(url: str) -> int | None:
    """GET url/health's status, None without an answer; callers expect 200 from a live server,
    and a busy machine may take seconds to answer."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return r.status
    except OSError:
        return None


def gone(pids: list[int]) -> bool:
    """Every one of `pids` has exited (a zombie counts as gone)."""
    return not [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) != "Z"]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@contextlib.contextmanager
def own_marker(what: str) -> Iterator[str]:
    """A fresh marker for one test; afterwards every group still carrying it is killed, and
    the test fails naming `what` if there was any (the tuner should have stopped them)."""
    m = "tuner-test-" + secrets.token_hex(8)
    yield m
    left = kill_marked(m)
    assert not left, f"{what} left running with the test's marker: {left}"
