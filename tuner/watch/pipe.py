"""A fleet worker's events on a pipe: one JSON line each, from the worker's `tuner tune` to the
fleet's display (tuner/watch/fleet.py).

The worker (`tuner tune STUDY --worker NAME` started by the fleet) writes through `EventPipe`,
which takes the display's calls (`progress`, `trial`, `message`); the fleet reads each line back
with `decode`. A finished trial travels as its number: the fleet reads the trial itself from
the study they share (a FrozenTrial is optuna's, not a wire format). RunStarted's trials stay
behind for the same reason.

    {"progress": "TrialStarted", "number": 3, "params": {...}, "confirm": 0, "confirms": 0}
    {"trial": 3}
    {"message": "this run: 2 launched, ..."}
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import IO, Any

from optuna.trial import FrozenTrial

from tuner.watch.events import (
    LoadProgress,
    Milestone,
    PhaseChanged,
    ProgressEvent,
    RunStarted,
    TrialStarted,
)

_KINDS: dict[str, type] = {
    cls.__name__: cls for cls in (RunStarted, TrialStarted, PhaseChanged, Milestone, LoadProgress)
}


class EventPipe:
    """The display of a fleet's worker: every call one JSON line on `stream`, flushed."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def __enter__(self) -> EventPipe:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _send(self, record: dict[str, Any]) -> None:
        self.stream.write(json.dumps(record, default=str) + "\n")
        self.stream.flush()

    def progress(self, event: ProgressEvent) -> None:
        # first_waits: what only a cut rule reads, thousands of numbers a second: not the display's
        skip = ("trials", "first_waits")
        body = {f.name: getattr(event, f.name) for f in fields(event) if f.name not in skip}
        if isinstance(event, TrialStarted):
            body["params"] = dict(event.params)
        self._send({"progress": type(event).__name__, **body})

    def trial(self, t: FrozenTrial) -> None:
        self._send({"trial": t.number})

    def message(self, text: str) -> None:
        self._send({"message": text})


def decode(line: str) -> tuple[str, Any] | None:
    """A line of a worker's pipe -> ("progress", event) | ("trial", number) | ("message", text);
    None for a line that is none of these (a stray print of a library: shown as a message by
    the caller, never a crash)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    if "trial" in record and isinstance(record["trial"], int):
        return "trial", record["trial"]
    if "message" in record:
        return "message", str(record["message"])
    cls = _KINDS.get(str(record.pop("progress", "")))
    if cls is None:
        return None
    try:
        return "progress", cls(**record)
    except TypeError:
        return None
