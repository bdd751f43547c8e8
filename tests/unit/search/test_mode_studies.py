"""Whole studies in virtual time in each concurrency mode: inner (the default for a range),
joint (concurrency sampled with the server flags), and a fixed concurrency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.helpers.paths import REPO
from tuner.api import tune
from tuner.config.load import parse_study
from tuner.errors import ConfigError
from tuner.outcome import Attr, Status
from tuner.report.export import export_data
from tuner.report.runs import load_search
from tuner.search.mode import search_mode
from tuner.sim.virtual.study import virtual_seams
from tuner.verdict.trials import completed


def demo(**space: Any) -> dict[str, Any]:
    """The demo made cheap: short prompts and windows, no confirmation."""
    d = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    d["target"]["launch"] = ["{python}", "-m", "tuner.sim", "--sim-profile", "llama-3.1-8b-h100"]
    d["space"]["concurrency"] = {"low": 4, "high": 128, "log": True, **space}
    d["baseline"] = {"mem-fraction-static": 0.85, "concurrency": 16}
    d["workload"].update(input_len=256, output_len=32, duration_s=2)
    d["objective"]["slo"]["p99_ttft_ms"] = 1000
    d["budget"].update(confirm_top=1, confirm_repeats=1, inner_runs=4)
    return d


def run(tmp_path: Path, data: dict[str, Any], n: int = 4) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    cfg = parse_study(data, "d.yaml")
    return tune(cfg, runs_dir=tmp_path, seed=3, n_trials=n, make_seams=virtual_seams(3)).study


def test_inner_mode_searches_concurrency_on_each_server_and_exports_it(tmp_path: Path) -> None:
    data = demo()
    cfg = parse_study(data, "d.yaml")
    assert search_mode(cfg) == "inner"  # the default for a concurrency range
    study = run(tmp_path, data)
    done = completed(study)
    assert len(done) == 4
    assert all("concurrency" not in t.params for t in done)  # the sampler proposes servers
    measured = [
        t
        for t in done
        if t.user_attrs[Attr.STATUS] == Status.OK and Attr.DUPLICATE_OF not in t.user_attrs
    ]
    assert measured
    for t in measured:
        points = t.user_attrs[Attr.LOAD_POINTS]
        assert 1 <= len(points) <= 4  # budget.inner_runs
        # a point clear of the SLO limits by innertrial.SLO_MARGIN (the one the study's pooled
        # curve ranks best: search/test_curve.py), else the best that held; valued as measured
        clear = [p for p in points if p["clear"]]
        pool = clear or [max((p for p in points if p["feasible"]), key=lambda p: p["value"])]
        best = next(p for p in pool if p["concurrency"] == t.user_attrs[Attr.CLIENT]["concurrency"])
        assert t.values[0] == pytest.approx(best["value"], rel=1e-3)
        saved = json.loads(
            (tmp_path / cfg.study / "trials" / str(t.number) / "points.json").read_text()
        )
        assert saved["best"] == best["concurrency"] and len(saved["points"]) == len(points)
    # no restart beyond one per trial: every point ran on the trial's own server
    assert sum(bool(t.user_attrs.get(Attr.LAUNCHED)) for t in done) <= len(done)
    chart = load_search(cfg, study)  # the report draws every trial's points
    assert chart.figure is not None and not chart.note
    data_out = export_data(cfg, study)
    winner = study.trials[data_out["trial"]]
    assert data_out["client"] == winner.user_attrs[Attr.CLIENT]  # the recommended concurrency
    assert "concurrency" not in data_out["flags"]


def test_joint_mode_samples_concurrency_and_probes_as_before(tmp_path: Path) -> None:
    study = run(tmp_path, demo(search="joint"))
    done = completed(study)
    assert len(done) == 4
    assert all("concurrency" in t.params for t in done)
    assert not any(Attr.LOAD_POINTS in t.user_attrs for t in done)
    assert any(Attr.PROBE_OF in t.user_attrs for t in done)  # a neighbour on a live server


def test_a_fixed_concurrency_study_completes(tmp_path: Path) -> None:
    data = demo()
    data["space"]["concurrency"] = {"choices": [24]}
    data["baseline"]["concurrency"] = 24
    cfg = parse_study(data, "d.yaml")
    assert search_mode(cfg) == "joint"  # one choice: nothing for an inner search to find
    done = completed(run(tmp_path, data, n=3))
    assert len(done) == 3 and all(t.params["concurrency"] == 24 for t in done)


def test_search_is_refused_where_it_cannot_work() -> None:
    data = demo()
    data["space"]["mem-fraction-static"]["search"] = "inner"
    with pytest.raises(ConfigError, match=r"space\.mem-fraction-static\.search"):
        parse_study(data, "d.yaml")
    data = demo(search="inner")
    data["space"]["concurrency"] = {"choices": [8, 16], "search": "inner"}
    with pytest.raises(ConfigError, match="integer range"):
        parse_study(data, "d.yaml")
    data = demo(search="bogus")
    with pytest.raises(ConfigError, match=r"space\.concurrency\.search"):
        parse_study(data, "d.yaml")


def test_a_trial_timeout_too_short_for_the_inner_runs_is_warned_about(tmp_path: Path) -> None:
    from tuner.api import Events
    from tuner.check.reading import trial_time
    from tuner.search.mode import trial_time_problem

    d = demo()
    d["workload"]["duration_s"] = 30
    d["budget"].update(trial_timeout="2m", inner_runs=5)  # 5 runs of ~38 s do not fit 120 s
    cfg = parse_study(d, "short.yaml")
    problem = trial_time_problem(cfg)
    assert problem is not None and "holds about 3 of the inner search's 5 load runs" in problem
    assert trial_time(cfg).status == "warn"
    said: list[str] = []
    tune(
        cfg,
        runs_dir=tmp_path,
        n_trials=1,
        events=Events(on_message=said.append),
        make_seams=virtual_seams(0),
    )
    assert any(s.startswith("warning: budget.trial_timeout 120 s") for s in said), said
    # enough time, a fixed concurrency, or a count-bound run: nothing to say
    d["budget"]["trial_timeout"] = "4m"
    assert trial_time_problem(parse_study(d, "long.yaml")) is None
    d["space"]["concurrency"] = {"choices": [8, 16]}
    assert trial_time_problem(parse_study(d, "joint.yaml")) is None


def test_a_resumed_run_does_not_replay_the_seeds_first_proposals(tmp_path: Path) -> None:
    """Each run of `tune` builds its sampler from the study file's seed; a resumed one that
    replayed the seed's first random draws would re-propose the first trials as duplicates
    (answered from the record, but counted toward n_trials: restarts the budget never runs)."""
    data = demo()
    data["sampler"]["n_startup_trials"] = 8  # every proposal below is a seeded random draw
    first = [t.params for t in completed(run(tmp_path, data, n=3))]
    assert len(first) == 3
    resumed = run(tmp_path, data, n=6)
    done = completed(resumed)
    assert len(done) == 6
    mfs = [round(t.params["mem-fraction-static"], 2) for t in done]
    # trial 0 is the enqueued baseline, 1-2 the seed's first draws; 3-5 must be new draws (a
    # chance repeat of one value among 19 is a sampler's right, the same sequence is a replay)
    assert mfs[3:5] != mfs[1:3], mfs
    fresh = run(tmp_path / "again", data, n=3)  # a fresh study: the seed as given
    assert [t.params for t in completed(fresh)] == first


def test_a_resumed_run_starts_its_searches_where_the_study_found_its_best(tmp_path: Path) -> None:
    """The inner search's memory (the best concurrency so far, the pooled curve) is the
    study's, not the process's: a resumed run's first search starts at the concurrency of the
    best trial before it, as the next search of an unbroken run would."""
    data = demo(high=1024)  # the capacity model's start (the top) is not the best
    first = completed(run(tmp_path, data, n=3))
    best = max(
        (
            t
            for t in first
            if t.user_attrs.get(Attr.CLIENT) and Attr.DUPLICATE_OF not in t.user_attrs
        ),
        key=lambda t: t.values[0],
    )
    done = completed(run(tmp_path, data, n=4))
    new = [t for t in done if t.number >= 3 and Attr.DUPLICATE_OF not in t.user_attrs]
    assert new and new[0].user_attrs[Attr.LOAD_POINTS]
    assert (
        new[0].user_attrs[Attr.LOAD_POINTS][0]["concurrency"]
        == best.user_attrs[Attr.CLIENT]["concurrency"]
    )


def test_a_finished_study_run_again_neither_confirms_nor_says_it_does(tmp_path: Path) -> None:
    from tuner.api import Events

    data = demo()
    cfg = parse_study(data, "d.yaml")
    said: list[list[str]] = []
    for _ in range(2):
        said.append([])
        events = Events(on_message=said[-1].append)
        tune(cfg, runs_dir=tmp_path, seed=3, n_trials=3, make_seams=virtual_seams(3), events=events)
    assert any(m.startswith("confirming the best") for m in said[0])
    assert not any(m.startswith("confirming") for m in said[1]), said[1]
