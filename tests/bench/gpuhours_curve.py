"""GPU-hours to a share of the optimum, from a study's trials in order, and their median and
worst over seeds (bench_gpuhours). Pure.

A study that never got there spent all its GPU-hours without: its figure is a lower bound
(`Reach.reached` False), shown as ">X". A median or worst that such a seed decides is then a
lower bound too, taken with every unreached seed at what it spent.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: the share of the optimum a pick must reach
SHARE = 0.98


@dataclass(frozen=True)
class Reach:
    """GPU-hours spent when the study's pick first reached the share (else all it spent)."""

    hours: float
    reached: bool


def hours_to(rows: Sequence[tuple[float, float]], share: float = SHARE) -> Reach:
    """`rows`: (the trial's own GPU-hours, the pick's ratio to the optimum after it), in trial
    order -> the GPU-hours spent up to and including the first trial whose pick reached
    `share`."""
    spent = 0.0
    for hours, ratio in rows:
        spent += hours
        if ratio >= share:
            return Reach(spent, True)
    return Reach(spent, False)


@dataclass(frozen=True)
class Figure:
    """A median or a worst over seeds: exact, or a lower bound (an unreached seed decides it)."""

    value: float
    exact: bool

    def __str__(self) -> str:
        return ("" if self.exact else ">") + _num(self.value)


def median(reaches: Sequence[Reach]) -> Figure:
    """The median over seeds, an unreached seed counting as never."""
    m = statistics.median(r.hours if r.reached else math.inf for r in reaches)
    if math.isfinite(m):
        return Figure(m, True)
    return Figure(statistics.median(r.hours for r in reaches), False)


def worst(reaches: Sequence[Reach]) -> Figure:
    if all(r.reached for r in reaches):
        return Figure(max(r.hours for r in reaches), True)
    return Figure(max(r.hours for r in reaches), False)


def ratio(after: Figure, before: Figure) -> str:
    """after / before, when both are exact figures."""
    if not (after.exact and before.exact) or before.value <= 0:
        return "-"
    return f"{after.value / before.value:.2f}"


def _num(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"
