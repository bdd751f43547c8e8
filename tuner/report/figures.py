"""The report's charts: each a function (config, study) -> plotly figure, or a note saying why
there is none. Built on `optuna.visualization` where it draws the chart (importance, contour,
slices, Pareto front); the rest is tuner's own (history with reasons, TTFT against concurrency,
the KV pool by mfs, the confirmation spread, the inner load search).

Every optuna chart plots the score (the first objective, the value `outcome.is_feasible` ranks);
optuna greys out infeasible trials where it reads the constraints. Optuna's warnings about too
few trials (a parameter with one value so far) are silenced: a young study is not an error.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState

from tuner.config.schema import StudyConfig
from tuner.config.space import CLIENT_PARAMS
from tuner.outcome import PESSIMISTIC_LATENCY_MS, Attr, is_feasible
from tuner.sglang.flags import canonical_flag
from tuner.verdict.winner import best_trial

FEASIBLE, INFEASIBLE, WINNER, PROJECTED = "#2a9d8f", "#e76f51", "#264653", "#8d99ae"
#: one small template for every chart: plotly's default template weighs ~8 KB per figure
TEMPLATE = go.layout.Template(
    layout={
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "colorway": [FEASIBLE, INFEASIBLE, WINNER, "#e9c46a", "#f4a261", PROJECTED],
        "plot_bgcolor": "#fafafa",
        "xaxis": {"gridcolor": "#e5e5e5", "zeroline": False},
        "yaxis": {"gridcolor": "#e5e5e5", "zeroline": False},
        "margin": {"t": 50, "r": 20, "b": 50, "l": 60},
        "height": 420,
    }
)
#: what a trial may carry of its own load search: [{concurrency, <score>, p99_ttft_ms}, ...]
LOAD_POINTS_ATTR = str(getattr(Attr, "LOAD_POINTS", "load_points"))


@dataclass(frozen=True)
class Chart:
    """One section of the report: a figure, or a note on why it is missing."""

    key: str  # the div id is fig-<key>
    title: str
    about: str
    figure: go.Figure | None = None
    note: str = ""


def score_of(t: FrozenTrial) -> float:
    return float(t.values[0])


def complete(study: optuna.Study) -> list[FrozenTrial]:
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values and Attr.DUPLICATE_OF not in t.user_attrs
    ]


def feasible(t: FrozenTrial) -> bool:
    return is_feasible(t.constraints)


def _quiet(draw: Callable[[], go.Figure]) -> go.Figure | str:
    """Run an optuna plot; its refusal (too few trials) becomes the chart's note."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return draw()
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return f"optuna could not draw it yet: {exc}"


def searched(cfg: StudyConfig, server_only: bool = False) -> list[str]:
    """The searched parameters (server flags only, when asked), as the study names them."""
    return [k for k in cfg.space if not (server_only and k in CLIENT_PARAMS)]


def _find(names: list[str], canonical: str) -> str | None:
    return next((n for n in names if (canonical_flag(n) or n) == canonical), None)


# --- the landscape ------------------------------------------------------------------------


def history(cfg: StudyConfig, study: optuna.Study) -> Chart:
    """The score by trial, feasible and not (hover: the reason), the winner starred."""
    trials = complete(study)
    best, _ = best_trial(study)
    fig = go.Figure()
    for ok, color in ((True, FEASIBLE), (False, INFEASIBLE)):
        sel = [t for t in trials if feasible(t) is ok]
        fig.add_trace(
            go.Scatter(
                x=[t.number for t in sel],
                y=[score_of(t) for t in sel],
                mode="markers",
                marker={"color": color},
                name="feasible" if ok else "infeasible",
                text=[str(t.user_attrs.get(Attr.REASON) or "")[:160] for t in sel],
            )
        )
    if best is not None:
        fig.add_trace(
            go.Scatter(
                x=[best.number],
                y=[score_of(best)],
                mode="markers",
                name="winner",
                marker={"symbol": "star", "size": 16, "color": WINNER},
            )
        )
    fig.update_layout(xaxis_title="trial", yaxis_title=cfg.objective.metric)
    return Chart(
        "history",
        f"{cfg.objective.metric} by trial",
        "Every completed trial; an infeasible one (start failed, died, SLO missed, rejected) "
        "scores 0 and says why on hover.",
        fig,
    )


def _metric(t: FrozenTrial, key: str) -> float | None:
    value = (t.user_attrs.get(Attr.METRICS) or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def ttft(cfg: StudyConfig, study: optuna.Study) -> Chart:
    """p99 TTFT against client concurrency, with the SLO line."""
    title = "p99 TTFT vs client concurrency"
    pts = [
        (t.params["concurrency"], v, t)
        for t in complete(study)
        # 0 ms is a measurement too (a fake server's, an idle queue's): only None is none
        if "concurrency" in t.params and (v := _metric(t, "p99_ttft_ms")) is not None
    ]
    if not pts:
        return Chart("ttft", title, "", note="no measured trial with a searched concurrency")
    fig = go.Figure(
        go.Scatter(
            x=[c for c, _, _ in pts],
            y=[v for _, v, _ in pts],
            mode="markers",
            marker={"color": [FEASIBLE if feasible(t) else INFEASIBLE for _, _, t in pts]},
            text=[f"trial {t.number}" for _, _, t in pts],
            name="trials",
        )
    )
    limit = cfg.objective.slo.p99_ttft_ms
    if limit:
        fig.add_hline(y=limit, line_dash="dash", annotation_text="p99 TTFT limit")
    fig.update_layout(xaxis_title="concurrency", yaxis_title="p99 TTFT (ms)", xaxis_type="log")
    about = "Concurrency beyond what the KV pool admits only builds a queue: TTFT climbs."
    return Chart("ttft", title, about, fig)


def importance(cfg: StudyConfig, study: optuna.Study) -> Chart:
    """optuna's PED-ANOVA importance of each searched parameter for the score."""
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import plot_param_importances

    title = "Parameter importance"
    if len(complete(study)) < 4:
        return Chart("importance", title, "", note="needs at least 4 completed trials")
    drawn = _quiet(
        lambda: plot_param_importances(
            study,
            evaluator=PedAnovaImportanceEvaluator(),
            target=score_of,
            target_name=cfg.objective.metric,
        )
    )
    about = (
        "optuna's PED-ANOVA: how much each parameter separates the best 10% of trials from the "
        "rest (infeasible trials score 0, so reaching feasibility counts)."
    )
    if isinstance(drawn, str):
        return Chart("importance", title, about, note=drawn)
    return Chart("importance", title, about, drawn)


def contour_pair(cfg: StudyConfig) -> list[str] | None:
    """mem-fraction-static x hicache-size when both are searched, else two searched server
    flags with numeric ranges (None: fewer than two)."""
    server = searched(cfg, server_only=True)
    mfs, hicache = _find(server, "mem-fraction-static"), _find(server, "hicache-size")
    if mfs and hicache:
        return [mfs, hicache]
    ranged = [k for k in server if cfg.space[k].low is not None]
    return ranged[:2] if len(ranged) >= 2 else None


def contour(cfg: StudyConfig, study: optuna.Study) -> Chart:
    from optuna.visualization import plot_contour

    pair = contour_pair(cfg)
    title = "Contour of two server flags"
    if pair is None:
        return Chart("contour", title, "", note="fewer than two server flags with ranges searched")
    title = f"Contour: {pair[0]} x {pair[1]}"
    drawn = _quiet(
        lambda: plot_contour(study, params=pair, target=score_of, target_name=cfg.objective.metric)
    )
    about = "optuna's contour of the score over the two flags (interpolated between trials)."
    if isinstance(drawn, str):
        return Chart("contour", title, about, note=drawn)
    return Chart("contour", title, about, _coarse(drawn))


def slices(cfg: StudyConfig, study: optuna.Study) -> Chart:
    from optuna.visualization import plot_slice

    drawn = _quiet(
        lambda: plot_slice(
            study, params=searched(cfg), target=score_of, target_name=cfg.objective.metric
        )
    )
    about = "optuna's slice plot: the score against each searched parameter, coloured by trial."
    if isinstance(drawn, str):
        return Chart("slices", "Slices", about, note=drawn)
    drawn.update_layout(height=380)
    return Chart("slices", "Slices", about, drawn)


def pareto(cfg: StudyConfig, study: optuna.Study) -> Chart:
    from optuna.visualization import plot_pareto_front

    title = "Pareto front"
    latency = cfg.objective.pareto_latency
    if latency is None or len(study.directions) != 2:
        return Chart("pareto", title, "", note="not a Pareto study (objective.pareto_latency)")
    drawn = _quiet(lambda: plot_pareto_front(study, target_names=[cfg.objective.metric, latency]))
    about = (
        f"optuna's Pareto front of {cfg.objective.metric} against {latency}; configurations "
        "that never ran (their latency a pessimistic 1e7 ms) are off the chart."
    )
    if isinstance(drawn, str):
        return Chart("pareto", title, about, note=drawn)
    ran = [t.values[1] for t in complete(study) if t.values[1] < PESSIMISTIC_LATENCY_MS]
    if ran:
        drawn.update_yaxes(range=[0, max(ran) * 1.1])
    return Chart("pareto", title, about, _short_hover(drawn))


def _short_hover(fig: go.Figure) -> go.Figure:
    """optuna's hover text is each trial as JSON, user attributes and all (KBs a point): keep
    its number, values and params."""
    for tr in fig.data:
        texts = getattr(tr, "text", None)
        if not texts or not isinstance(texts[0], str) or not texts[0].startswith("{"):
            continue
        short = []
        for text in texts:
            try:
                t = json.loads(text.replace("<br>", "\n"))
            except ValueError:
                short.append(text[:200])
                continue
            values = ", ".join(f"{v:,.1f}" for v in t.get("values") or [])
            params = "<br>".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
            short.append(f"trial {t.get('number')}: {values}<br>{params}")
        tr.text = short
    return fig


def _coarse(fig: go.Figure, keep: int = 40) -> go.Figure:
    """Thin optuna's 100 x 100 contour grid to `keep` x `keep` and round its values: the same
    picture in a tenth of the bytes (the report stays under 5 MB)."""
    for tr in fig.data:
        if tr.type != "contour" or tr.z is None:
            continue
        z = [list(row) for row in tr.z]
        step_y, step_x = max(1, len(z) // keep), max(1, len(z[0]) // keep if z else 1)
        rows = range(0, len(z), step_y)
        cols = range(0, len(z[0]) if z else 0, step_x)
        tr.z = [[_round(z[i][j]) for j in cols] for i in rows]
        if tr.x is not None:
            tr.x = [tr.x[j] for j in cols]
        if tr.y is not None:
            tr.y = [tr.y[i] for i in rows]
    return fig


def _round(v: Any) -> Any:
    return float(f"{v:.4g}") if isinstance(v, float) and v == v else v
