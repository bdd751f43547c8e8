"""A study for people: the trials table (rich), its JSON, and the HTML report (report/page.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from rich.table import Table

from tuner.config.schema import StudyConfig
from tuner.outcome import Attr, is_feasible
from tuner.report.rows import SHORT as _SHORT
from tuner.verdict.winner import best_trial


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """One dict per trial: what `tuner status --json` prints and the table shows."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        m = a.get(Attr.METRICS) or {}
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name,
                "status": a.get(Attr.STATUS, ""),
                "params": dict(t.params) or dict(t.system_attrs.get("fixed_params", {})),
                "feasible": is_feasible(t.constraints) if t.state.name == "COMPLETE" else None,
                "value": t.values[0] if t.values else None,
                "output_throughput": m.get("output_throughput"),
                "p99_ttft_ms": m.get("p99_ttft_ms"),
                "p99_tpot_ms": m.get("p99_tpot_ms"),
                "reason": a.get(Attr.REASON) or a.get(Attr.INFRA_ERROR, ""),
                "restarted": a.get(Attr.RESTARTED),
                "duplicate_of": a.get(Attr.DUPLICATE_OF),
                "worker": a.get(Attr.WORKER),
            }
        )
    return rows


def _fmt(v: Any, spec: str = ",.1f") -> str:
    return "" if v is None else format(v, spec)


def trials_table(cfg: StudyConfig, study: optuna.Study) -> Table:
    best, _ = best_trial(study)
    t = Table(title=f"study {cfg.study}: {cfg.objective.metric}")
    for col, just in (
        ("#", "right"),
        ("state", "left"),
        ("params", "left"),
        ("score", "right"),
        ("p99 TTFT ms", "right"),
        ("p99 TPOT ms", "right"),
        ("reason", "left"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in trial_rows(study):
        params = " ".join(f"{_SHORT.get(k, k)}={_compact(v)}" for k, v in r["params"].items())
        state = r["status"] or r["state"].lower()
        if r["duplicate_of"] is not None:
            state += f" (=#{r['duplicate_of']})"
        style = "bold green" if best is not None and r["trial"] == best.number else None
        t.add_row(
            str(r["trial"]),
            state,
            params,
            _fmt(r["value"]),
            _fmt(r["p99_ttft_ms"], ",.0f"),
            _fmt(r["p99_tpot_ms"]),
            _short(r["reason"] or "", 90),
            style=style,
        )
    return t


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1].rsplit(" ", 1)[0] + " …"


def _compact(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def write_html(cfg: StudyConfig, study: optuna.Study, path: Path) -> Path:
    """The self-contained HTML report (tuner/report/page.py), written atomically: a failed
    write leaves the previous report whole, and is one line (InfraError)."""
    from tuner.report.export import write_atomic
    from tuner.report.page import write_html as write_page

    write_atomic(path, lambda to: write_page(cfg, study, to))
    return path
