"""The JSON summary of one `tuner tune` run, as a notify command receives it (tuner/watch/notify.py).

    {"schema": "tuner.notify/1", "event": "finished", "exit_code": 0, "message": null,
     "study": "demo-sim", "study_file": "search_spaces/demo-sim.yaml", "host": "local",
     "started_at": "2026-01-02T03:04:05+01:00", "ended_at": "...", "elapsed_s": 123.4,
     "n_trials": 10,
     "trials": {"total": 12, "complete": 10, "feasible": 7, "infeasible": 2, "rejected": 1,
                "failed": 2, "running": 0},
     "best": {"trial": 7, "metric": "output_throughput", "value": 2512.3, "mean": 2498.1,
              "runs": [2512.3, 2483.9], "held": 2, "spread_pct": 1.1, "params": {...}},
     "best_yaml": "runs/demo-sim/best.yaml",
     "this_run": {"launched": 8, "rejected": 1, "duplicates": 1, "infra_failures": 0,
                  "server_reuses": 2},
     "gpu_hours": {"total": 1.2, "search": 1.0, "confirmation": 0.2, "phases": {...},
                   "unrecorded_trials": 0, "within_pct": 2.0,
                   "first_within": {"trial": 4, "gpu_hours": 0.4}}}

`event`: finished (the budget ran out, exit 0 or 1 when nothing was feasible), failed (the
user's mistake, exit 2, or the host's, exit 1), stopped (a halt: resumable, exit 1),
interrupted (Ctrl-C or SIGTERM, exit 130). No secret: no environment, no launch command, no
server flags but the searched params, and the API key's and `target.env`'s values are masked
wherever they could appear (an error message).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.config.schema import StudyConfig
from tuner.errors import HaltError, TunerError
from tuner.outcome import Attr, Status
from tuner.server.launch import MIN_MASKED_LEN, REDACTED
from tuner.study.storage import existing_study
from tuner.study.storage_failure import storage_failure
from tuner.verdict.gpuhours import gpu_time
from tuner.verdict.trials import feasible_trials
from tuner.verdict.winner import best_trial

SCHEMA = "tuner.notify/1"


def event_of(exc: BaseException | None, exit_code: int) -> str:
    """finished, failed, stopped or interrupted."""
    if exc is None:
        return "finished"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, HaltError) and not isinstance(exc, TunerError):
        return "stopped"
    return "failed"


def exit_code_of(exc: BaseException) -> int:
    """The exit code the CLI gives for `exc` (tuner/cli.py)."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, TunerError):
        return 2
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    return 1


def message_of(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C or SIGTERM); run the same command again to resume"
    # a full disk reaches here as optuna's "Should not reach." assertion: say what it was
    return storage_failure(exc, None) or str(exc) or type(exc).__name__


def readable_study(cfg: StudyConfig, runs_dir: Path, storage: str | None) -> optuna.Study | None:
    """The study as stored, for the summary of a run that stopped; None when it cannot be
    read (never created, the storage down)."""
    try:
        return existing_study(cfg, runs_dir, storage)
    except Exception:  # the notification of a failure must go out even without its study
        return None


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def trial_counts(study: optuna.Study) -> dict[str, int]:
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    rejected = sum(1 for t in complete if t.user_attrs.get(Attr.STATUS) == Status.REJECTED)
    feasible = len(feasible_trials(study))
    return {
        "total": len(trials),
        "complete": len(complete),
        "feasible": feasible,
        "infeasible": len(complete) - feasible - rejected,
        "rejected": rejected,
        "failed": sum(1 for t in trials if t.state == TrialState.FAIL),
        "running": sum(1 for t in trials if t.state == TrialState.RUNNING),
    }


def best_of(cfg: StudyConfig, study: optuna.Study) -> dict[str, Any] | None:
    best, summary = best_trial(study)
    if best is None:
        return None
    return {
        "trial": best.number,
        "metric": cfg.objective.metric,
        "value": best.values[0],
        "mean": summary["mean"],
        "runs": summary["runs"],
        "held": summary["held"],  # of `runs`, those that held the SLOs on their own
        "spread_pct": summary["spread_pct"],
        "params": dict(best.params),
    }


def run_summary(
    cfg: StudyConfig,
    *,
    exc: BaseException | None,
    exit_code: int,
    message: str | None,
    started: float,
    ended: float,
    study: optuna.Study | None = None,
    n_trials: int | None = None,
    best_yaml: Path | None = None,
    this_run: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of a run that ended (`exc` None) or stopped with `exc`."""
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "event": event_of(exc, exit_code),
        "exit_code": exit_code,
        "message": message,
        "study": cfg.study,
        "study_file": cfg.source,
        "host": cfg.target.host,
        "started_at": iso(started),
        "ended_at": iso(ended),
        "elapsed_s": round(ended - started, 3),
        "n_trials": n_trials or cfg.budget.n_trials,
        "trials": trial_counts(study) if study is not None else None,
        "best": best_of(cfg, study) if study is not None else None,
        "best_yaml": str(best_yaml) if best_yaml else None,
        "this_run": this_run,
        "gpu_hours": gpu_hours_of(study) if study is not None else None,
    }
    return mask(out, secrets_of(cfg))


def gpu_hours_of(study: optuna.Study) -> dict[str, Any]:
    """The study's GPU time so far (verdict/gpuhours.py), against its winner's score."""
    _, summary = best_trial(study)
    return gpu_time(
        study.get_trials(deepcopy=False), study.user_attrs, summary.get("mean")
    ).as_json()


def secrets_of(cfg: StudyConfig) -> list[str]:
    """Values that must never leave: the API key and the SSH password (from their environment
    variables) and every value of target.env (tokens live there), when long enough to mask."""
    values = list(cfg.target.env.values())
    for name in (cfg.target.api_key_env, cfg.target.ssh.password_env):
        if name:
            values.append(os.environ.get(name, ""))
    return [v for v in values if isinstance(v, str) and len(v) >= MIN_MASKED_LEN]


def mask(data: dict[str, Any], secrets: list[str]) -> dict[str, Any]:
    """`data` with every secret value replaced, wherever it appears."""
    if not secrets:
        return data
    text = json.dumps(data, default=str)
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(json.dumps(s)[1:-1], REDACTED)
    return dict(json.loads(text))
