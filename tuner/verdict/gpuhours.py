"""GPU time as the study's measure: the GPU-hours a study spent, by phase, and the GPU-hours
at which it first held a configuration within 2% of its winner's score. Pure.

A trial's (and a confirmation run's) record is trial/spent.py's: `server_s` seconds on the
runner's clock (the wall's, or the virtual clock's in a `--virtual` study) times the `gpus`
the launched flags use, over 3600, is its GPU-hours. Trials count in trial-number order (the
order workers created them); confirmation runs come after the search and count in the total
only. Server-hours are the same seconds not multiplied by the GPUs: how long servers held
their host(s), summed over servers (an 8-GPU host's hour is 8 GPU-hours and 1 server-hour).
"Within 2%": a feasible trial whose first value is at least 0.98 of the winner's score
(`verdict.winner.best_trial`'s mean, what the export names). A trial that ran before these
records existed (no `Attr.SPENT`) counts 0 and is counted in `unrecorded`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.outcome import SPENT_KEYS as KEYS
from tuner.outcome import Attr, Status, is_feasible

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

#: + ":<worker>": {"12": [record, ...]}, one record per confirmation run of trial 12
CONFIRM_SPENT_ATTR = "tuner:confirm_spent"
#: how close to the winner's score a trial must come to count as holding it
WITHIN = 0.02
#: the record's phases as people name them
PHASE_NAMES = {
    "startup_s": "start-up",
    "warmup_s": "warm-up",
    "load_s": "load",
    "stop_s": "stop",
    "other_s": "other",
}


def gpu_hours(record: Mapping[str, Any], key: str = "server_s") -> float:
    """One record's GPU-hours (of `key`'s seconds)."""
    return float(record.get(key) or 0.0) * int(record.get("gpus") or 1) / 3600.0


def server_hours(record: Mapping[str, Any]) -> float:
    """One record's server-hours: how long its server held its GPUs, whatever their number."""
    return float(record.get("server_s") or 0.0) / 3600.0


@dataclass(frozen=True)
class GpuTime:
    """What a study's GPU time came to."""

    search: float  # GPU-hours of the trials
    confirm: float  # GPU-hours of the confirmation runs
    phases: Mapping[str, float] = field(default_factory=dict)  # GPU-hours by KEYS, both
    unrecorded: int = 0  # trials that ran with no record (a study from before)
    #: (trial number, GPU-hours spent when it completed) of the first within WITHIN of `score`
    first_within: tuple[int, float] | None = None
    score: float | None = None  # the winner's score it was judged against
    hours: float = 0.0  # server-hours of the trials and the confirmation runs
    first_hours: float | None = None  # server-hours spent when `first_within` completed

    @property
    def total(self) -> float:
        return self.search + self.confirm

    def as_json(self) -> dict[str, Any]:
        first = self.first_within
        return {
            "total": round(self.total, 4),
            "search": round(self.search, 4),
            "confirmation": round(self.confirm, 4),
            "phases": {PHASE_NAMES[k]: round(v, 4) for k, v in self.phases.items()},
            "unrecorded_trials": self.unrecorded,
            "within_pct": 100 * WITHIN,
            "server_hours": round(self.hours, 4),
            "first_within": None
            if first is None
            else {"trial": first[0], "gpu_hours": first[1], "server_hours": self.first_hours},
        }

    def text(self) -> str:
        """One line for `tuner status` and the report."""
        phases = ", ".join(f"{PHASE_NAMES[k]} {v:.2f}" for k, v in self.phases.items() if v)
        line = (
            f"GPU-hours: {self.total:.2f} in {self.hours:.2f} server-hours (search "
            f"{self.search:.2f}, confirmation "
            f"{self.confirm:.2f}{'; ' + phases if phases else ''})"
        )
        if self.first_within is not None:
            number, hours = self.first_within
            line += (
                f"; first within {100 * WITHIN:g}% of the winner's score at {hours:.2f} "
                f"GPU-hours, {self.first_hours or 0.0:.2f} server-hours (trial #{number})"
            )
        if self.unrecorded:
            line += f"; {self.unrecorded} trial(s) ran before time was recorded, counted 0"
        return line


def confirm_records(study_attrs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every worker's confirmation runs' records."""
    out: list[Mapping[str, Any]] = []
    for key, value in study_attrs.items():
        if key.startswith(CONFIRM_SPENT_ATTR + ":") and isinstance(value, Mapping):
            for runs in value.values():
                out.extend(r for r in runs or () if isinstance(r, Mapping))
    return out


def gpu_time(
    trials: Sequence[FrozenTrial], study_attrs: Mapping[str, Any], score: float | None
) -> GpuTime:
    """The study's GPU time from its trials, its user attributes (the confirmation records) and
    the winner's score (None: no winner yet)."""
    phases = dict.fromkeys(KEYS, 0.0)
    search, hours, unrecorded, first, first_hours = 0.0, 0.0, 0, None, None
    for t in sorted(trials, key=lambda t: t.number):
        record = t.user_attrs.get(Attr.SPENT)
        if isinstance(record, Mapping):
            search += gpu_hours(record)
            hours += server_hours(record)
            _add(phases, [record])
        elif _ran(t):
            unrecorded += 1
        if first is None and score is not None and score > 0 and _within(t, score):
            first, first_hours = (t.number, round(search, 4)), round(hours, 4)
    confirmations = confirm_records(study_attrs)
    _add(phases, confirmations)
    confirm = sum(gpu_hours(r) for r in confirmations)
    hours += sum(server_hours(r) for r in confirmations)
    return GpuTime(search, confirm, phases, unrecorded, first, score, hours, first_hours)


def _add(phases: dict[str, float], records: Iterable[Mapping[str, Any]]) -> None:
    for r in records:
        for k in KEYS:
            phases[k] += gpu_hours(r, k)


def _ran(t: FrozenTrial) -> bool:
    """Did a server run for this trial (not a duplicate, a rejection or one still running)?"""
    a = t.user_attrs
    return (
        t.state.name in ("COMPLETE", "FAIL")
        and Attr.DUPLICATE_OF not in a
        and a.get(Attr.STATUS) != Status.REJECTED
    )


def _within(t: FrozenTrial, score: float) -> bool:
    return (
        t.state.name == "COMPLETE"
        and bool(t.values)
        and is_feasible(t.constraints)
        and Attr.DUPLICATE_OF not in t.user_attrs
        and t.user_attrs.get(Attr.STATUS) != Status.CUT  # a projection, not a held score
        and t.values[0] >= (1 - WITHIN) * score
    )
