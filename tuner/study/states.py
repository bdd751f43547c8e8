"""What a `tuner tune` run records of its trials beyond their outcomes: the one place an
outcome becomes an optuna state, the live server a worker left running, the run's counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from optuna.trial import TrialState

from tuner.outcome import Status

#: the study's own attributes (study/rows.py checks their types when a study opens)
SERVER_ATTR = "tuner:server_pgid:"  # + worker: the live server a worker left running
FINGERPRINT_ATTR = "tuner:fingerprint"  # what makes trials comparable (study/storage.py)
IDENTITY_ATTR = "tuner:server_identity"  # the SGLang version and GPU the study ran on
#: + ":<worker>": [trials complete, extra confirmation rounds that worker ran at that count]
ROUNDS_ATTR = "tuner:confirm_rounds"

#: the one place an outcome becomes an optuna state: FAIL teaches the sampler nothing
STATE_OF: Mapping[Status, TrialState] = {
    Status.OK: TrialState.COMPLETE,
    Status.SLO_MISSED: TrialState.COMPLETE,
    Status.REJECTED: TrialState.COMPLETE,
    Status.START_FAILED: TrialState.COMPLETE,
    Status.DIED: TrialState.COMPLETE,
    Status.FLAGGED: TrialState.FAIL,
    Status.WORLD: TrialState.FAIL,
    Status.CUT: TrialState.COMPLETE,  # never a trial's (trial/inner.py); infeasible if it were
}


@dataclass
class TuneStats:
    launched: int = 0
    rejected: int = 0
    duplicates: int = 0
    infra_failures: int = 0
