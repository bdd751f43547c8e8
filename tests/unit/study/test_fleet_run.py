"""The fleet's supervisor (tuner/study/fleet.py) with stand-in workers: real subprocesses that
speak the worker's pipe (watch/pipe.py), end with their own codes, take SIGTERM as `tuner tune`
does, and die with their parent (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO
from tuner.study.fleet import FleetRun, WorkerEnd, ended_line, fleet_exit_code
from tuner.watch.events import PhaseChanged, RunStarted


class Recorder:
    """A fleet display that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, Any]] = []

    def progress(self, worker: str, event: Any) -> None:
        self.calls.append(("progress", worker, event))

    def trial(self, worker: str, t: Any) -> None:
        self.calls.append(("trial", worker, t))

    def message(self, worker: str | None, text: str) -> None:
        self.calls.append(("message", worker, text))

    def ended(self, worker: str, text: str) -> None:
        self.calls.append(("ended", worker, text))


def worker_script(code: int, lines: list[dict[str, Any]], err: str = "", wait: bool = False) -> str:
    """A stand-in worker: its pipe's lines, a line on stderr, then exit `code`; `wait`: run
    until SIGTERM, then say `tuner: interrupted` and exit 130 as `tuner tune` does."""
    return textwrap.dedent(
        f"""
        import json, signal, sys, time
        def term(*a):
            print("tuner: interrupted", file=sys.stderr); sys.exit(130)
        signal.signal(signal.SIGTERM, term)
        for record in {lines!r}:
            print(json.dumps(record), flush=True)
        print("not json", flush=True)
        if {err!r}:
            print({err!r}, file=sys.stderr, flush=True)
        end = time.monotonic() + 120  # a lost SIGTERM fails the test; it never hangs it
        while {wait!r} and time.monotonic() < end:
            time.sleep(0.05)
        sys.exit({code})
        """
    )


def test_every_worker_runs_to_its_own_end_and_the_display_hears_each() -> None:
    scripts = {
        "a": worker_script(
            0,
            [
                {"progress": "RunStarted", "study": "s", "n_trials": 4, "timeout_s": None}
                | {"metric": "output_throughput", "confirm_runs": 0},
                {"progress": "PhaseChanged", "number": 1, "phase": "load"},
                {"trial": 1},
            ],
        ),
        "b": worker_script(1, [{"message": "hello"}], err="tuner: stopped: the host is down"),
    }
    display = Recorder()
    fleet = FleetRun(
        ["a", "b"],
        lambda w: [sys.executable, "-c", scripts[w]],
        display,
        read_trial=lambda n: f"trial {n}",
        read_trials=lambda: ("trial 0",),
    )
    ends = fleet.run()
    assert ends == [WorkerEnd("a", 0, ""), WorkerEnd("b", 1, "tuner: stopped: the host is down")]
    assert not fleet.interrupted and fleet_exit_code(ends, fleet.interrupted) == 1
    got = display.calls
    # a resumed study's trials come from the study itself, not the pipe
    assert ("progress", "a", RunStarted("s", 4, None, "output_throughput", 0, ("trial 0",))) in got
    assert ("progress", "a", PhaseChanged(1, "load")) in got
    assert ("trial", "a", "trial 1") in got
    assert ("message", "b", "hello") in got
    assert ("message", "a", "not json") in got  # a stray line is shown, never a crash
    assert ("ended", "a", "ended (exit 0)") in got
    assert ("ended", "b", "stopped (exit 1): tuner: stopped: the host is down") in got


def test_ctrl_c_asks_every_worker_to_stop_and_waits_for_them() -> None:
    display = Recorder()
    fleet = FleetRun(
        ["a", "b"],
        lambda w: [sys.executable, "-c", worker_script(0, [{"message": "up"}], wait=True)],
        display,
        read_trial=lambda n: None,
    )
    up = [c for c in display.calls if c[2] == "up"]

    def press() -> None:  # Ctrl-C once both workers run (the fleet's main thread gets it)
        end = time.monotonic() + 20
        while len(up) < 2 and time.monotonic() < end:
            up[:] = [c for c in display.calls if c[2] == "up"]
            time.sleep(0.02)
        # again each second until the fleet heard it, as a person would: one SIGINT raced the
        # main thread once on a loaded CI machine and the fleet waited on its workers for good
        while not fleet.interrupted and time.monotonic() < end + 20:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)

    # Python's own SIGINT handler (KeyboardInterrupt), as the CLI runs with: a test before this
    # one in the same worker may have left another (CI: every SIGINT went unheard)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=press, daemon=True).start()
        ends = fleet.run()
    finally:
        signal.signal(signal.SIGINT, before)
    assert fleet.interrupted
    assert [e.code for e in ends] == [130, 130]
    assert fleet_exit_code(ends, fleet.interrupted) == 130
    assert ("ended", "a", "interrupted (exit 130): tuner: interrupted") in display.calls


def test_a_worker_dies_with_the_fleet(tmp_path: Path) -> None:
    """kill -9 of the command is one of every worker (the next run resumes each)."""
    pid_file = tmp_path / "worker.pid"
    worker = (
        "import os, sys, time; from tuner.study.fleet import pdeathsig; "
        f"pdeathsig(int(sys.argv[1])); open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "time.sleep(60)"
    )
    fleet = (
        "import os, subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {worker!r}, str(os.getpid())], "
        "start_new_session=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", fleet], env=env, start_new_session=True)
    child = None
    try:
        end = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < end, "the worker did not start"
            time.sleep(0.02)
        child = int(pid_file.read_text())
        parent.kill()
        parent.wait()
        end = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < end, "the worker outlived its fleet"
            time.sleep(0.02)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and _alive(child):  # the test failed: end what it started
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan is reaped by init, eventually)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("codes", "interrupted", "want"),
    [
        ([0, 0], False, 0),
        ([0, 1], False, 1),
        ([2, 2], False, 2),  # every worker refused the same mistake
        ([2, 1], False, 1),
        ([0, -9], False, 1),
        ([130, 0], True, 130),
    ],
)
def test_the_fleets_exit_code(codes: list[int], interrupted: bool, want: int) -> None:
    ends = [WorkerEnd(f"w{i}", c) for i, c in enumerate(codes)]
    assert fleet_exit_code(ends, interrupted) == want


def test_the_line_for_each_end() -> None:
    assert ended_line(WorkerEnd("a", 0, "ignored")) == "ended (exit 0)"
    assert ended_line(WorkerEnd("a", 2, "tuner: error: x")) == "refused (exit 2): tuner: error: x"
    assert ended_line(WorkerEnd("a", -9)) == "killed by signal 9 (exit -9)"


def test_a_worker_that_cannot_start_ends_alone(tmp_path: Path) -> None:
    display = Recorder()
    missing = str(tmp_path / "no-such-python")
    argv = {"a": [sys.executable, "-c", worker_script(0, [])], "b": [missing]}
    fleet = FleetRun(["a", "b"], argv.__getitem__, display, read_trial=lambda n: None)
    ends = fleet.run()
    assert [(e.worker, e.code) for e in ends] == [("a", 0), ("b", 1)]
    assert ends[1].last.startswith("could not start: [Errno 2]")
    assert fleet_exit_code(ends, fleet.interrupted) == 1


def test_a_workers_command_line_is_this_runs_options_for_that_worker(tmp_path: Path) -> None:
    from tuner.cli import build_parser
    from tuner.commands.tune_fleet import worker_argv

    parser = build_parser()
    fleet = parser.parse_args(
        ["tune", "s.yaml", "--storage", "sqlite:////x.db", "--n-trials", "9", "--seed", "3"]
    )
    argv = worker_argv(fleet, tmp_path / "runs", "-odd name")
    assert argv[:3] == [sys.executable, "-m", "tuner"]
    worker = parser.parse_args(argv[3:])  # as the worker's own `tuner` parses it
    assert worker.study_file == str(Path("s.yaml").absolute())
    assert (worker.worker, worker.runs_dir, worker.fleet_of) == (
        "-odd name",
        tmp_path / "runs",
        os.getpid(),
    )
    assert (worker.storage, worker.n_trials, worker.seed, worker.timeout) == (
        "sqlite:////x.db",
        9,
        3,
        None,
    )
