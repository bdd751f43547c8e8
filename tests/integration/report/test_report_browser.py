"""`tuner report` in a real headless browser (Debian's chromium), the network closed: every
chart draws, the page is not blank, the file stays under 5 MB and names no URL of its own.

The study is built through tuner's own `Tuning.report` (the attributes and constraints a real
study stores) from a seeded model of a server, so the test needs no GPU and takes seconds: a
Pareto study searching mfs x hicache-size x concurrency, some starts failing at high mfs, two
trials carrying an inner load search, and confirmation runs.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from tests.helpers.browser import chromium, png_pixels, render
from tests.helpers.studies import REPO
from tuner.config.load import load_study
from tuner.outcome import Status, failed_outcome, measured_outcome
from tuner.report.figures import LOAD_POINTS_ATTR
from tuner.report.page import CHARTS, plotly_js, write_html
from tuner.search.space import distributions
from tuner.study.loop import Tuning
from tuner.verdict.trials import CONFIRM_ATTR
from tuner.verdict.winner import best_trial

pytestmark = pytest.mark.slow

#: the report's budget, measured by the test (plotly.js alone is about 4.8 MB)
MAX_BYTES = 5_000_000
ALL_CHARTS = (
    "history",
    "importance",
    "contour",
    "slices",
    "pareto",
    "ttft",
    "pool",
    "confirm",
    "load_search",
)


def model_study(tmp_path: Path, n: int = 60) -> tuple:
    """A Pareto study of `n` trials from a seeded model of a server."""
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data.update(study="report", baseline=None)
    data["space"] = {
        "mem-fraction-static": {"low": 0.80, "high": 0.98, "step": 0.01},
        "hicache-size": {"low": 0, "high": 160, "step": 20},
        "concurrency": {"low": 8, "high": 256, "log": True, "search": "joint"},
    }
    data["objective"]["pareto_latency"] = "p99_ttft_ms"
    path = tmp_path / "report.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_study(path)
    study = optuna.create_study(
        study_name="report",
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.RandomSampler(seed=3),
    )
    tuning = Tuning(cfg, study, None, tmp_path / "trials", worker="w")  # type: ignore[arg-type]
    rng = random.Random(5)
    for i in range(n):
        trial = study.ask(distributions(cfg.space))
        p = trial.params
        mfs, conc, hicache = p["mem-fraction-static"], p["concurrency"], p["hicache-size"]
        if mfs >= 0.96:
            outcome = failed_outcome(
                cfg.objective,
                Status.START_FAILED,
                "Capture cuda graph failed: CUDA out of memory",
                "oom_cuda_graph",
                restarted=True,
                launched=True,
            )
        else:
            tokens = int((mfs * 79.6 - 15.5) * 2**30 / 131072)
            admitted = min(conc, tokens / 1200)
            tput = admitted * 42 * (1 + hicache / 500) * rng.uniform(0.95, 1.05)
            ttft = 250 + max(0.0, conc - admitted) * 45 + rng.uniform(0, 50)
            metrics = {
                "window_output_throughput": tput,
                "output_throughput": tput * 0.9,
                "p99_ttft_ms": ttft,
                "error_rate": 0.0,
                "completed": 100,
            }
            info = {"max_total_num_tokens": tokens, "mem_fraction_static": mfs}
            outcome = measured_outcome(
                cfg.objective,
                metrics,
                client_lagged=False,
                server_info=info,
                restarted=True,
                launched=True,
            )
            if i in (4, 9):
                points = [
                    {
                        "concurrency": c,
                        "window_output_throughput": min(c, admitted) * 42,
                        "p99_ttft_ms": 250 + max(0.0, c - admitted) * 45,
                    }
                    for c in (8, 32, 64, 128, 256)
                ]
                trial.set_user_attr(LOAD_POINTS_ATTR, points)
        study.tell(trial, tuning.report(trial, outcome))
    best, _ = best_trial(study)
    assert best is not None
    runs = [best.values[0] * f for f in (0.97, 1.01)]
    study.set_user_attr(f"{CONFIRM_ATTR}:w", {str(best.number): runs})
    return cfg, study


def test_the_report_charts_are_all_there_and_its_size_is_bounded(tmp_path: Path) -> None:
    cfg, study = model_study(tmp_path)
    assert tuple(draw.__name__ for draw in CHARTS) == (
        "history",
        "importance",
        "contour",
        "slices",
        "pareto",
        "ttft",
        "pool",
        "confirmations",
        "load_search",
    )
    page = write_html(cfg, study, tmp_path / "report.html")
    size = page.stat().st_size
    assert size < MAX_BYTES, f"{size:,} bytes"
    text = page.read_text()
    js = plotly_js()
    assert text.count(js) == 1  # plotly.js once, as plotly ships it (minified)
    own = text.replace(js, "")
    assert not re.findall(r"https?://", own)  # no URL of ours; plotly.js keeps its constants
    for key in ALL_CHARTS:
        assert f"<div id='fig-{key}' class='chart'>" in own, key
    assert "Winner: trial" in own


@pytest.mark.skipif(
    chromium() is None,
    reason="Debian's chromium is not installed here (.ci/run installs it: apt-get install chromium)",
)
def test_the_report_renders_offline_in_headless_chromium(tmp_path: Path) -> None:
    cfg, study = model_study(tmp_path, n=30)
    page = write_html(cfg, study, tmp_path / "report.html")
    shot, dom = render(page, tmp_path, width=1000, height=900)
    # every chart drew: plotly marks its div and draws SVG into it; the page counted them
    assert re.search(rf'data-charts-rendered="{len(ALL_CHARTS)}"', dom), dom[-2000:]
    for key in ALL_CHARTS:
        m = re.search(rf'<div id="fig-{key}" class="([^"]*)"', dom)
        assert m and "js-plotly-plot" in m.group(1), key
    assert dom.count('class="main-svg"') >= len(ALL_CHARTS)
    # the screenshot is a page, not a blank: many colours, none covering nearly everything
    width, height, px = png_pixels(shot)
    colours, counts = np.unique(px.reshape(-1, px.shape[2]), axis=0, return_counts=True)
    assert (width, height) == (1000, 900)
    assert len(colours) > 50 and counts.max() / counts.sum() < 0.97, (len(colours), counts.max())
