"""A fleet's workers: one `tuner tune STUDY --worker NAME` process each, watched together.

One process per worker, not a thread: each worker is then exactly the run a user starts with
`--worker NAME` (its lock, its marker, its zombies and lost servers, its SIGALRM trial watchdog,
which only a main thread receives), its load client has an interpreter of its own (one GIL for
several clients would make each measure the others' lag), and a worker that hangs or dies is its
own failure, never the others'.

Each worker starts in a session of its own, so a Ctrl-C at the terminal reaches only the fleet,
which asks every live worker to stop (SIGTERM: its trial fails cleanly and its server stops, as
one `tuner tune` does on Ctrl-C) and waits for them. A worker dies with the fleet
(PR_SET_PDEATHSIG, set by the worker: `pdeathsig`): a kill -9 of the command is one of every
worker, which the next run resumes as any killed worker is resumed.

A worker writes its events as JSON lines on its stdout (watch/pipe.py) and its own one line,
when it stops, on its stderr; the fleet hands both to its display, prefixed with the worker.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import IO, Any

from tuner.watch.events import RunStarted
from tuner.watch.pipe import decode

#: how often the fleet looks at its workers when none has anything to say (seconds)
POLL_S = 0.25
#: Linux's prctl option: the signal a process receives when its parent dies
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerEnd:
    """How one worker ended: its exit code and its last line on stderr (its one line)."""

    worker: str
    code: int
    last: str = ""


def pdeathsig(parent: int) -> None:
    """Die (SIGKILL) when `parent` does, as a worker of the fleet run by process `parent`;
    exit at once when it is already gone. Linux only; elsewhere nothing is set."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the fleet died before the signal was asked for
        os._exit(1)


class FleetRun:
    """Starts the workers, feeds the display, stops them on Ctrl-C, returns how each ended.

    `argv_for(worker)` is a worker's command line; `read_trial(number)` a finished trial from
    the study (None if it cannot be read now), `read_trials()` all of them; `display` takes the
    fleet display's calls."""

    def __init__(
        self,
        workers: Sequence[str],
        argv_for: Callable[[str], list[str]],
        display: Any,
        read_trial: Callable[[int], Any],
        env: Mapping[str, str] | None = None,
        read_trials: Callable[[], tuple[Any, ...]] | None = None,
    ):
        self.workers = list(workers)
        self.argv_for = argv_for
        self.display = display
        self.read_trial = read_trial
        #: the study's trials now: a worker's RunStarted carries them (its pipe leaves them out)
        self.read_trials = read_trials
        self.env = dict(env) if env is not None else None
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.interrupted = False
        self._events: queue.Queue[tuple[str, str, Any]] = queue.Queue()

    def run(self) -> list[WorkerEnd]:
        """Run every worker to its end; a Ctrl-C (KeyboardInterrupt) stops them all cleanly."""
        ends: dict[str, WorkerEnd] = {}
        try:
            for worker in self.workers:
                if (failed := self._spawn(worker)) is not None:
                    ends[worker] = failed
                    self.display.ended(worker, ended_line(failed))
        except KeyboardInterrupt:  # before every worker started: the rest never do
            self.interrupted = True
            self.stop()
        open_streams = dict.fromkeys(self.procs, 2)
        last: dict[str, str] = {}
        while any(w not in ends for w in self.procs):
            try:
                self._pump(open_streams, last, ends)
            except KeyboardInterrupt:
                self.interrupted = True
                self.stop()
        return [ends.get(w) or WorkerEnd(w, 130, "not started: interrupted") for w in self.workers]

    def stop(self) -> None:
        """Ask every live worker to stop (SIGTERM: its trial and server end cleanly)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    proc.send_signal(signal.SIGTERM)

    def _spawn(self, worker: str) -> WorkerEnd | None:
        """Start `worker` (from this, the main thread: a worker's parent-death signal follows
        the thread that started it); its end when it could not start, else None."""
        try:
            proc = subprocess.Popen(
                self.argv_for(worker),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=self.env,
                start_new_session=True,  # the terminal's Ctrl-C is the fleet's to pass on
            )
        except OSError as exc:  # no processes or files left: this worker's failure alone
            return WorkerEnd(worker, 1, f"could not start: {exc}")
        self.procs[worker] = proc
        assert proc.stdout is not None and proc.stderr is not None
        for kind, stream in (("out", proc.stdout), ("err", proc.stderr)):
            threading.Thread(target=self._read, args=(worker, kind, stream), daemon=True).start()
        return None

    def _read(self, worker: str, kind: str, stream: IO[str]) -> None:
        for line in stream:
            self._events.put((worker, kind, line.rstrip("\n")))
        self._events.put((worker, "eof", kind))

    def _pump(
        self, open_streams: dict[str, int], last: dict[str, str], ends: dict[str, WorkerEnd]
    ) -> None:
        try:
            worker, kind, payload = self._events.get(timeout=POLL_S)
        except queue.Empty:
            return
        if kind == "eof":
            open_streams[worker] -= 1
            if open_streams[worker] == 0:  # both pipes closed: the worker is ending
                proc = self.procs[worker]
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                code = proc.wait()
                ends[worker] = WorkerEnd(worker, code, last.get(worker, ""))
                self.display.ended(worker, ended_line(ends[worker]))
            return
        if kind == "err":
            if payload.strip():
                last[worker] = payload.strip()
                self.display.message(worker, payload)
            return
        event = decode(payload)
        if event is None:
            if payload.strip():
                self.display.message(worker, payload)
        elif event[0] == "trial":
            trial = self.read_trial(event[1])
            if trial is not None:
                self.display.trial(worker, trial)
        elif event[0] == "message":
            self.display.message(worker, event[1])
        elif isinstance(event[1], RunStarted) and self.read_trials is not None:
            self.display.progress(worker, replace(event[1], trials=self.read_trials()))
        else:
            self.display.progress(worker, event[1])


def ended_line(end: WorkerEnd) -> str:
    """`ended (exit 0)`, `interrupted (exit 130)`, `stopped (exit 1): tuner: stopped: ...`."""
    how = {0: "ended", 130: "interrupted", 2: "refused"}.get(end.code, "stopped")
    if end.code < 0:
        how = f"killed by signal {-end.code}"
    tail = f": {end.last}" if end.code != 0 and end.last else ""
    return f"{how} (exit {end.code}){tail}"


def fleet_exit_code(ends: Sequence[WorkerEnd], interrupted: bool) -> int:
    """130 when interrupted; 0 when every worker ended well; the workers' code when they all
    share one (2: every worker refused the same mistake); else 1 (some worker halted)."""
    if interrupted:
        return 130
    codes = {e.code for e in ends}
    if codes == {0}:
        return 0
    if len(codes) == 1 and next(iter(codes)) > 0:
        return next(iter(codes))
    return 1
