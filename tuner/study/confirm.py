"""One worker's confirmation runs as the study keeps them: a value per run and, index by index,
the run's latency tails (pooled.tails_of), which verdict/winner.py pools into the winner's verdict.

    tuner:confirmations:<worker> = {"12": [1830.2, 0.0, 1795.4]}
    tuner:confirm_tails:<worker> = {"12": [{...}, None, {...}]}     # None: a death, no tails

A run with tails keeps its measured value even when its own p99 missed a limit (the run-to-run
noise reads it) and its tails join the configuration's pooled verdict; verdict/winner.py ranks such a
run 0.0, as a start that would have missed its SLOs. A run that could not measure (a death, a
failed start) counts 0.0 as before, and so does a miss without tails to pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from tuner.config.schema import ObjectiveSection
from tuner.outcome import TrialOutcome, objective_values
from tuner.verdict.winner import CONFIRM_ATTR, CONFIRM_TAILS_ATTR, aligned, completed

#: + ":<worker>": [trials complete, extra confirmation rounds that worker ran at that count]
ROUNDS_ATTR = "tuner:confirm_rounds"

Tails = Mapping[str, Any] | None


class ConfirmTimeUp(Exception):
    """The run's --timeout passed during confirmation (not a failure: it ends early)."""


def run_value(objective: ObjectiveSection, outcome: TrialOutcome) -> tuple[float, Tails]:
    """A confirmation run's (value, tails) from its outcome (not a FAIL one: those run again)."""
    if outcome.feasible:
        return outcome.values[0], outcome.tails
    if outcome.status.measured and outcome.tails is not None:
        return objective_values(objective, outcome.metrics)[0], outcome.tails  # judged pooled
    return 0.0, None


class ConfirmRecord:
    """This worker's confirmation values and tails, read from the study and written back after
    every run (the tails first: a kill between the two writes leaves a tail without its value,
    which `verdict.winner.aligned` drops, never a value paired with another run's tail)."""

    def __init__(self, study: optuna.Study, worker: str):
        self.study = study
        self.values_key = f"{CONFIRM_ATTR}:{worker}"
        self.tails_key = f"{CONFIRM_TAILS_ATTR}:{worker}"
        self.rounds_key = f"{ROUNDS_ATTR}:{worker}"
        stored = study.user_attrs.get(self.tails_key) or {}
        self.values: dict[str, list[float]] = {
            k: list(v) for k, v in (study.user_attrs.get(self.values_key) or {}).items()
        }
        self.tails: dict[str, list[Tails]] = {
            k: aligned(v, stored.get(k)) for k, v in self.values.items()
        }

    def runs(self, number: int) -> list[float]:
        """The values of trial `number`'s runs so far (the live list)."""
        self.tails.setdefault(str(number), [])
        return self.values.setdefault(str(number), [])

    def add(self, number: int, value: float, tails: Tails) -> None:
        self.runs(number).append(value)
        self.tails[str(number)].append(None if tails is None else dict(tails))
        self.study.set_user_attr(self.tails_key, self.tails)
        self.study.set_user_attr(self.values_key, self.values)

    @property
    def rounds(self) -> int:
        """The extra rounds (budget.confirm_extra) this worker ran on the study's trials as they
        are: a budget of the study, not of each `tune` (a re-run of a finished study only
        re-exports); more trials since (a raised --n-trials) start it afresh."""
        done, rounds = self.study.user_attrs.get(self.rounds_key) or (None, 0)
        return int(rounds) if done == len(completed(self.study)) else 0

    def add_round(self) -> None:
        count = [len(completed(self.study)), self.rounds + 1]
        self.study.set_user_attr(self.rounds_key, count)
