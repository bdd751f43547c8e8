"""`tuner tune --virtual`: the study's real loop on the simulator's engine in virtual time.

The virtual study and the real one (HTTP, the simulator as a process on this machine) propose
the same trials for the same seed and score them alike; a 40-trial virtual study ends with a
best.yaml; an interrupted virtual study resumes; a virtual study never mixes with a real one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers.studies import study_file, tuner
from tuner.api import Events, tune
from tuner.config.load import load_study
from tuner.errors import StudyMismatchError
from tuner.outcome import Attr, Status
from tuner.sim.virtual.study import virtual_seams
from tuner.verdict.trials import completed

pytestmark = pytest.mark.slow

#: how far one HTTP measurement may sit from the virtual one. The engine and its noise are the
#: same (2% per start); the HTTP server also runs in real time on a shared machine, where a
#: busy CPU slows its step loop, so the bound is loose on the low side only by that much more
AGREE = 0.25


def test_virtual_and_http_studies_propose_the_same_trials_and_agree(tmp_path: Path) -> None:
    cfg = load_study(study_file(tmp_path, name="agree", n_trials=3))
    real = tune(cfg, runs_dir=tmp_path / "http", seed=11)
    # both hosts read GPU memory as nvidia-smi would (the HTTP simulator's through its
    # simulated nvidia-smi): the edge probe jumps alike on both (search/ceiling.py)
    virtual = tune(cfg, runs_dir=tmp_path / "virtual", seed=11, make_seams=virtual_seams(11))
    a, b = completed(real.study), completed(virtual.study)
    assert [t.params for t in a] == [t.params for t in b]
    assert [t.user_attrs[Attr.STATUS] for t in a] == [t.user_attrs[Attr.STATUS] for t in b]
    assert a[0].user_attrs[Attr.STATUS] == Status.START_FAILED  # the baseline's mfs 0.98
    assert a[0].user_attrs[Attr.FAILURE] == b[0].user_attrs[Attr.FAILURE] == "oom_cuda_graph"
    measured = [(x, y) for x, y in zip(a, b, strict=True) if x.user_attrs[Attr.STATUS] == "ok"]
    assert measured
    for x, y in measured:
        http, virt = x.values[0], y.values[0]
        print(f"{x.params}: HTTP {http:,.0f}, virtual {virt:,.0f} ({http / virt - 1:+.1%})")
        assert abs(http - virt) <= AGREE * virt, (x.params, http, virt)
        info_x, info_y = x.user_attrs[Attr.SERVER_INFO], y.user_attrs[Attr.SERVER_INFO]
        # time held: the wall's on HTTP (a start is more than its 0.3 s of sleep), the virtual
        # clock's in virtual time (exactly --sim-startup-seconds); both load for the window
        spent_x, spent_y = x.user_attrs[Attr.SPENT], y.user_attrs[Attr.SPENT]
        assert spent_x["load_s"] >= 2.5 and spent_y["load_s"] == pytest.approx(2.5, abs=0.3)
        if x.user_attrs[Attr.RESTARTED]:  # else a reused server: nothing started
            assert spent_x["startup_s"] > 0.3 and spent_y["startup_s"] == 0.3
        if info_x.get("max_total_num_tokens"):
            assert info_x["max_total_num_tokens"] == info_y["max_total_num_tokens"]
    # the identity check keeps the two apart: a real study does not resume in virtual time
    with pytest.raises(StudyMismatchError, match="virtual time"):
        tune(
            cfg,
            runs_dir=tmp_path / "http",
            n_trials=10,
            seed=11,
            make_seams=virtual_seams(11),
        )


def test_inner_search_agrees_between_virtual_and_http(tmp_path: Path) -> None:
    """Inner mode: the same servers proposed, each searched on its running server; the best
    point of each scores alike (its concurrency may differ by a step where two score alike)."""
    study = study_file(tmp_path, name="agree-inner", n_trials=3, budget__inner_runs=3)
    data = yaml.safe_load(study.read_text())
    data["space"]["concurrency"]["search"] = "inner"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_study(study)
    real = tune(cfg, runs_dir=tmp_path / "http", seed=11)  # nvidia-smi on both hosts
    virtual = tune(cfg, runs_dir=tmp_path / "virtual", seed=11, make_seams=virtual_seams(11))
    a, b = completed(real.study), completed(virtual.study)
    assert [t.params for t in a] == [t.params for t in b]
    assert all("concurrency" not in t.params for t in a)
    measured = [(x, y) for x, y in zip(a, b, strict=True) if x.user_attrs[Attr.STATUS] == "ok"]
    assert measured
    for x, y in measured:
        assert 1 <= len(x.user_attrs[Attr.LOAD_POINTS]) <= 3 and x.user_attrs[Attr.CLIENT]
        http, virt = x.values[0], y.values[0]
        print(f"{x.params}: HTTP {http:,.0f} at {x.user_attrs[Attr.CLIENT]}, virtual {virt:,.0f}")
        assert abs(http - virt) <= AGREE * virt, (x.params, http, virt)


def test_a_virtual_40_trial_study_writes_best_yaml(tmp_path: Path) -> None:
    study = study_file(tmp_path, name="forty", n_trials=40)
    t0 = time.monotonic()
    out = tuner("tune", str(study), "--runs-dir", str(tmp_path / "runs"), "--virtual")
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    best = tmp_path / "runs" / "forty" / "best.yaml"
    assert best.exists() and "mem-fraction-static" in best.read_text()
    assert "(virtual time)" in best.read_text()  # the export says where it was measured
    done = completed(optuna.load_study(study_name="forty", storage=_db(tmp_path / "runs", "forty")))
    assert len(done) == 40
    assert done[0].user_attrs[Attr.STATUS] == Status.START_FAILED  # the baseline's mfs 0.98
    assert sum(bool(t.user_attrs.get(Attr.LAUNCHED)) for t in done) < 40  # probes reuse servers
    print(f"40-trial virtual study: {took:.1f} s wall (interpreter start included)")
    # the time each trial held its server is the virtual clock's: a start of 0.3 s
    # (--sim-startup-seconds), a 2.5 s window, though the whole study took seconds of wall
    # (a duplicate carries its original's status, not its time: it ran nothing)
    measured = [
        t
        for t in done
        if t.user_attrs[Attr.STATUS] in (Status.OK, Status.SLO_MISSED)
        and Attr.DUPLICATE_OF not in t.user_attrs
    ]
    assert measured
    for t in measured:
        spent = t.user_attrs[Attr.SPENT]
        assert spent["gpus"] == 1 and spent["load_s"] == pytest.approx(2.5, abs=0.3)
        if t.user_attrs[Attr.RESTARTED]:
            assert spent["startup_s"] == t.user_attrs[Attr.SERVER_INFO]["restart_s"] == 0.3
    # a duplicate ran nothing and records nothing: gpu_time counts it 0, and so does this
    server_s = sum((t.user_attrs.get(Attr.SPENT) or {}).get("server_s", 0.0) for t in done)
    status = tuner("status", str(study), "--runs-dir", str(tmp_path / "runs"), "--json")
    hours = json.loads(status.stdout)["gpu_hours"]
    assert hours["search"] == pytest.approx(server_s / 3600, abs=1e-3) and hours["confirmation"] > 0
    first = hours["first_within"]
    assert first is not None and 0 < first["gpu_hours"] <= hours["search"]


def test_an_interrupted_virtual_study_resumes(tmp_path: Path) -> None:
    cfg = load_study(study_file(tmp_path, name="resume", n_trials=6))
    runs = tmp_path / "runs"
    seen: list[int] = []

    def stop_after_three(trial: optuna.trial.FrozenTrial) -> None:
        seen.append(trial.number)
        if len(seen) == 3:
            raise KeyboardInterrupt  # as Ctrl-C between two trials

    with pytest.raises(KeyboardInterrupt):
        tune(
            cfg,
            runs_dir=runs,
            seed=5,
            events=Events(on_trial=stop_after_three),
            make_seams=virtual_seams(5),
        )
    first = optuna.load_study(study_name="resume", storage=_db(runs, "resume"))
    before = [t.params for t in completed(first)]
    assert len(before) == 3
    result = tune(cfg, runs_dir=runs, seed=5, make_seams=virtual_seams(5))
    done = completed(result.study)
    assert len(done) == 6 and [t.params for t in done[:3]] == before
    assert result.best_path is not None and result.best_path.exists()
    assert not result.recovered  # nothing was left running


def test_virtual_with_a_real_launch_is_one_line(tmp_path: Path) -> None:
    study = study_file(
        tmp_path, name="real", target__launch=["python", "-m", "sglang.launch_server"]
    )
    out = tuner("tune", str(study), "--runs-dir", str(tmp_path / "runs"), "--virtual")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "target.launch" in out.stderr
    assert "--virtual runs the simulator" in out.stderr
    assert not (tmp_path / "runs").exists()  # nothing written


def _db(runs: Path, name: str) -> str:
    return f"sqlite:///{runs / name / 'study.db'}"


def test_a_virtual_study_cuts_runs_that_cannot_win_and_exports_a_measured_one(
    tmp_path: Path,
) -> None:
    """budget.early_stop (search/cut.py) through `tuner tune --virtual`, status and report:
    runs that cannot beat the best end before their window and are recorded as cut; a server
    whose every run was cut is a `cut` trial holding a projection; the export names a trial
    that ran its window in full; the baseline's server spends less load time than with
    early_stop off."""
    spent = {}
    for early in (True, False):
        name = f"cut-{str(early).lower()}"
        study = study_file(
            tmp_path,
            name=name,
            n_trials=8,
            workload__duration_s=20,
            budget__early_stop=early,
            budget__confirm_top=0,
            baseline={"mem-fraction-static": 0.85},
        )
        data = yaml.safe_load(study.read_text())
        data["space"]["concurrency"]["search"] = "inner"
        study.write_text(yaml.safe_dump(data, sort_keys=False))
        runs = tmp_path / "runs"
        out = tuner("tune", str(study), "--runs-dir", str(runs), "--virtual")
        assert out.returncode == 0, out.stderr[-3000:]
        trials = completed(optuna.load_study(study_name=name, storage=_db(runs, name)))
        # the baseline's server (trial 0) is the same in both, and so are its runs' concurrencies
        spent[early] = trials[0].user_attrs[Attr.SPENT]["load_s"]
        points = [p for t in trials for p in t.user_attrs.get(Attr.LOAD_POINTS) or []]
        cut = [p for p in points if p["cut"]]
        if not early:
            assert not cut
            continue
        assert cut and all(not p["clear"] and "cannot beat" in p["reason"] for p in cut)
        best = yaml.safe_load((runs / name / "best.yaml").read_text())
        mfs = pytest.approx(best["mem-fraction-static"])
        winner = [t for t in trials if t.params["mem-fraction-static"] == mfs]
        assert any(t.user_attrs[Attr.STATUS] == Status.OK for t in winner)
        chosen = {int(t.user_attrs[Attr.CLIENT]["concurrency"]) for t in winner}
        ran_full = {
            p["concurrency"] for t in winner for p in t.user_attrs[Attr.LOAD_POINTS] if not p["cut"]
        }
        assert chosen <= ran_full
        status = tuner("status", str(study), "--runs-dir", str(runs))
        assert status.returncode == 0, status.stderr[-2000:]
        report = tuner("report", str(study), "--runs-dir", str(runs))
        assert report.returncode == 0, report.stderr[-2000:]
    print(f"the baseline's load seconds: early_stop on {spent[True]:.0f}, off {spent[False]:.0f}")
    assert spent[True] < spent[False]
