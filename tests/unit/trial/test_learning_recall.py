"""What earlier trials taught the pre-check is the study's, not the process's: a resumed run
(and another worker of a shared study) recalls the deaths, graph-capture failures and floors
stored in the study's trials before it spends a restart on what is known to fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import create_trial

from tests.helpers.paths import REPO
from tuner.api import tune
from tuner.capacity.precheck import Knowledge
from tuner.config.load import parse_study
from tuner.outcome import Attr, Status
from tuner.sim.virtual.study import virtual_seams
from tuner.trial.learning import recalled

BASE = {"model-path": "m", "chunked-prefill-size": 8192}
HOST = "ValueError: Not enough host memory available. Requesting 48.00 GB but only have 30 GB free."


def _study_file() -> dict[str, Any]:
    """The demo's H100 up to mfs 0.98, where a large prefill runs out of memory under load."""
    d = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    d["space"] = {
        "mem-fraction-static": {"low": 0.80, "high": 0.98, "step": 0.01},
        "concurrency": {"low": 8, "high": 256, "log": True, "search": "joint"},
    }
    d["baseline"] = {"mem-fraction-static": 0.85, "concurrency": 16}
    d["workload"].update(input_len=1024, output_len=128, range_ratio=0.5, duration_s=3)
    d["objective"]["slo"] = {"p99_ttft_ms": 2900}
    d["budget"].update(confirm_top=0)
    return d


def test_a_resumed_run_rejects_what_an_earlier_run_saw_die(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    cfg = parse_study(_study_file(), "d.yaml")

    def run(n: int, params: dict[str, Any] | None = None) -> optuna.Study:
        if params is not None:  # the next trial's params, as a user's enqueue would set them
            storage = f"sqlite:///{tmp_path}/{cfg.study}/study.db"
            optuna.load_study(study_name=cfg.study, storage=storage).enqueue_trial(params)
        # every call is a fresh run: a new runner, whose own knowledge starts empty
        return tune(cfg, runs_dir=tmp_path, seed=3, n_trials=n, make_seams=virtual_seams(3)).study

    run(1)
    died = run(2, {"mem-fraction-static": 0.97, "concurrency": 128}).trials[1]
    assert died.user_attrs[Attr.STATUS] == Status.DIED, died.user_attrs  # the premise
    nxt = run(3, {"mem-fraction-static": 0.98, "concurrency": 160}).trials[2]
    a = nxt.user_attrs
    assert a[Attr.STATUS] == Status.REJECTED and not a[Attr.LAUNCHED], a
    assert a[Attr.FAILURE] == "oom_runtime" and "(trial 1)" in a[Attr.REASON]


def _trial(number: int, mfs: float, status: str, **attrs: Any) -> optuna.trial.FrozenTrial:
    t = create_trial(
        params={"mem-fraction-static": mfs, "concurrency": 64},
        distributions={
            "mem-fraction-static": FloatDistribution(0.1, 0.99),
            "concurrency": IntDistribution(1, 512),
        },
        value=0.0,
        user_attrs={Attr.STATUS: status, Attr.LAUNCHED: True, **attrs},
    )
    t.number = number
    return t


def test_recall_learns_each_launched_trial_once_and_nothing_else() -> None:
    def flags(params: Any) -> dict[str, Any]:
        return {**BASE, "mem-fraction-static": params["mem-fraction-static"], "hicache-size": 48}

    start = {"max_total_num_tokens": 400_000, "mem_fraction_static": 0.85}
    trials = [
        _trial(0, 0.85, "ok", **{Attr.SERVER_INFO: start}),
        _trial(1, 0.95, "start_failed", **{Attr.FAILURE: "oom_cuda_graph"}),
        _trial(2, 0.40, "start_failed", **{Attr.FAILURE: "not_enough_memory"}),
        _trial(3, 0.92, "died", **{Attr.FAILURE: "oom_runtime"}),
        # restating what is known, a copy of a record, or a failure of the world: nothing new
        _trial(4, 0.96, "rejected", **{Attr.FAILURE: "oom_cuda_graph", Attr.LAUNCHED: False}),
        _trial(5, 0.93, "died", **{Attr.FAILURE: "oom_runtime", Attr.DUPLICATE_OF: 3}),
        _trial(6, 0.91, "start_failed", **{Attr.FAILURE: "crashed"}),
        _trial(7, 0.90, "start_failed", **{Attr.FAILURE: "host_memory", Attr.REASON: HOST}),
        # a death on a server an earlier trial started (a probe): it ran, so it teaches
        _trial(8, 0.94, "died", **{Attr.FAILURE: "oom_runtime", Attr.LAUNCHED: False}),
    ]
    know = recalled(Knowledge(), trials, flags)
    assert know.calibration == (400_000, 0.85)
    assert [(m, n) for _, m, n in know.graph_failures] == [(0.95, 1)]
    assert [(m, n) for _, m, n in know.floors] == [(0.40, 2)]
    assert [(m, c, n) for _, m, c, n in know.deaths] == [(0.92, 64, 3), (0.94, 64, 8)]
    assert know.host_failures == ((1, 48.0, 7),)  # 1 GPU rank
    # what this run learned live is the same entry when the study recalls it
    assert recalled(know, trials, flags) == know
    # the first start calibrates; a recalled one never replaces it
    own = Knowledge(calibration=(1, 0.5))
    assert recalled(own, trials, flags).calibration == (1, 0.5)


def test_a_host_memory_failure_teaches_only_the_worker_whose_host_it_was() -> None:
    def flags(params: Any) -> dict[str, Any]:
        return {**BASE, "mem-fraction-static": params["mem-fraction-static"], "hicache-size": 48}

    graph = {Attr.FAILURE: "oom_cuda_graph", Attr.WORKER: "host-a"}
    host = {Attr.FAILURE: "host_memory", Attr.REASON: HOST, Attr.WORKER: "host-a"}
    trials = [_trial(0, 0.95, "start_failed", **graph), _trial(1, 0.9, "start_failed", **host)]
    # host-b's host may have the RAM host-a lacked; the GPUs are alike (the study's hardware)
    other = recalled(Knowledge(), trials, flags, worker="host-b")
    assert other.host_failures == () and [n for *_, n in other.graph_failures] == [0]
    assert recalled(Knowledge(), trials, flags, worker="host-a").host_failures == ((1, 48.0, 1),)
    # no worker given (nothing to tell hosts apart by): it teaches
    assert recalled(Knowledge(), trials, flags).host_failures == ((1, 48.0, 1),)
