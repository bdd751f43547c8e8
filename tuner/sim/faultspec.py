"""`--sim-fault SPEC` (repeatable): the fault injection's syntax, parsed and registered with the
simulator's parser. Pure; sim/faults.py fires what it parses.

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
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

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
            "--sim-seed and the launch index. Full syntax: tuner/sim/faultspec.py"
        ),
    )
    add(
        "--sim-fault-state",
        type=str,
        default=None,
        metavar="PATH",
        help="launch counter file (created if missing), so that each launch draws its own faults",
    )


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
