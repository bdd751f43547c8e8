"""`tuner report`: one self-contained, offline HTML page explaining a study and its winner.

The page embeds plotly.js once, inline, exactly as the plotly package ships it (minified), and
each chart as its JSON plus one `Plotly.newPlot` call: it opens from a file with no network,
and references no URL of its own (plotly.js keeps its own string constants, e.g. the SVG
namespace `http://www.w3.org/2000/svg`, which name nothing to fetch). When every chart has
drawn, the page sets `data-charts-rendered` on <body> to the number drawn (a headless browser
test waits for it). Charts (tuner/report/figures.py, tuner/report/runs.py): the score by trial,
p99 TTFT vs concurrency, parameter importance, a contour of two server flags, slices, the
Pareto front (pareto mode), projected vs measured KV pool by mfs, the confirmation spread and
each trial's inner load search; a chart that cannot be drawn yet says why instead.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import optuna

from tuner.config.schema import StudyConfig
from tuner.outcome import Attr, is_feasible
from tuner.report.export import write_atomic
from tuner.report.figures import TEMPLATE, Chart, contour, history, importance, pareto, slices, ttft
from tuner.report.runs import confirmations, load_search, pool
from tuner.verdict.gpuhours import gpu_time
from tuner.verdict.winner import best_trial, held_note
from tuner.watch.events import param_text

#: plotly's config for every chart: no logo, no link out
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
#: the order of the report's sections
CHARTS = (history, importance, contour, slices, pareto, ttft, pool, confirmations, load_search)

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
    "h2{margin-top:1.6em;border-bottom:1px solid #ddd}p.about{color:#555}p.note{color:#888;"
    "font-style:italic}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid "
    "#ccc;padding:3px 6px;text-align:left}"
    ".chart{min-height:420px}"
)
#: after every chart drew (Plotly.newPlot returns a promise), say so on <body>
_DONE = (
    "Promise.all(window.tunerCharts).then(function(){"
    "document.body.setAttribute('data-charts-rendered', String(window.tunerCharts.length));});"
)


def plotly_js() -> str:
    """plotly.min.js as the plotly package ships it."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def charts(cfg: StudyConfig, study: optuna.Study) -> list[Chart]:
    return [draw(cfg, study) for draw in CHARTS]


def _figure_json(chart: Chart) -> str:
    import plotly.io as pio

    fig = chart.figure
    assert fig is not None
    fig.update_layout(template=TEMPLATE)
    if not fig.layout.title.text:
        fig.update_layout(title=None)
    text = pio.to_json(fig, validate=False, pretty=False)
    return text.replace("</", "<\\/")  # a string in the JSON never closes the script


def _section(chart: Chart) -> tuple[str, str | None]:
    """The section's HTML and its chart's script (None without a figure)."""
    about = f"<p class='about'>{html.escape(chart.about)}</p>" if chart.about else ""
    note = f"<p class='note'>{html.escape(chart.note)}</p>" if chart.note else ""
    if chart.figure is None:
        return f"<h2>{html.escape(chart.title)}</h2>{about}{note}", None
    div = f"<div id='fig-{chart.key}' class='chart'></div>"
    script = (
        f"(function(){{var f={_figure_json(chart)};window.tunerCharts.push("
        f"Plotly.newPlot('fig-{chart.key}',f.data,f.layout,{json.dumps(PLOT_CONFIG)}));}})();"
    )
    return f"<h2>{html.escape(chart.title)}</h2>{about}{div}{note}", script


def verdict(cfg: StudyConfig, study: optuna.Study) -> str:
    best, summary = best_trial(study)
    spent = gpu_time(study.get_trials(deepcopy=False), study.user_attrs, summary.get("mean"))
    gpu = f"<p class='gpu-hours'>{html.escape(spent.text())}</p>"
    if best is None:
        return "<p><b>No feasible configuration yet.</b></p>" + gpu
    runs = summary["runs"]
    spread = f", spread {summary['spread_pct']:.1f}%" if len(runs) > 1 else ""
    return (
        f"<p><b>Winner: trial {best.number}</b> ({html.escape(param_text(best.params))}): "
        f"{summary['mean']:,.1f} {html.escape(cfg.objective.metric)}, mean of {len(runs)} "
        f"run{'s' if len(runs) != 1 else ''}{spread}{html.escape(held_note(summary))}.</p>{gpu}"
    )


def write_html(cfg: StudyConfig, study: optuna.Study, path: Path) -> Path:
    """Write the report to `path` atomically (parents created): a failed write leaves the
    previous report whole, and is one line (InfraError); returns `path`."""
    page = render(cfg, study)
    write_atomic(path, lambda to: to.write_text(page))
    return path


def render(cfg: StudyConfig, study: optuna.Study) -> str:
    """The whole page as one HTML string."""
    sections, scripts = [], []
    for chart in charts(cfg, study):
        body, script = _section(chart)
        sections.append(body)
        if script:
            scripts.append(script)
    title = html.escape(f"tuner study {cfg.study}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{title}</h1>"
        f"<p>{html.escape(cfg.description)}</p>{verdict(cfg, study)}"
        f"{''.join(sections)}{trials_table(cfg, study)}"
        f"<script>{plotly_js()}</script>"
        f"<script>window.tunerCharts=[];{''.join(scripts)}{_DONE}</script></body></html>"
    )


def _cell(v: Any, spec: str = ",.1f") -> str:
    return "" if v is None else html.escape(format(v, spec))


def trials_table(cfg: StudyConfig, study: optuna.Study) -> str:
    """Every trial: state, params, score, p99 TTFT, reason; the winner marked."""
    best, _ = best_trial(study)
    head = "".join(
        f"<th>{h}</th>"
        for h in ("trial", "state", "params", cfg.objective.metric, "p99 TTFT ms", "reason")
    )
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        m = a.get(Attr.METRICS) or {}
        state = a.get(Attr.STATUS) or t.state.name.lower()
        if Attr.DUPLICATE_OF in a:
            state += f" (= trial {a[Attr.DUPLICATE_OF]})"
        if t.state.name == "COMPLETE" and not is_feasible(t.constraints):
            state += ", infeasible"
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
        won = best is not None and t.number == best.number
        cells = (
            f"<b>{t.number} (winner)</b>" if won else str(t.number),
            html.escape(state),
            html.escape(param_text(params)),
            _cell(t.values[0] if t.values else None),
            _cell(m.get("p99_ttft_ms") if m else None, ",.0f"),
            html.escape(str(a.get(Attr.REASON) or a.get(Attr.INFRA_ERROR) or "")),
        )
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<h2>Trials</h2><table><tr>{head}</tr>{''.join(rows)}</table>"
