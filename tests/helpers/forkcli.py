"""`python -m tuner` runs as forks of one interpreter that has imported tuner's command line once.

A corpus of a hundred CLI runs (tests/integration/test_bad_inputs.py) would otherwise pay, per
case, an interpreter's start and the imports of tuner's commands (optuna, numpy, pydantic,
sqlalchemy, paramiko, aiohttp: 1-2 s of CPU for a `tune` case). Each case is still a process of its own: forked by this server, in its own
session and working directory, with its own environment, stdin and stdout on /dev/null and
stderr in a file, it runs tuner's `__main__` as `python -m tuner` does (runpy, `sys.argv`,
`sys.path[0]` its working directory) and ends through the interpreter's own exit: the exit
code, atexit handlers, `Exception ignored ...` lines, an uncaught exception's traceback, a
thread that never ends (the case times out) are all as a fresh `python -m tuner` would show them.
What it cannot show is the interpreter's start and tuner's imports themselves: a test using it
keeps a few fresh `python -m tuner` runs beside (test_bad_inputs.py: one per subcommand).

`ForkCLI` starts the server (`python -m tests.helpers.forkcli`) and runs cases one at a time;
use one per thread. The protocol is one JSON line each way per case.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path


class ForkCLI:
    """A fork server, ready once constructed; `run` one case at a time; `close` it."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.forkcli"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # the server and every case it forks: one group to end
        )

    def run(
        self,
        args: list[str],
        cwd: Path,
        env: Mapping[str, str],
        stderr: Path,
        timeout_s: float,
        memory_limit: int,
    ) -> int | None:
        """`python -m tuner *args` in `cwd`; its exit code (None: killed after `timeout_s`)."""
        req = {
            "args": args,
            "cwd": str(cwd),
            "env": dict(env),
            "stderr": str(stderr),
            "timeout_s": timeout_s,
            "memory_limit": memory_limit,
        }
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit {self.proc.wait()})")
        return json.loads(line)["code"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ------------------------------------------------------------------------------------------
# the server side: `python -m tests.helpers.forkcli`


def _child(req: dict) -> None:
    """In the forked child: become the case's `python -m tuner` process, then run it. Never
    returns: SystemExit (or any exception) unwinds to the interpreter's own exit."""
    os.setsid()
    os.chdir(req["cwd"])
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err, 2)
    os.close(null)
    os.close(err)
    os.environ.clear()
    os.environ.update(req["env"])
    limit = req["memory_limit"]
    # reading /dev/zero whole must fail the case, not swap the shared machine
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up
    sys.argv = ["tuner", *req["args"]]  # runpy sets argv[0] to tuner/__main__.py, as -m does
    sys.path[0] = req["cwd"]  # `python -m` puts the working directory first
    import runpy

    runpy.run_module("tuner", run_name="__main__", alter_sys=True)
    raise SystemExit(0)  # __main__ ended without exiting: as the interpreter would, exit 0


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's exit code, or None once it outlived `timeout_s` (its group is killed)."""
    end = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= end:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


#: the modules tuner's subcommands import once they run (cli.py keeps them out of `--help`):
#: imported once here, so a case pays only its own work; what a case runs is not changed
WARM = (
    "tuner.api",
    "tuner.capacity.analysis",
    "tuner.capacity.models",
    "tuner.capacity.tables",
    "tuner.check.plan",
    "tuner.config.validate",
    "tuner.loadgen.plan",
    "tuner.loadgen.run",
    "tuner.loadgen.workload",
    "tuner.report.export",
    "tuner.report.rows",
    "tuner.report.summary",
    "tuner.study.storage",
    "tuner.verdict.winner",
    "tuner.watch.live",
    "tuner.watch.notify",
)


def _serve() -> None:
    import importlib

    from tuner.cli import build_parser

    build_parser()  # imports every subcommand's module, as each `tuner ...` does
    for name in WARM:
        importlib.import_module(name)
    import threading

    # a fork copies only the forking thread: a thread started by an import would be missing
    # (and could hold a lock) in every case
    assert threading.active_count() == 1, threading.enumerate()

    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        code = _wait(pid, req["timeout_s"])
        sys.stdout.write(json.dumps({"code": code}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
