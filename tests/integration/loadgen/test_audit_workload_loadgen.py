"""Audit findings 2, 3b and 11 on the real HTTP client (a fake SGLang on 127.0.0.1): a window's
run is topped up or flagged, the error budget waits for evidence and follows the SLO, and
`tuner bench` refuses a flag its workload ignores."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.helpers.fake_http import FakeConfig, FakeSGLang, ServerThread
from tests.helpers.studies import study_dict
from tuner.config.workload import WorkloadSection
from tuner.loadgen.options import LoadOptions, load_options
from tuner.loadgen.run import run_load_sync
from tuner.loadgen.workload import requests_for


def options(w: WorkloadSection, concurrency: int = 4, **kw: Any) -> LoadOptions:
    opts = load_options(w, concurrency=concurrency, **kw)
    return replace(opts, metrics_interval_s=0.05, flush_pause_s=0.0)


def test_a_window_run_of_random_requests_is_topped_up_to_its_end() -> None:
    from tuner.loadgen.plan import refill_for

    w = WorkloadSection(input_len=8, output_len=4, duration_s=1.5, warmup_requests=0)
    w = w.model_copy(update={"flush_cache": False})
    reqs = requests_for(w, num_requests=20)
    with ServerThread(FakeSGLang(FakeConfig(token_delay_s=0.002))) as srv:
        res = run_load_sync(srv.url, reqs, options(w), more=refill_for(w))
    m = res.metrics()
    assert res.stopped == "duration" and not res.exhausted
    assert m.completed > len(reqs)  # the list of 20 would have ended the run early
    assert len({r.index for r in res.records}) == len(res.records)  # each request sent once


def test_a_finite_list_that_runs_out_is_marked_exhausted() -> None:
    w = WorkloadSection(
        kind="shared-prefix", num_groups=2, prompts_per_group=4, prefix_len=8, question_len=4,
        output_len=4, duration_s=30, warmup_requests=0, flush_cache=False,
    )  # fmt: skip
    with ServerThread(FakeSGLang()) as srv:
        res = run_load_sync(srv.url, requests_for(w, num_requests=8), options(w))
    assert res.stopped == "done" and res.exhausted and res.summary()["exhausted"] is True
    assert res.metrics().completed == 8 and res.duration_s < 30


def test_the_first_errors_of_a_run_do_not_trip_the_budget() -> None:
    # 1 request in 15 fails, at once: the old budget (over at least 20 sent) stopped the run at
    # its 2nd failure; the budget now judges from MIN_ERRORS failures on
    w = WorkloadSection(input_len=8, output_len=20, num_requests=60, warmup_requests=0)
    w = w.model_copy(update={"flush_cache": False, "max_error_rate": 0.05})
    with ServerThread(FakeSGLang(FakeConfig(fail_every=15, token_delay_s=0.005))) as srv:
        res = run_load_sync(srv.url, requests_for(w, num_requests=60), options(w, 16))
    assert res.stopped == "done" and res.metrics().errors == 4


def test_the_budget_follows_an_slo_that_allows_more_errors() -> None:
    from tuner.config.load import parse_study
    from tuner.loadgen.plan import study_load_options

    cfg = parse_study(
        study_dict(
            space={"concurrency": {"low": 1, "high": 64}},
            workload={"input_len": 8, "output_len": 20, "duration_s": 2, "warmup_requests": 0},
            objective__slo={"max_error_rate": 0.2},
        )
    )
    opts = replace(
        study_load_options(cfg, {"concurrency": 32}, max_loop_lag_ms=250),
        flush_cache=False,
        metrics_interval_s=0.05,
    )
    with ServerThread(FakeSGLang(FakeConfig(fail_every=10, token_delay_s=0.005))) as srv:
        res = run_load_sync(srv.url, requests_for(cfg.workload, num_requests=2000), opts)
    assert res.stopped == "duration", res.stopped  # 10% errors: inside the 20% SLO
    assert res.metrics().error_rate == pytest.approx(0.1, abs=0.03)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workload", "shared-prefix", "--input-len", "500"], "--input-len: --workload"),
        (["--dataset-name", "random", "--turns", "3"], "--turns: --workload random ignores"),
        (["--range-ratio", "0.5", "--workload", "shared-prefix"], "--range-ratio: --workload"),
        (["--model", "m"], "--model: backend sglang"),
    ],
)
def test_bench_refuses_a_flag_its_workload_ignores(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture
) -> None:
    from tuner.cli import main

    code = main(["bench", "--port", "1", "--concurrency", "1", "--duration", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
