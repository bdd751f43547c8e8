"""Fault injection for the simulator: `--sim-fault SPEC` (repeatable) and `--sim-fault-state PATH`.

These are the *world's* failures, never the configuration's: no fault prints a line that
tuner.sglang.failures reads as SGLang's own evidence (OOM, host memory, argparse, bind error).
Each firing is logged as `[sim-fault] KIND fired ...` so a test can see it.

Syntax: `KIND[:key=value[,key=value...]]`, for example `crash-load:p=0.3,after=2`.

    kind         what happens                                             keys (default)
    crash-start  SIGKILLs itself during start-up (no SGLang message)      p, at (0.5)
    hang-start   start-up stops: alive, /health 503 forever, SIGTERM ok   p, at (0.5)
    slow-start   start-up takes `s` seconds longer                        p, s (10)
    crash-load   SIGKILLs itself while serving                            p, after (0), requests (1)
    hang-load    stops answering everything (requests, /health) while     p, after (0), requests (1),
                 alive; how=block: the event loop blocks (SIGTERM is      how (block)
                 ignored), how=stop: SIGSTOPs itself
    cut-stream   a streamed response is closed after `tokens` tokens,     p, after (0), requests (0),
                 without its final chunk or [DONE]                        rate (0.25), tokens (1)
    http-5xx     a generation request is answered `status`                p, after (0), requests (0),
                                                                          rate (0.25), status (500)
    health-flap  /health and /health_generate answer 503 once ready       p, after (0), requests (0),
                                                                          rate (0.25)

Keys:
    p         probability that the fault is armed on this launch, in [0, 1] (default 1)
    at        when in start-up, as a fraction of the whole start-up time, in [0, 1]
    s         extra start-up seconds, >= 0
    after     seconds of serving (since "ready to roll") before the fault may fire, >= 0
    requests  generation requests (/generate, /v1/completions, /v1/chat/completions) received
              since ready before the fault may fire, integer >= 0; crash-load and hang-load
              fire once, as soon as both `after` and `requests` are reached
    rate      share of the requests (health probes for health-flap) hit once active, in [0, 1]
    tokens    tokens streamed before the cut, integer >= 1 (a shorter response is cut before
              its last chunk)
    status    HTTP status of http-5xx, integer in [500, 599]
    how       hang-load only: block or stop

Seeding: fault number i (in command-line order) on launch L draws from its own generator seeded
with (--sim-seed, L, i, kind); the first draw decides whether it is armed (draw < p), later draws
decide per request. L is 0, or with `--sim-fault-state PATH` the counter in PATH, which every
launch reads and increments under an flock: successive launches of the same command line make
different but reproducible decisions. Without `--sim-fault` nothing here runs and the simulator's
behaviour and output are unchanged (its own generators are never drawn from).
Per-request firings are logged at the 1st, 2nd, 4th, 8th, ... occurrence to keep the log small.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import math
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.config.yamlfile import special_file
from tuner.errors import InputFileError

START_KINDS = ("crash-start", "hang-start", "slow-start")
LOAD_KINDS = ("crash-load", "hang-load")
REQUEST_KINDS = ("cut-stream", "http-5xx", "health-flap")
_SERVING = ("after", "requests")
#: the keys each kind accepts besides p
KEYS: dict[str, tuple[str, ...]] = {
    "crash-start": ("at",),
    "hang-start": ("at",),
    "slow-start": ("s",),
    "crash-load": _SERVING,
    "hang-load": (*_SERVING, "how"),
    "cut-stream": (*_SERVING, "rate", "tokens"),
    "http-5xx": (*_SERVING, "rate", "status"),
    "health-flap": (*_SERVING, "rate"),
}
HOW = ("block", "stop")
PREFIX = "[sim-fault]"


@dataclass(frozen=True)
class FaultSpec:
    """One parsed `--sim-fault` (every key with its default; `kind` says which apply)."""

    kind: str
    p: float = 1.0
    at: float = 0.5
    s: float = 10.0
    after: float = 0.0
    requests: int = 0
    rate: float = 0.25
    tokens: int = 1
    status: int = 500
    how: str = "block"

    def describe(self) -> str:
        """The spec back as `KIND:key=value,...` with every key this kind uses."""
        keys = ("p", *KEYS[self.kind])
        return f"{self.kind}:" + ",".join(f"{k}={getattr(self, k)}" for k in keys)


def _number(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw}: not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{key}={raw}: must be finite")
    return value


def _fraction(key: str, raw: str) -> float:
    value = _number(key, raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{key}={raw}: must be between 0 and 1")
    return value


def _seconds(key: str, raw: str) -> float:
    value = _number(key, raw)
    if value < 0:
        raise ValueError(f"{key}={raw}: must be >= 0 seconds")
    return value


def _integer(key: str, raw: str, low: int, high: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key}={raw}: not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{key}={raw}: must be {bound}")
    return value


def _how(key: str, raw: str) -> str:
    if raw not in HOW:
        raise ValueError(f"{key}={raw}: expected one of {', '.join(HOW)}")
    return raw


_CONVERT: dict[str, Callable[[str, str], object]] = {
    "p": _fraction,
    "at": _fraction,
    "rate": _fraction,
    "s": _seconds,
    "after": _seconds,
    "requests": lambda k, r: _integer(k, r, 0),
    "tokens": lambda k, r: _integer(k, r, 1),
    "status": lambda k, r: _integer(k, r, 500, 599),
    "how": _how,
}


def parse_fault(text: str) -> FaultSpec:
    """`KIND[:key=value,...]` -> FaultSpec; ValueError with a one-line reason otherwise."""
    kind, _, rest = text.partition(":")
    kind = kind.strip()
    if kind not in KEYS:
        raise ValueError(f"unknown fault kind {kind!r} (expected one of {', '.join(KEYS)})")
    allowed = ("p", *KEYS[kind])
    values: dict[str, object] = {}
    if kind in LOAD_KINDS:
        values["requests"] = 1  # one-shot faults wait for load by default
    seen: set[str] = set()
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not raw:
            raise ValueError(f"{kind}: expected key=value, got {item!r}")
        if key not in allowed:
            raise ValueError(f"{kind}: unknown key {key!r} (expected {', '.join(allowed)})")
        if key in seen:
            raise ValueError(f"{kind}: {key} given twice")
        seen.add(key)
        try:
            values[key] = _CONVERT[key](key, raw)
        except ValueError as exc:
            raise ValueError(f"{kind}: {exc}") from None
    return FaultSpec(kind=kind, **values)  # type: ignore[arg-type]


def fault_arg(text: str) -> FaultSpec:
    """argparse `type=` for --sim-fault (a bad spec becomes argparse's one-line error)."""
    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_fault_flags(add: Callable[..., object]) -> None:
    """Register --sim-fault and --sim-fault-state with a parser's `add_argument`."""
    add(
        "--sim-fault",
        type=fault_arg,
        action="append",
        default=[],
        metavar="SPEC",
        help=(
            "inject a fault, KIND[:key=value,...] (repeatable). Kinds: crash-start, hang-start "
            "(at=FRACTION), slow-start (s=SECONDS), crash-load, hang-load (after=SECONDS, "
            "requests=N, how=block|stop), cut-stream (tokens=N), http-5xx (status=5xx), "
            "health-flap; the request kinds take rate=SHARE, after= and requests=. Every kind "
            "takes p=PROBABILITY (default 1) of being armed on this launch; draws are seeded by "
            "--sim-seed and the launch index. Full syntax: tuner/sim/faults.py"
        ),
    )
    add(
        "--sim-fault-state",
        type=str,
        default=None,
        metavar="PATH",
        help="launch counter file (created if missing), so that each launch draws its own faults",
    )


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
