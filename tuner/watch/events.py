"""What a running study tells the person watching it: the events, and the words for them.

The loop emits these events through `api.Events.on_progress` (a library caller may ignore
them); `tuner.watch.state.StudyWatch` folds them into what the display shows, and `tuner.watch.live` draws
it (a rich live panel on a terminal, one plain line per event elsewhere):

    RunStarted        the run begins: the budget, and the trials the study already holds
    TrialStarted      a trial (or a confirmation run) begins, with its params
    PhaseChanged      the trial runner entered a phase (runner.PHASES)
    Milestone         the starting server logged a start-up milestone (sglang.milestones)
    LoadProgress      the load run so far, about once a second (loadgen.result)

Finished trials come as optuna's FrozenTrial through `api.Events.on_trial`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from tuner.config.schema import StudyConfig
from tuner.loadgen.result import LoadProgress
from tuner.outcome import Attr, Status, TrialOutcome, score_of
from tuner.sglang.milestones import Milestone

__all__ = [
    "PHASE_NAMES",
    "LoadProgress",
    "Milestone",
    "PhaseChanged",
    "ProgressEvent",
    "RunStarted",
    "TrialStarted",
    "duration",
    "param_text",
    "trial_line",
]


@dataclass(frozen=True)
class RunStarted:
    """A `tune` run begins: its budget and what the study already holds (a resume)."""

    study: str
    n_trials: int
    timeout_s: float | None
    metric: str
    confirm_runs: int  # confirmation runs planned after the trials (confirm_top x repeats)
    trials: tuple[FrozenTrial, ...] = ()


@dataclass(frozen=True)
class TrialStarted:
    """A trial begins (`confirm` 0), or the `confirm`-th of `confirms` confirmation runs."""

    number: int
    params: Mapping[str, Any] = field(default_factory=dict)
    confirm: int = 0
    confirms: int = 0


@dataclass(frozen=True)
class PhaseChanged:
    """The trial runner moved to `phase` (one of runner.PHASES)."""

    number: int
    phase: str


ProgressEvent = RunStarted | TrialStarted | PhaseChanged | Milestone | LoadProgress

#: the runner's phases as a person reads them: `restart` stops the old server and frees its
#: port and GPU, `spawn` waits for the new one to answer /health
PHASE_NAMES = {
    "restart": "stopping",
    "spawn": "starting",
    "ready": "server ready",
    "warmup": "warm-up",
    "load": "load run",
    "scoring": "scoring",
    "done": "done",
}


def duration(seconds: float) -> str:
    """`9.8 s`, `2m 05s`, `1h 02m`: a unit on every number."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = round(seconds)
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def param_text(params: Mapping[str, Any]) -> str:
    """`mem-fraction-static=0.87 concurrency=64` (floats as the user writes them)."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def metric_unit(metric: str) -> str:
    """The unit of an objective metric's value."""
    return "req/s" if metric in ("request_throughput", "goodput") else "tok/s"


def trial_line(cfg: StudyConfig, trial: FrozenTrial) -> str:
    """One line per finished trial: status, params, score or reason, and tags."""
    a = trial.user_attrs
    outcome = TrialOutcome.from_attrs(a, trial.values)
    status = str(outcome.status) if outcome else trial.state.name.lower()
    if outcome and outcome.status.measured and outcome.metrics and trial.values:
        score = score_of(cfg.objective.metric, outcome.metrics) or 0.0  # an SLO miss's value is 0
        what = (
            f"{score:,.1f} {metric_unit(cfg.objective.metric)} "
            f"{cfg.objective.metric}, p99 TTFT {outcome.metrics.get('p99_ttft_ms', 0):,.0f} ms"
        )
        if outcome.status == Status.SLO_MISSED:
            what += f" ({outcome.reason})"
    else:
        what = (outcome.reason if outcome else "") or a.get(Attr.INFRA_ERROR) or ""
    tags = " [restart]" if a.get(Attr.RESTARTED) else ""
    if Attr.DUPLICATE_OF in a:
        tags = f" [= trial #{a[Attr.DUPLICATE_OF]}]"
    params = param_text(trial.params)
    return f"trial #{trial.number} {status} {params}: {what}{tags}".rstrip()
