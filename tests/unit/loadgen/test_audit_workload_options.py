"""Audit findings 1, 2, 3b, 9, 11, 12, 22: workload options that were accepted and then ignored
or applied differently from the docs (client concurrency, the load window, the error budget,
the baseline's concurrency, ignored keys, the concurrency grid, a shared storage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.helpers.paths import REPO
from tuner.api import Events, tune
from tuner.config.load import parse_study
from tuner.config.schema import BudgetSection
from tuner.config.space import ParamSpec
from tuner.config.workload import WorkloadSection
from tuner.errors import ConfigError
from tuner.loadgen.metrics import RequestRecord
from tuner.loadgen.result import LoadResult
from tuner.loadgen.workload import request_tokens, requests_for
from tuner.outcome import Status, measured_outcome
from tuner.search.inner import Bounds, Point, search
from tuner.search.mode import search_mode
from tuner.sim.virtual.study import virtual_seams
from tuner.study.callbacks import ProbeConcurrency
from tuner.trial.inner import bounds
from tuner.trial.runner import score_load

# the new names are imported in the tests that use them, so that every test of this file runs
# (and fails on its own assertion) against the code before the fixes

optuna.logging.set_verbosity(optuna.logging.WARNING)
LAUNCH = ["{python}", "-m", "tuner.sim", "--sim-profile", "llama-3.1-8b-h100"]


def study(**changes: Any) -> dict[str, Any]:
    """The demo study, cheap: short prompts, a 4 s window, one trial, no confirmation."""
    d = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    d["target"]["launch"] = LAUNCH
    d["workload"].update({"input_len": 256, "output_len": 32, "duration_s": 4})
    d["budget"] = {"n_trials": 1, "confirm_top": 0, "inner_runs": 3}
    for key, value in changes.items():
        node = d
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return d


def run_virtual(tmp_path: Path, data: dict[str, Any], **kw: Any) -> tuple[Any, list[str]]:
    said: list[str] = []
    cfg = parse_study(data, source="s.yaml")
    result = tune(
        cfg,
        runs_dir=tmp_path / "runs",
        events=Events(on_message=said.append),
        make_seams=virtual_seams(0),
        **kw,
    )
    return result, said


def metrics_of(tmp_path: Path, name: str, trial: int = 0) -> dict[str, Any]:
    return json.loads(
        (tmp_path / "runs" / name / "trials" / str(trial) / "metrics.json").read_text()
    )


# --- 1: the client's concurrency when the space does not search it --------------------------


def test_a_fixed_concurrency_is_set_by_workload_concurrency(tmp_path: Path) -> None:
    data = study(**{"space.concurrency": None, "baseline.concurrency": None})
    data["workload"]["concurrency"] = 24
    result, _ = run_virtual(tmp_path, data)
    m = metrics_of(tmp_path, "demo-sim")
    assert m["max_concurrency"] == 24
    assert m["concurrency"] > 8  # the old client ran one request at a time
    assert "recommended client: concurrency 24" in (result.best_yaml or "")


def test_a_request_rate_without_concurrency_is_not_capped_at_one(tmp_path: Path) -> None:
    data = study(**{"space.concurrency": None, "baseline.concurrency": None})
    data["workload"]["request_rate"] = 20
    run_virtual(tmp_path, data)
    m = metrics_of(tmp_path, "demo-sim")
    assert m["max_concurrency"] is None  # bench_serving's "no cap"
    assert m["request_throughput"] > 12  # at concurrency 1 it delivered ~1.5 req/s


def test_neither_concurrency_nor_rate_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    from tuner.loadgen.plan import unset_concurrency

    cfg = parse_study(study(**{"space.concurrency": None, "baseline.concurrency": None}), "s.yaml")
    assert unset_concurrency(cfg) is not None
    with pytest.raises(ConfigError, match=r"^s\.yaml: workload\.concurrency: the study does not"):
        tune(cfg, runs_dir=tmp_path / "runs", make_seams=virtual_seams(0))
    assert not (tmp_path / "runs").exists()


def test_workload_concurrency_beside_a_searched_one_is_refused() -> None:
    data = study()
    data["workload"]["concurrency"] = 8
    with pytest.raises(ConfigError, match=r"workload\.concurrency: concurrency is also searched"):
        parse_study(data, "s.yaml")
    data["workload"]["concurrency"] = 0
    data["space"].pop("concurrency")
    data["baseline"].pop("concurrency")
    with pytest.raises(ConfigError, match=r"workload\.concurrency: must be in 1\.\."):
        parse_study(data, "s.yaml")


def test_a_searched_concurrency_wins_and_a_rate_alone_has_no_cap() -> None:
    from tuner.loadgen.plan import study_load_options

    cfg = parse_study(study(), "s.yaml")
    assert study_load_options(cfg, {"concurrency": 40}, max_loop_lag_ms=50).concurrency == 40
    data = study(**{"space.concurrency": None, "baseline.concurrency": None})
    data["workload"]["request_rate"] = 5
    cfg = parse_study(data, "s.yaml")
    assert study_load_options(cfg, {}, max_loop_lag_ms=50).concurrency is None


# --- 2: a window's run does not end when its list runs out ----------------------------------


def test_a_short_request_list_is_topped_up_for_the_whole_window(tmp_path: Path) -> None:
    data = study(**{"space.concurrency": {"choices": [16]}, "baseline.concurrency": 16})
    data["workload"].update({"input_len": 100, "output_len": 16, "num_requests": None})
    data["workload"]["duration_s"] = 20
    run_virtual(tmp_path, data)
    m = metrics_of(tmp_path, "demo-sim")
    assert m["stopped"] == "duration" and m["duration"] == pytest.approx(20, rel=0.01)
    assert m["completed"] > 2000  # more than the prebuilt list held


def test_more_requests_are_seeded_and_numbered_after_the_list() -> None:
    from tuner.loadgen.workload import more_requests

    w = WorkloadSection(kind="multi-turn", input_len=20, output_len=4, turns=3, question_len=5)
    first = requests_for(w, num_requests=30)
    more = more_requests(w, 30, 12)
    assert more == more_requests(w, 30, 12)  # the same run gets the same requests
    assert min(r.index for r in more) == 30 and len({r.index for r in more}) == len(more)
    assert not {r.conversation for r in first} & {r.conversation for r in more}
    assert more_requests(WorkloadSection(kind="shared-prefix"), 30, 12) == []


def test_a_finite_list_is_flagged_exhausted_and_warned(tmp_path: Path) -> None:
    data = study()
    data["workload"] = {
        **{"kind": "shared-prefix", "num_groups": 4, "prompts_per_group": 4},
        **{"prefix_len": 256, "question_len": 32, "output_len": 32, "duration_s": 10},
    }
    _, said = run_virtual(tmp_path, data)
    m = metrics_of(tmp_path, "demo-sim")
    assert m["exhausted"] is True and m["duration"] < 10
    assert any("kind shared-prefix has 16 requests" in s for s in said)  # before the night
    assert any("(exhausted)" in s for s in said)  # and when it happened


def test_shared_prefix_count_above_its_prompts_is_refused() -> None:
    data = study()
    data["workload"] = {"kind": "shared-prefix", "num_groups": 2, "prompts_per_group": 4}
    data["workload"]["num_requests"] = 9
    with pytest.raises(ConfigError, match=r"workload\.num_requests: \(9\) is more than the 8"):
        parse_study(data, "s.yaml")


# --- 3b: the error budget ---------------------------------------------------------------------


def test_the_client_error_budget_is_never_stricter_than_the_slo() -> None:
    from tuner.loadgen.plan import error_budget, study_load_options

    data = study()
    data["objective"]["slo"]["max_error_rate"] = 0.2
    cfg = parse_study(data, "s.yaml")
    assert error_budget(cfg) == 0.2
    assert study_load_options(cfg, {"concurrency": 8}, max_loop_lag_ms=50).max_error_rate == 0.2


def _rec(i: int, ok: bool, cancelled: bool = False) -> RequestRecord:
    error = None if ok else ("cancelled" if cancelled else "http 500")
    return RequestRecord(i, ok, 10, 5, 0.0, 1.0, 0.1, error=error, cancelled=cancelled)


def test_a_run_stopped_by_its_error_budget_is_judged_on_the_requests_sent() -> None:
    from tuner.loadgen.monitor import SKIPPED

    records = [
        *(_rec(i, False) for i in range(10)),
        *(_rec(10 + i, True) for i in range(10)),
        *(_rec(20 + i, False, cancelled=True) for i in range(30)),
    ]
    load = LoadResult(tuple(records), 1.0, SKIPPED, None, "error_budget")
    metrics = score_load(load, parse_study(study(), "s.yaml").objective.slo)
    assert metrics["error_rate"] == pytest.approx(10 / 50)  # not 10 / 20 of the ended ones
    data = study()
    data["objective"]["slo"]["max_error_rate"] = 0.15
    out = measured_outcome(parse_study(data, "s.yaml").objective, metrics, client_lagged=False)
    assert out.status == Status.SLO_MISSED and "errors" in out.reason


# --- 9: the baseline's concurrency under the inner search -----------------------------------


def test_the_baseline_concurrency_is_where_trial_0_starts(tmp_path: Path) -> None:
    run_virtual(tmp_path, study(**{"baseline.concurrency": 24}))
    points = json.loads((tmp_path / "runs/demo-sim/trials/0/points.json").read_text())["points"]
    assert points[0]["concurrency"] == 24


def test_a_baseline_of_only_concurrency_still_runs_sglangs_defaults(tmp_path: Path) -> None:
    default, _ = run_virtual(tmp_path / "a", study(**{"baseline": None}))
    only, _ = run_virtual(tmp_path / "b", study(**{"baseline": {"concurrency": 24}}))
    (t0,) = default.study.trials
    (t1,) = only.study.trials
    assert t1.params == t0.params and t1.user_attrs.get("baseline")


# --- 11: keys the built requests ignore -------------------------------------------------------


@pytest.mark.parametrize(
    ("workload", "key"),
    [
        ({"kind": "shared-prefix", "range_ratio": 0.1}, "range_ratio"),
        ({"kind": "jsonl", "dataset": "x", "range_ratio": 0.5}, "range_ratio"),
        ({"length_dist": "fixed", "range_ratio": 0.1}, "range_ratio"),
        ({"kind": "sharegpt", "dataset": "x", "output_len": 100}, "output_len"),
        ({"model": "llama"}, "model"),
    ],
)
def test_a_key_the_requests_ignore_is_refused(workload: dict[str, Any], key: str) -> None:
    data = study()
    data["workload"] = workload
    with pytest.raises(ConfigError, match=rf"^s\.yaml: workload\.{key}: "):
        parse_study(data, "s.yaml")


def test_the_start_estimate_uses_the_lengths_built() -> None:
    # sections built directly (as `tuner bench` builds one) may carry a range_ratio that the
    # requests ignore: the estimate ignores it too
    fixed = WorkloadSection(input_len=1000, output_len=100, length_dist="fixed", range_ratio=0.2)
    assert request_tokens(fixed)[0] == pytest.approx(1000 + 50)
    sp = WorkloadSection(
        kind="shared-prefix", prefix_len=900, question_len=100, output_len=100, range_ratio=0.2
    )
    assert request_tokens(sp)[0] == pytest.approx(1000 + 50)
    uniform = WorkloadSection(input_len=1000, output_len=100, range_ratio=0.5)
    assert request_tokens(uniform)[0] == pytest.approx(750 + 75 / 2)


# --- 12: the concurrency grid -----------------------------------------------------------------


def test_the_inner_search_runs_only_points_of_the_step() -> None:
    b = Bounds(8, 256, 100, max_runs=8, step=8).fit()

    def measure(c: int) -> Point:
        return Point(c, min(c, 150) - 0.001 * c, c <= 180)

    points = search(measure, b).points
    assert points and all((p.concurrency - 8) % 8 == 0 for p in points), points
    cfg = parse_study(study(**{"space.concurrency": {"low": 8, "high": 250, "step": 8}}), "s.yaml")
    got = bounds(cfg, 100_000, hint=None)
    assert got.high == 248 and (got.start - 8) % 8 == 0


def test_probes_of_joint_mode_keep_to_the_step() -> None:
    spec = ParamSpec(low=8, high=256, step=8)
    probe = ProbeConcurrency(spec, BudgetSection())
    assert probe._next(64, up=True) == 96
    assert probe._next(16, up=False) == 8
    assert all((probe._next(c, up) - 8) % 8 == 0 for c in range(8, 257, 8) for up in (True, False))


def test_choices_never_reach_the_inner_search() -> None:
    choices = {"space.concurrency": {"choices": [16, 32]}, "baseline.concurrency": 16}
    cfg = parse_study(study(**choices), "s.yaml")
    assert search_mode(cfg) == "joint"
    data = study(**{**choices, "space.concurrency": {"choices": [16, 32], "search": "inner"}})
    with pytest.raises(ConfigError, match=r"space\.concurrency\.search: inner needs an integer"):
        parse_study(data, "s.yaml")


# --- 22: a study file's storage: may be shared -----------------------------------------------


def test_a_storage_in_the_study_file_never_claims_unowned_trials(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    data = study(**{"storage": url})
    run_virtual(tmp_path, data)
    # another worker's trial, before its first line named its owner
    other = optuna.load_study(study_name="demo-sim", storage=url).ask()
    data["budget"]["n_trials"] = 2
    run_virtual(tmp_path, data)
    trials = optuna.load_study(study_name="demo-sim", storage=url).get_trials()
    assert trials[other.number].state == TrialState.RUNNING
