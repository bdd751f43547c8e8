"""A study for people: the trials table (rich), its JSON, and an HTML report with plots (plotly)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import optuna
from rich.table import Table

from tuner.config import StudyConfig
from tuner.results import best_trial
from tuner.trial import Attr, is_feasible

_SHORT = {
    "mem-fraction-static": "mfs",
    "hicache-size": "hicache",
    "concurrency": "conc",
    "schedule-conservativeness": "conserv",
    "chunked-prefill-size": "chunk",
    "cuda-graph-max-bs": "graph-bs",
    "hicache-write-policy": "policy",
}


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


FEASIBLE, INFEASIBLE, WINNER = "#2a9d8f", "#e76f51", "#264653"


def write_html(cfg: StudyConfig, study: optuna.Study, path: Path) -> Path:
    """A self-contained HTML report: history, parameter scatter plots, the trials table."""
    import plotly.io as pio

    rows = trial_rows(study)
    measured = [r for r in rows if r["state"] == "COMPLETE" and r["value"] is not None]
    best, summary = best_trial(study)
    figs = [_history(cfg, measured, best), *_ttft(cfg, measured), *_by_param(cfg, measured)]
    verdict = (
        f"trial {best.number}, {html.escape(str(dict(best.params)))}, "
        f"mean {summary['mean']:,.1f} over {len(summary['runs'])} run(s)"
        if best
        else "no feasible trial yet"
    )
    parts = [
        f"<h1>tuner study {html.escape(cfg.study)}</h1>",
        f"<p>{html.escape(cfg.description)}</p>",
        f"<p>Best: {verdict}</p>",
        *(pio.to_html(f, include_plotlyjs=(i == 0), full_html=False) for i, f in enumerate(figs)),
        _table_html(rows),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(cfg.study)}"
        f"</title></head><body>{''.join(parts)}</body></html>"
    )
    return path


def _history(cfg: StudyConfig, rows: list[dict[str, Any]], best: Any) -> Any:
    """The objective by trial, feasible and not, with the winner starred."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for feasible, color in ((True, FEASIBLE), (False, INFEASIBLE)):
        sel = [r for r in rows if r["feasible"] is feasible]
        fig.add_trace(
            go.Scatter(
                x=[r["trial"] for r in sel],
                y=[r["value"] for r in sel],
                mode="markers",
                marker={"color": color},
                name="feasible" if feasible else "infeasible",
                text=[r["reason"] for r in sel],
            )
        )
    if best is not None:
        fig.add_trace(
            go.Scatter(
                x=[best.number],
                y=[best.values[0]],
                mode="markers",
                name="winner",
                marker={"symbol": "star", "size": 16, "color": WINNER},
            )
        )
    fig.update_layout(title=f"{cfg.objective.metric} by trial", xaxis_title="trial")
    return fig


def _ttft(cfg: StudyConfig, rows: list[dict[str, Any]]) -> list[Any]:
    """p99 TTFT against client concurrency, with the SLO line (none without concurrency)."""
    import plotly.graph_objects as go

    measured = [r for r in rows if r["p99_ttft_ms"] and "concurrency" in r["params"]]
    if not measured:
        return []
    fig = go.Figure(
        go.Scatter(
            x=[r["params"]["concurrency"] for r in measured],
            y=[r["p99_ttft_ms"] for r in measured],
            mode="markers",
            text=[f"trial {r['trial']}" for r in measured],
            name="trials",
        )
    )
    if cfg.objective.slo.p99_ttft_ms:
        fig.add_hline(
            y=cfg.objective.slo.p99_ttft_ms, line_dash="dash", annotation_text="p99 TTFT limit"
        )
    fig.update_layout(
        title="p99 TTFT vs client concurrency (the queue the pool cannot admit)",
        xaxis_title="concurrency",
        yaxis_title="ms",
    )
    return [fig]


def _by_param(cfg: StudyConfig, rows: list[dict[str, Any]]) -> list[Any]:
    """The objective against each searched parameter."""
    import plotly.graph_objects as go

    figs = []
    for name in cfg.space:
        xs = [(r["params"].get(name), r) for r in rows if name in r["params"]]
        if not xs:
            continue
        fig = go.Figure(
            go.Scatter(
                x=[x for x, _ in xs],
                y=[r["value"] for _, r in xs],
                mode="markers",
                marker={"color": [FEASIBLE if r["feasible"] else INFEASIBLE for _, r in xs]},
                text=[f"trial {r['trial']}: {r['reason']}" for _, r in xs],
            )
        )
        fig.update_layout(title=f"{cfg.objective.metric} vs {name}", xaxis_title=name)
        figs.append(fig)
    return figs


def _table_html(rows: list[dict[str, Any]]) -> str:
    head = "".join(
        f"<th>{h}</th>" for h in ("trial", "state", "params", "value", "p99 TTFT ms", "reason")
    )
    cells = (
        (
            r["trial"],
            r["status"] or r["state"],
            r["params"],
            _fmt(r["value"]),
            _fmt(r["p99_ttft_ms"], ",.0f"),
            r["reason"],
        )
        for r in rows
    )
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in cells
    )
    return f"<h2>Trials</h2><table border=1 cellpadding=4><tr>{head}</tr>{body}</table>"
