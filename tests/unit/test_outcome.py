"""The trial record: written to optuna attributes and read back unchanged; one feasibility rule."""

from __future__ import annotations

import json

import pytest

from tuner.config.objective import ObjectiveSection
from tuner.outcome import (
    CONSTRAINT_KEYS,
    Attr,
    Status,
    TrialOutcome,
    failed_outcome,
    is_feasible,
    measured_outcome,
)

OBJECTIVE = ObjectiveSection.model_validate({"slo": {"p99_ttft_ms": 1000}})


def test_attrs_round_trip_through_json() -> None:
    out = measured_outcome(
        OBJECTIVE,
        {"window_output_throughput": 812.5, "p99_ttft_ms": 400.0},
        client_lagged=False,
        server_info={"max_total_num_tokens": 116171},
        restarted=True,
        launched=True,
    )
    stored = json.loads(json.dumps(out.to_attrs()))  # what an RDB storage gives back
    back = TrialOutcome.from_attrs(stored, out.values, out.constraints)
    assert back is not None
    assert back.status is Status.OK and back.values == (812.5,)
    assert back.metrics == out.metrics and back.server_info == out.server_info
    assert back.restarted and back.launched and back.feasible
    assert set(stored) == {
        str(a)
        for a in (
            Attr.STATUS,
            Attr.REASON,
            Attr.FAILURE,
            Attr.METRICS,
            Attr.SERVER_INFO,
            Attr.RESTARTED,
            Attr.LAUNCHED,
        )
    } | {"window_output_throughput", "p99_ttft_ms", "max_total_num_tokens"}  # sortable numbers
    assert stored["p99_ttft_ms"] == 400.0 and stored["max_total_num_tokens"] == 116171


def test_a_trial_without_an_outcome_reads_back_as_none() -> None:
    assert TrialOutcome.from_attrs({Attr.INFRA_ERROR: "ssh dropped"}) is None
    assert TrialOutcome.from_attrs({Attr.STATUS: "no-such-status"}) is None


@pytest.mark.parametrize(
    ("constraints", "feasible"),
    [({}, False), ({"c_start": -1.0}, True), ({"c_start": -1.0, "c_ttft": 0.2}, False)],
)
def test_the_feasibility_rule(constraints: dict, feasible: bool) -> None:
    assert is_feasible(constraints) is feasible


def test_slo_miss_and_client_lag_and_failure() -> None:
    missed = measured_outcome(OBJECTIVE, {"p99_ttft_ms": 1500.0}, client_lagged=False)
    assert missed.status is Status.SLO_MISSED and "ttft" in missed.reason
    assert missed.constraints["c_ttft"] == pytest.approx(0.5)
    lagged = measured_outcome(OBJECTIVE, {"p99_ttft_ms": 10.0}, client_lagged=True)
    assert lagged.status is Status.FLAGGED
    failed = failed_outcome(OBJECTIVE, Status.START_FAILED, "OOM", "oom_cuda_graph")
    assert set(failed.constraints) == set(CONSTRAINT_KEYS) and not failed.feasible
    assert failed.values == (0.0,)
