"""Fault injection for the simulator: what fires when, on one launch (`Faults`), and the launch
counter (`--sim-fault-state PATH`). The `--sim-fault SPEC` syntax is sim/faultspec.py's.

These are the *world's* failures, never the configuration's: no fault prints a line that
tuner.sglang.failures reads as SGLang's own evidence (OOM, host memory, argparse, bind error).
Each firing is logged as `[sim-fault] KIND fired ...` so a test can see it.

Seeding: fault number i (in command-line order) on launch L draws from its own generator seeded
with (--sim-seed, L, i, kind); the first draw decides whether it is armed (draw < p), later draws
decide per request. L is 0, or with `--sim-fault-state PATH` the counter in PATH, which every
launch reads and increments under an flock: successive launches of the same command line make
different but reproducible decisions. Without `--sim-fault` nothing here runs and the simulator's
behaviour and output are unchanged (its own generators are never drawn from).
Per-request firings are logged at the 1st, 2nd, 4th, 8th, ... occurrence to keep the log small.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tuner.config.yamlfile import special_file
from tuner.errors import InputFileError
from tuner.sim.faultspec import LOAD_KINDS, PREFIX, FaultSpec


def next_launch_index(path: str) -> int:
    """Read the counter in `path` (0 if new or empty) and store counter + 1, under an flock."""
    special = special_file(Path(path))
    if special:  # a FIFO would block the start-up forever
        raise InputFileError(path, f"--sim-fault-state: {special}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputFileError(path, f"--sim-fault-state: cannot open: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 64).decode(errors="replace").strip()
        if raw and not raw.isdigit():
            raise InputFileError(path, f"--sim-fault-state: not a counter: {raw[:20]!r}")
        index = int(raw or 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, f"{index + 1}\n".encode())
        return index
    except OSError as exc:
        raise InputFileError(path, f"--sim-fault-state: {exc.strerror}") from None
    finally:
        os.close(fd)  # also releases the lock


class _Armed:
    """One fault armed on this launch, with its own generator for per-request draws."""

    def __init__(self, spec: FaultSpec, rng: random.Random):
        self.spec = spec
        self.rng = rng
        self.count = 0


class Faults:
    """The faults armed on one launch and what they fire on (serving time, requests seen)."""

    def __init__(self, specs: Sequence[FaultSpec] = (), seed: int = 0, launch: int = 0) -> None:
        self.launch = launch
        self.specs = tuple(specs)
        self.armed: list[_Armed] = []
        self.draws: list[float] = []
        for i, spec in enumerate(self.specs):
            # a str seed is hashed with SHA-512: the same in every process and Python run
            rng = random.Random(f"sim-fault:{seed}:{launch}:{i}:{spec.kind}")
            draw = rng.random()
            self.draws.append(draw)
            if draw < spec.p:
                self.armed.append(_Armed(spec, rng))
        self.ready_at: float | None = None
        self.served = 0
        self.request_seen = asyncio.Event()

    def summary(self) -> str | None:
        """The line logged at start-up (None without --sim-fault)."""
        if not self.specs:
            return None
        armed = {id(a.spec) for a in self.armed}
        parts = [
            f"{s.describe()} {'armed' if id(s) in armed else 'not armed'} (draw {d:.3f})"
            for s, d in zip(self.specs, self.draws, strict=True)
        ]
        return f"{PREFIX} launch {self.launch}: " + "; ".join(parts)

    def _of(self, *kinds: str) -> list[_Armed]:
        return [a for a in self.armed if a.spec.kind in kinds]

    @property
    def extra_startup_s(self) -> float:
        """Seconds slow-start adds to start-up."""
        return sum(a.spec.s for a in self._of("slow-start"))

    def start_fault(self) -> FaultSpec | None:
        """The earliest armed crash-start / hang-start, if any."""
        specs = [a.spec for a in self._of("crash-start", "hang-start")]
        return min(specs, key=lambda s: s.at) if specs else None

    def load_faults(self) -> list[FaultSpec]:
        """Armed one-shot faults that fire while serving (crash-load, hang-load)."""
        return [a.spec for a in self._of(*LOAD_KINDS)]

    def mark_ready(self, now: float) -> None:
        """The server is ready: serving time and the request count start now."""
        self.ready_at = now

    def on_request(self) -> None:
        """A generation request arrived (counted once ready)."""
        if self.ready_at is not None:
            self.served += 1
            self.request_seen.set()

    def _hit(self, kind: str, now: float, log: Callable[[str], None]) -> _Armed | None:
        """The armed fault of `kind` if it is active now and this request's draw hits."""
        if self.ready_at is None:
            return None
        for a in self._of(kind):
            s = a.spec
            due = now - self.ready_at >= s.after and self.served >= s.requests
            # draw only once due, so the sequence of draws does not depend on earlier timing
            if due and a.rng.random() < s.rate:
                a.count += 1
                if a.count & (a.count - 1) == 0:  # 1st, 2nd, 4th, 8th, ...
                    log(f"{PREFIX} {kind} fired (occurrence {a.count})")
                return a
        return None

    def http_error(self, now: float, log: Callable[[str], None]) -> int | None:
        """The status to answer this generation request with, or None to serve it."""
        a = self._hit("http-5xx", now, log)
        return a.spec.status if a is not None else None

    def health_fails(self, now: float, log: Callable[[str], None]) -> bool:
        """True when this /health probe should answer 503 (health-flap)."""
        return self._hit("health-flap", now, log) is not None

    def cut_after(self, now: float, log: Callable[[str], None]) -> int | None:
        """Tokens after which this streamed response is cut, or None to stream it whole."""
        a = self._hit("cut-stream", now, log)
        return a.spec.tokens if a is not None else None

    async def wait_due(self, spec: FaultSpec, now: Callable[[], float]) -> None:
        """Wait until a one-shot fault is due: `after` seconds since ready, `requests` seen."""
        assert self.ready_at is not None
        delay = self.ready_at + spec.after - now()
        if delay > 0:
            await asyncio.sleep(delay)
        while True:
            self.request_seen.clear()
            if self.served >= spec.requests:
                return
            await self.request_seen.wait()


def fired_line(spec: FaultSpec) -> str:
    """The line a one-shot fault logs as it fires."""
    return f"{PREFIX} {spec.kind} fired ({spec.describe()})"


def die() -> None:
    """End this process as a segfault or the OOM killer would: SIGKILL, no message, no cleanup."""
    os.kill(os.getpid(), signal.SIGKILL)


def hang(how: str) -> None:
    """Stop answering anything while staying alive: SIGSTOP ourselves, or block the event loop."""
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    # Blocking the loop's thread: no handler, no /health and no SIGTERM handler runs (asyncio's
    # handlers run on the loop); the kernel still accepts connections, which go unanswered.
    while True:
        time.sleep(3600)
