"""What a running study tells the person watching it: one line per finished trial."""

from __future__ import annotations

from optuna.trial import FrozenTrial

from tuner.config import StudyConfig
from tuner.trial import Attr, Status, TrialOutcome


def trial_line(cfg: StudyConfig, trial: FrozenTrial) -> str:
    """One progress line per finished trial: status, params, score or reason, and tags."""
    a = trial.user_attrs
    params = " ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items()
    )
    outcome = TrialOutcome.from_attrs(a, trial.values)
    status = str(outcome.status) if outcome else trial.state.name.lower()
    if outcome and outcome.status.measured and outcome.metrics and trial.values:
        what = (
            f"{trial.values[0]:,.1f} {cfg.objective.metric}, "
            f"p99 TTFT {outcome.metrics.get('p99_ttft_ms', 0):,.0f} ms"
        )
        if outcome.status == Status.SLO_MISSED:
            what += f" ({outcome.reason})"
    else:
        what = (outcome.reason if outcome else "") or a.get(Attr.INFRA_ERROR) or ""
    tags = " [restart]" if a.get(Attr.RESTARTED) else ""
    if Attr.DUPLICATE_OF in a:
        tags = f" [= trial {a[Attr.DUPLICATE_OF]}]"
    return f"trial {trial.number:>3} {status:<12} {params}: {what}{tags}"
