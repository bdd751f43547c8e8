"""The report's charts of what the runs measured beyond the score: the KV pool each start
reported against the pool the capacity formula projected, the spread of the confirmation runs,
and each trial's inner load search (when trials carry one).

The projection is the pre-check's own (`capacity.precheck.projected_tokens`), calibrated on the first
start that reported its pool, as the pre-check calibrates itself during the study; with
`hardware.weights_gib` a second line shows the projection before any start.
"""

from __future__ import annotations

from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial

from tuner.capacity.models import hardware_of
from tuner.capacity.precheck import Hardware, Knowledge, projected_tokens
from tuner.config.schema import StudyConfig
from tuner.errors import TunerError
from tuner.outcome import Attr
from tuner.report.figures import (
    FEASIBLE,
    INFEASIBLE,
    LOAD_POINTS_ATTR,
    PROJECTED,
    WINNER,
    Chart,
    complete,
    feasible,
    score_of,
)
from tuner.sglang.flags import effective_flags, full_name
from tuner.verdict.trials import all_confirmations
from tuner.verdict.winner import best_trial

MFS = "mem-fraction-static"


def _mfs_of(cfg: StudyConfig, t: FrozenTrial, info: dict[str, Any]) -> float | None:
    value = info.get("mem_fraction_static")
    if value is None:
        value = effective_flags({**cfg.server, **t.params}).get(MFS)
    return float(value) if isinstance(value, int | float) else None


def pool_points(cfg: StudyConfig, study: optuna.Study) -> list[tuple[float, int, FrozenTrial]]:
    """(mfs, max_total_num_tokens, trial) of every start that reported its pool, in order."""
    out = []
    for t in study.get_trials(deepcopy=False):
        info = t.user_attrs.get(Attr.SERVER_INFO) or {}
        tokens = info.get("max_total_num_tokens")
        mfs = _mfs_of(cfg, t, info)
        if isinstance(tokens, int) and tokens > 0 and mfs is not None:
            out.append((mfs, tokens, t))
    return out


def _hardware(cfg: StudyConfig) -> Hardware | None:
    try:
        return hardware_of(cfg)
    except TunerError:
        return None


def _grid(cfg: StudyConfig, seen: list[float]) -> list[float]:
    spec = next((s for k, s in cfg.space.items() if full_name(k) == MFS), None)
    low = min([*seen, *([spec.low] if spec and spec.low is not None else [])])
    high = max([*seen, *([spec.high] if spec and spec.high is not None else [])])
    n = 40
    return [low + (high - low) * i / n for i in range(n + 1)] if high > low else [low]


def pool(cfg: StudyConfig, study: optuna.Study) -> Chart:
    """Projected vs measured max_total_num_tokens by mem-fraction-static."""
    title = "KV pool: projected vs measured max_total_num_tokens by mem-fraction-static"
    pts = pool_points(cfg, study)
    if not pts:
        return Chart("pool", title, "", note="no start reported its pool (max_total_num_tokens)")
    fig = go.Figure(
        go.Scatter(
            x=[m for m, _, _ in pts],
            y=[n for _, n, _ in pts],
            mode="markers",
            name="measured (the server's own)",
            marker={"color": WINNER, "size": 9},
            text=[f"trial {t.number}" for _, _, t in pts],
        )
    )
    hw = _hardware(cfg)
    note = ""
    if hw is None or not hw.gpu_mem_mib or not hw.bytes_per_token:
        note = "no projection: hardware.gpu_mem_mib and hardware.model_config give it"
    else:
        grid = _grid(cfg, [m for m, _, _ in pts])
        first = pts[0]
        lines = [(f"projected, calibrated on trial {first[2].number}", (first[1], first[0]))]
        if hw.weights_gib is not None:
            lines.append(("projected from hardware.weights_gib", None))
        for name, calibration in lines:
            know = Knowledge(calibration=calibration)
            ys = [projected_tokens({MFS: m}, hw, know) for m in grid]
            fig.add_trace(
                go.Scatter(
                    x=grid,
                    y=ys,
                    mode="lines",
                    name=name,
                    line={"color": PROJECTED, "dash": "dash" if calibration else "dot"},
                )
            )
    fig.update_layout(xaxis_title=MFS, yaxis_title="max_total_num_tokens")
    about = (
        "The pool grows by delta-mfs x free GPU memory / bytes per token: measured points off "
        "the line mean another flag (chunked prefill, CUDA graphs, HiCache) took memory too."
    )
    return Chart("pool", title, about, fig, note)


def confirmations(cfg: StudyConfig, study: optuna.Study) -> Chart:
    """The first run and every confirmation run of each confirmed configuration."""
    title = "Confirmation spread"
    confirmed = all_confirmations(study)
    if not confirmed:
        return Chart("confirm", title, "", note="no configuration was confirmed yet")
    best, _ = best_trial(study)
    fig = go.Figure()
    trials = study.get_trials(deepcopy=False)
    for number, runs in sorted(confirmed.items(), key=lambda kv: int(kv[0])):
        t = trials[int(number)]
        values = [score_of(t), *runs]
        tag = " (winner)" if best is not None and best.number == t.number else ""
        fig.add_trace(
            go.Box(
                y=values,
                name=f"trial {number}{tag}",
                boxpoints="all",
                pointpos=0,
                boxmean=True,
                marker={"color": WINNER if tag else FEASIBLE},
            )
        )
    fig.update_layout(yaxis_title=cfg.objective.metric, showlegend=False)
    about = "The winner is the best mean over its runs; the spread is run-to-run noise."
    return Chart("confirm", title, about, fig)


def load_search(cfg: StudyConfig, study: optuna.Study) -> Chart:
    """Each trial's inner load search: score and p99 TTFT against concurrency, with the SLO."""
    title = "Inner load search of each trial"
    carrying = [t for t in complete(study) if t.user_attrs.get(LOAD_POINTS_ATTR)]
    if not carrying:
        return Chart(
            "load_search",
            title,
            "",
            note="no trial carries an inner load search (each trial measures one concurrency "
            "today; the p99 TTFT vs concurrency chart shows those points)",
        )
    fig = go.Figure()
    for t in carrying:
        pts = sorted(t.user_attrs[LOAD_POINTS_ATTR], key=lambda p: p.get("concurrency", 0))
        color = FEASIBLE if feasible(t) else INFEASIBLE
        xs = [p.get("concurrency") for p in pts]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[p.get(cfg.objective.metric, p.get("score")) for p in pts],
                name=f"trial {t.number}",
                mode="lines+markers",
                line={"color": color},
                # a cut run's value is its projection (search/cut.py), not a measured score
                marker={"symbol": ["circle-open" if p.get("cut") else "circle" for p in pts]},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[p.get("p99_ttft_ms") for p in pts],
                name=f"trial {t.number} p99 TTFT",
                mode="lines",
                line={"color": color, "dash": "dot"},
                yaxis="y2",
            )
        )
    limit = cfg.objective.slo.p99_ttft_ms
    if limit:
        fig.add_hline(y=limit, line_dash="dash", annotation_text="p99 TTFT limit", yref="y2")
    fig.update_layout(
        xaxis_title="concurrency",
        yaxis_title=cfg.objective.metric,
        yaxis2={"title": "p99 TTFT (ms)", "overlaying": "y", "side": "right"},
    )
    about = "A hollow marker is a run cut early: its projection, not a measured score."
    return Chart("load_search", title, about, fig)
