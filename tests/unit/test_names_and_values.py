"""Names users know and values as they write them: the score's own name (the old spelling still
resumes), bench_serving's keys, values tidied to their step's grid, the stored constraints,
the CSV, the status table's width. Pure: no storage, no network."""

from __future__ import annotations

import csv
import io

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from rich.console import Console

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.config.objective import ObjectiveSection
from tuner.config.workload import WorkloadSection
from tuner.loadgen.names import backend_kind, run_keys, trial_run_keys
from tuner.outcome import (
    CONSTRAINT_KEYS,
    measured_outcome,
    missed_slos,
    named_constraints,
    objective_values,
)
from tuner.report.rows import FIGURES, trials_csv, trials_table
from tuner.search.space import fingerprint, tidy, tidy_params

SLO = {"slo": {"p99_ttft_ms": 3000, "max_error_rate": 0.01}}
STUDY = study_dict(
    study="names",
    space={
        "mem-fraction-static": {"low": 0.80, "high": 0.98, "step": 0.01},
        "concurrency": {"low": 8, "high": 256, "log": True},
    },
    objective={"metric": "output_throughput", **SLO},
)
#: `fingerprint(cfg)["objective"]` of the objective above as tuner wrote it before the score
#: was renamed (computed with that version): a study it made must still resume
OLD_OBJECTIVE_HASH = "842e3ad0e87361f3"


@pytest.mark.parametrize(
    ("value", "dist", "expected"),
    [
        (0.8 + 7 * 0.01, FloatDistribution(0.80, 0.98, step=0.01), 0.87),
        (0.805 + 1 * 0.01, FloatDistribution(0.805, 0.905, step=0.01), 0.815),  # low's decimals
        (0.5 + 5 * 0.1, FloatDistribution(0.5, 1.5, step=0.1), 1.0),
        (3 * 0.05, FloatDistribution(0.0, 1.0, step=0.05), 0.15),
        (2.5e-05 + 1e-05, FloatDistribution(2.5e-05, 1.005e-3, step=1e-05), 3.5e-05),
        (0.1 + 0.2, FloatDistribution(0.0, 1.0), 0.3),  # no step: binary noise only
        (0.123456789, FloatDistribution(0.0, 1.0), 0.123456789),  # a real value is kept
        (64, IntDistribution(8, 256, log=True), 64),
        ("lpm", CategoricalDistribution(["lpm", "fcfs"]), "lpm"),
    ],
)
def test_values_are_written_as_the_user_would(value, dist, expected) -> None:
    out = tidy(value, dist)
    assert out == expected and repr(out) == repr(expected)


def test_tidy_params_without_distributions_trims_noise_only() -> None:
    assert tidy_params({"mfs": 0.8 + 7 * 0.01, "c": 64}) == {"mfs": 0.87, "c": 64}
    assert repr(tidy_params({"mfs": 0.8 + 7 * 0.01})["mfs"]) == "0.87"


def test_the_score_has_its_own_name_and_the_old_spelling_resumes() -> None:
    old = parse_study(STUDY, "old.yaml")
    new = parse_study(
        {**STUDY, "objective": {"metric": "window_output_throughput", **SLO}}, "new.yaml"
    )
    assert old.objective.metric == new.objective.metric == "window_output_throughput"
    assert fingerprint(old) == fingerprint(new)
    assert fingerprint(old)["objective"] == OLD_OBJECTIVE_HASH
    default = parse_study({k: v for k, v in STUDY.items() if k != "objective"} | {"objective": SLO})
    assert default.objective.metric == "window_output_throughput"
    assert fingerprint(default) == fingerprint(old)
    other = parse_study({**STUDY, "objective": {"metric": "request_throughput", **SLO}})
    assert fingerprint(other)["objective"] != OLD_OBJECTIVE_HASH


def test_the_score_is_the_window_figure_and_a_miss_scores_as_not_run() -> None:
    obj = ObjectiveSection.model_validate(SLO)
    run = {"window_output_throughput": 2500.6, "output_throughput": 664.4, "p99_ttft_ms": 900}
    assert objective_values(obj, run) == (2500.6,)
    assert objective_values(obj, {"output_throughput": 700.0}) == (700.0,)  # nothing cut
    missed = measured_outcome(obj, {**run, "p99_ttft_ms": 4500}, client_lagged=False)
    assert missed.values == (0.0,) and missed.metrics["window_output_throughput"] == 2500.6
    assert missed.to_attrs()["window_output_throughput"] == 2500.6  # measured, kept, sortable
    pareto = ObjectiveSection.model_validate({**SLO, "pareto_latency": "p99_ttft_ms"})
    assert measured_outcome(pareto, {**run, "p99_ttft_ms": 4500}, client_lagged=False).values == (
        0.0,
        1e7,
    )


def test_constraints_read_by_name_from_either_storage_format() -> None:
    old = {k: (0.5 if k == "c_ttft" else -1.0) for k in CONSTRAINT_KEYS}  # per-key attributes
    new = {str(i): v for i, v in enumerate(old.values())}  # the list optuna-dashboard reads
    assert named_constraints(old) == named_constraints(new) == old
    assert missed_slos(old) == missed_slos(new) == ["ttft"]


def test_bench_serving_keys_of_a_run() -> None:
    w = WorkloadSection(kind="shared-prefix", backend="openai-chat", output_len=64)
    keys = run_keys(w, 32, float("inf"))
    assert (
        keys["backend"] == "sglang-oai-chat" and keys["dataset_name"] == "generated-shared-prefix"
    )
    assert keys["max_concurrency"] == 32 and keys["request_rate"] is None
    assert keys["random_output_len"] == 64 and keys["sharegpt_output_len"] is None
    rate = trial_run_keys(WorkloadSection(), {"concurrency": 8, "request-rate": 2.5})
    assert rate["request_rate"] == 2.5 and rate["dataset_name"] == "random"
    assert backend_kind("vllm-chat") == "openai-chat" and backend_kind("trt") is None


def _rows(n: int) -> list[dict]:
    """Rows as trialrows.trial_rows makes them: long reasons, many params, every outcome."""
    params = {
        "mem-fraction-static": 0.87,
        "concurrency": 128,
        "chunked-prefill-size": 16384,
        "schedule-conservativeness": 1.3,
        "cuda-graph-max-bs": 512,
        "schedule-policy": "lpm",
        "hicache-size": 64,
        "hicache-write-policy": "write_through_selective",
    }
    reasons = [
        "",
        "missed SLO: ttft, itl, errors",
        "Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB, with, commas",
        'server died under load (oom_runtime) "quoted"',
    ]
    rows = []
    for i in range(n):
        status = ["ok", "slo_missed", "start_failed", "died"][i % 4]
        measured = status in ("ok", "slo_missed")
        rows.append(
            {
                "trial": 100 + i,
                "state": "COMPLETE",
                "status": status,
                "best": i == 0,
                "params": params,
                "feasible": status == "ok",
                "value": 12345.678 if status == "ok" else 0.0,
                "score": 12345.678 if measured else None,
                **{k: (12345.678 if measured else None) for k in FIGURES},
                "max_total_num_tokens": 1_234_567,
                "reason": reasons[i % 4],
                "failure": None,
                "restarted": True,
                "duplicate_of": None,
                "worker": "gpu-node-17:127.0.0.1",
            }
        )
    return rows


@pytest.mark.parametrize("width", [100, 80])
def test_the_status_table_fits_its_width_one_line_a_trial(width: int) -> None:
    cfg = parse_study(STUDY)
    rows = _rows(8)
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(trials_table(cfg, rows, width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    body = [line for line in lines if line[:3].strip().isdigit()]
    assert len(body) == len(rows)  # not one row wrapped over several lines
    died = next(line for line in body if line.split()[1] == "died")
    assert "server died" in died and "12,346" not in died  # why, not a figure
    assert any(line.split()[1] == "best" for line in body)


def test_csv_of_every_trial_is_rfc_4180() -> None:
    cfg = parse_study(STUDY)
    text = trials_csv(cfg, _rows(4))
    assert text.endswith("\r\n") and "\r\n" in text.splitlines(keepends=True)[0]
    table = list(csv.DictReader(io.StringIO(text, newline="")))
    assert len(table) == 4
    assert table[2]["reason"].endswith("with, commas")
    assert table[3]["reason"] == 'server died under load (oom_runtime) "quoted"'
    assert table[0]["mem-fraction-static"] == "0.87" and table[0]["status"] == "ok"
    assert table[0]["window_output_throughput"] == "12345.7"
    assert table[2]["p99_ttft_ms"] == ""  # a start that failed measured nothing


def test_help_and_messages_speak_to_users() -> None:
    from tuner.api import confirming
    from tuner.cli import build_parser

    text = build_parser().format_help()
    assert "most throughput within your latency SLOs" in text
    assert "tuner tune study.yaml" in text and "--format cmd, json, csv" in text
    assert "dispatch" not in text and "No logic" not in text  # no developer's docstring
    assert confirming(1, 1) == "confirming the best config (1 more run)"
    assert confirming(3, 2) == "confirming the best 3 configs (2 more runs each)"
