"""Run `tuner sim` as a real subprocess for tests (import this module from your tests).

    from tests.helpers.simproc import SimProc, sim_server

    with sim_server("--sim-profile", "llama-3.1-8b-h100") as sim:   # waits for /health 200
        requests go to sim.url; sim.log() is everything it printed so far

    proc = SimProc.start([...flags...])   # no waiting; proc.wait(timeout) -> exit code
    try: ... finally: proc.kill()

Each simulator runs in its own process group (start_new_session=True) and is ended by
`os.killpg` on that group only, in `finally`, even when the test fails. Output goes to a temp
file (not a pipe) so a chatty server can never block on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.helpers.net import free_port
from tests.helpers.orphans import DIE_WITH_PARENT

#: default start-up time for tests: long enough to see /health 503, short enough to be cheap
FAST_STARTUP = "0.3"


class SimProc:
    """One `python -m tuner.sim` subprocess in its own process group."""

    def __init__(
        self,
        popen: subprocess.Popen,
        port: int,
        log_path: Path,
        tmpdir: tempfile.TemporaryDirectory,
    ):
        self.popen = popen
        self.port = port
        self.log_path = log_path
        self._tmpdir = tmpdir

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, flags: Sequence[str], port: int | None = None, add_defaults: bool = True
    ) -> SimProc:
        """Start the simulator with `flags` (plus --model-path/--port/fast start-up unless given)."""
        port = port or free_port()
        args = list(flags)
        if add_defaults:
            if not any(a in ("--model-path", "--model") for a in args) and "--config" not in args:
                args = ["--model-path", "sim/model", *args]
            if "--port" not in args:
                args += ["--port", str(port)]
            if "--sim-startup-seconds" not in args:
                args += ["--sim-startup-seconds", FAST_STARTUP]
        tmpdir = tempfile.TemporaryDirectory(prefix="simproc-")
        log_path = Path(tmpdir.name) / "sim.log"
        with open(log_path, "wb") as out:
            popen = subprocess.Popen(
                [*DIE_WITH_PARENT, sys.executable, "-m", "tuner.sim", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return cls(popen, port, log_path, tmpdir)

    def log(self) -> str:
        """Everything the server printed so far (stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def health(self, path: str = "/health", timeout: float = 10.0) -> int | None:
        """HTTP status of a GET, or None when nothing answers within `timeout` (generous: a
        busy machine can keep a live server from answering for a second or two)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Poll /health until 200; raise with the log if it exits or the deadline passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"sim exited with {self.popen.returncode}:\n{self.log()}")
            if self.health() == 200:
                return
            time.sleep(0.05)
        raise TimeoutError(f"sim not ready after {timeout} s:\n{self.log()}")

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the process to exit; its exit code."""
        return self.popen.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        """Send a signal to the server's process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group (only ours) and reap it; safe to call twice."""
        if self.popen.poll() is None:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        self._tmpdir.cleanup()


@contextlib.contextmanager
def sim_server(*flags: str, ready_timeout: float = 30.0) -> Iterator[SimProc]:
    """A ready simulator for the duration of the block; always killed afterwards."""
    proc = SimProc.start(flags)
    try:
        proc.wait_ready(ready_timeout)
        yield proc
    finally:
        proc.kill()
