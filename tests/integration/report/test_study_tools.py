"""A study as other tools and the commands read it: optuna-dashboard's server (real, on
127.0.0.1) and `optuna.visualization` name tuner's winner, not the faster trial that missed its
SLO; `tuner status` fits 100 columns; `tuner export` writes values as the user would, and every
trial as CSV. One study made through tuner's own loop (tests/helpers/prepared.py) serves all."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers.net import free_port
from tests.helpers.prepared import (
    DIED,
    DUPLICATE,
    FIXED,
    PLAN,
    SLO_MISS,
    WINNER,
    prepared_study,
    scripted_tuning,
    write_study_file,
)
from tests.helpers.studies import tuner
from tuner.cli import main
from tuner.config.load import load_study
from tuner.outcome import CONSTRAINT_KEYS, missed_slos
from tuner.search.sampler import make_sampler
from tuner.search.space import distributions, fingerprint
from tuner.study.storage import make_storage, open_study, storage_url
from tuner.verdict.winner import best_trial

#: one xdist worker for the module (pyproject's `--dist loadgroup`): `prepared` builds its
#: study once per worker that runs any of these tests
pytestmark = pytest.mark.xdist_group("study-tools")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return prepared_study(tmp_path_factory.mktemp("prepared"))


def cli(capsys: pytest.CaptureFixture, *args: str) -> str:
    """The `tuner` command in this process (a subprocess per call costs seconds): its stdout."""
    capsys.readouterr()
    assert main(list(args)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def load(prepared: tuple[Path, Path]) -> optuna.Study:
    study_file, runs = prepared
    cfg = load_study(study_file)
    return open_study(cfg, make_storage(storage_url(cfg, runs), 2), make_sampler(cfg))


def test_the_study_is_what_the_plan_scripts(prepared) -> None:
    study = load(prepared)
    trials = study.trials
    assert len(trials) == len(PLAN)
    assert trials[WINNER].params["mem-fraction-static"] == 0.8 + 7 * 0.01  # 0.8700000000000001
    slo_miss = trials[SLO_MISS]
    assert slo_miss.user_attrs["window_output_throughput"] > trials[WINNER].values[0]
    assert best_trial(study)[0].number == WINNER


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


@contextlib.contextmanager
def dashboard(db: Path, log: Path):
    """optuna-dashboard's own server on the study's SQLite file, on a free loopback port."""
    exe = Path(sys.executable).with_name("optuna-dashboard")
    cmd = [str(exe) if exe.exists() else shutil.which("optuna-dashboard") or "optuna-dashboard"]
    port = free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [*cmd, f"sqlite:///{db}", "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # its own process group: stopped whole, by its id
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # a busy 2-core machine imports slowly
        while True:
            try:
                _get(f"{base}/api/studies")
                break
            except OSError:
                alive = proc.poll() is None
                if not alive or time.monotonic() > deadline:
                    why = "exited" if not alive else "did not answer in 90 s"
                    raise AssertionError(f"optuna-dashboard {why}: {log.read_text()}") from None
                time.sleep(0.3)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_optuna_dashboard_names_tuners_winner(prepared, tmp_path: Path) -> None:
    study_file, runs = prepared
    with dashboard(runs / "prepared" / "study.db", tmp_path / "dashboard.log") as base:
        (summary,) = _get(f"{base}/api/studies")["study_summaries"]
        detail = _get(f"{base}/api/studies/{summary['study_id']}")
    by_number = {t["number"]: t for t in detail["trials"]}
    (best,) = detail["best_trials"]
    # its best is tuner's winner (or the duplicate answered from it, the same config and value),
    # not trial SLO_MISS, whose measured throughput is the highest of the study
    assert best["number"] in (WINNER, DUPLICATE)
    assert best["params"] == by_number[WINNER]["params"]
    assert detail["objective_names"] == ["window_output_throughput"]
    # constraints where it reads them: every completed trial's, the SLO miss infeasible
    assert all(len(t["constraints"]) == len(CONSTRAINT_KEYS) for t in detail["trials"])
    assert any(c > 0 for c in by_number[SLO_MISS]["constraints"])
    assert all(c <= 0 for c in by_number[WINNER]["constraints"])
    # the main metrics as their own numbers, which it can sort by
    sortable = {a["key"] for a in detail["union_user_attrs"] if a["sortable"]}
    assert {"window_output_throughput", "p99_ttft_ms", "p99_itl_ms", "error_rate"} <= sortable
    assert "max_total_num_tokens" in sortable
    attrs = {a["key"]: a["value"] for a in by_number[SLO_MISS]["user_attrs"]}
    assert float(attrs["window_output_throughput"]) == 3100.0


def test_optuna_visualization_agrees(prepared) -> None:
    import optuna.visualization as vis

    study = load(prepared)
    assert study.best_trial.number in (WINNER, DUPLICATE)
    assert study.metric_names == ["window_output_throughput"]
    fig = vis.plot_optimization_history(study)
    best_line = next(t for t in fig.data if t.name == "Best Value")
    assert max(best_line.y) == study.trials[WINNER].values[0]
    infeasible = next(t for t in fig.data if t.name == "Infeasible Trial")
    assert SLO_MISS in infeasible.x  # drawn apart, as optuna-dashboard draws it


@pytest.mark.parametrize("columns", [100, 80])
def test_status_fits_the_terminal_one_line_a_trial(
    prepared, columns: int, capsys, monkeypatch
) -> None:
    study_file, runs = prepared
    if columns == 100:  # the console script end to end
        width = {"COLUMNS": str(columns)}
        out = tuner("status", str(study_file), "--runs-dir", str(runs), timeout=120, env=width)
        assert out.returncode == 0, out.stderr
        text = out.stdout
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
        text = cli(capsys, "status", str(study_file), "--runs-dir", str(runs))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= columns, "\n".join(lines)
    body = {int(line.split()[0]): line for line in lines if line[:3].strip().isdigit()}
    assert sorted(body) == list(range(len(PLAN)))  # one line each, none wrapped
    assert body[WINNER].split()[1] == "best" and "2,400" in body[WINNER]
    died = body[DIED].split()
    assert died[1] == "died" and "server died" in body[DIED]
    assert " 0.0 " not in body[DIED] and "1 ms" not in body[DIED]  # why, not a zero latency
    assert "mfs=0.87 " in body[WINNER] and "0.8700000000000001" not in text


def test_status_wide_and_json_hold_the_details(prepared, capsys) -> None:
    study_file, runs = prepared
    wide = cli(capsys, "status", str(study_file), "--runs-dir", str(runs), "--wide")
    assert "Capture cuda graph failed: CUDA out of memory" in wide
    assert "mem-fraction-static=0.87" in wide and "370,000" in wide
    data = json.loads(cli(capsys, "status", str(study_file), "--runs-dir", str(runs), "--json"))
    assert data["metric"] == "window_output_throughput" and data["best"]["trial"] == WINNER
    rows = data["trials"]
    assert rows[WINNER]["params"]["mem-fraction-static"] == 0.87
    assert rows[SLO_MISS]["value"] == 0.0 and rows[SLO_MISS]["score"] == 3100.0
    assert rows[DIED]["status"] == "died" and rows[DIED]["p99_ttft_ms"] is None
    assert rows[DUPLICATE]["duplicate_of"] == WINNER


def test_export_writes_values_as_the_user_would(prepared, capsys) -> None:
    study_file, runs = prepared
    args = ["export", str(study_file), "--runs-dir", str(runs)]
    out = {fmt: cli(capsys, *args, "--format", fmt) for fmt in ("yaml", "cmd", "json")}
    for text in out.values():
        assert "0.8700000000000001" not in text and "1.0000000000000002" not in text
    flags = yaml.safe_load(out["yaml"])
    assert flags["mem-fraction-static"] == 0.87 and "mem-fraction-static: 0.87\n" in out["yaml"]
    assert "window_output_throughput" in out["yaml"]  # the header names the score
    assert "--mem-fraction-static 0.87 " in out["cmd"]
    data = json.loads(out["json"])
    assert (
        data["params"]["mem-fraction-static"] == 0.87
        and data["objective"] == "window_output_throughput"
    )
    assert data["flags"]["schedule-conservativeness"] == 1.0


def test_export_csv_of_every_trial(prepared, tmp_path: Path, capsys) -> None:
    study_file, runs = prepared
    path = tmp_path / "trials.csv"
    cli(
        capsys,
        "export",
        str(study_file),
        "--runs-dir",
        str(runs),
        "--format",
        "csv",
        "-o",
        str(path),
    )
    raw = path.read_bytes()
    assert raw.count(b"\r\n") == len(PLAN) + 1  # header + one row a trial, CRLF (RFC 4180)
    rows = list(csv.DictReader(io.StringIO(raw.decode(), newline="")))
    assert [int(r["trial"]) for r in rows] == list(range(len(PLAN)))
    assert rows[WINNER]["mem-fraction-static"] == "0.87" and rows[WINNER]["best"] == "True"
    assert (
        rows[SLO_MISS]["status"] == "slo_missed"
        and rows[SLO_MISS]["window_output_throughput"] == "3100.0"
    )
    assert "CUDA out of memory" in rows[3]["reason"] and rows[3]["p99_ttft_ms"] == ""
    assert rows[DIED]["reason"] == "server died under load (oom_runtime)"
    for key in ("state", "p99_itl_ms", "error_rate", "max_total_num_tokens", "concurrency"):
        assert key in rows[0]


def test_each_trials_metrics_json_speaks_bench_serving(prepared) -> None:
    study_file, runs = prepared
    m = json.loads((runs / "prepared" / "trials" / str(SLO_MISS) / "metrics.json").read_text())
    assert m["backend"] == "sglang" and m["dataset_name"] == "random"
    assert m["max_concurrency"] == 256 and m["request_rate"] is None
    assert m["random_input_len"] == 1024 and m["random_output_len"] == 128
    assert m["window_output_throughput"] == 3100.0 and m["output_throughput"] == 3100.0 * 0.9


def test_a_study_written_before_resumes_and_reads(tmp_path: Path, capsys) -> None:
    """A study as tuner wrote it before these names (`metric: output_throughput`, constraints
    under optuna's per-key attributes, an SLO miss scored at its throughput, no metric names,
    no numeric attributes) still reads the same and resumes in a shape GPSampler accepts."""
    study_file = write_study_file(tmp_path, "old")
    runs = tmp_path / "runs"
    cfg = load_study(study_file)
    storage = make_storage(storage_url(cfg, runs), 2)
    old = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    old.set_user_attr("tuner:fingerprint", fingerprint(cfg))  # what the old code wrote
    dists = distributions(cfg.space)
    for k, conc, tput, ttft in ((7, 64, 2400.0, 900.0), (7, 256, 3100.0, 5000.0)):
        old.enqueue_trial({"mem-fraction-static": 0.8 + k * 0.01, "concurrency": conc, **FIXED})
        trial = old.ask(dists)
        missed = ttft > 2000
        for key in CONSTRAINT_KEYS:
            trial.set_constraint(key, (ttft / 2000 - 1) if key == "c_ttft" else -1.0)
        metrics = {"output_throughput": tput, "window_output_throughput": tput, "p99_ttft_ms": ttft}
        for key, value in {
            "status": "slo_missed" if missed else "ok",
            "reason": "missed SLO: ttft" if missed else "",
            "metrics": metrics,
            "server_info": {"max_total_num_tokens": 370000},
            "restarted": True,
            "worker": "w1",
        }.items():
            trial.set_user_attr(key, value)
        old.tell(trial, tput)
    data = json.loads(cli(capsys, "status", str(study_file), "--runs-dir", str(runs), "--json"))
    assert [t["status"] for t in data["trials"]] == ["ok", "slo_missed"]
    assert data["best"]["trial"] == 0 and data["trials"][1]["score"] == 3100.0
    assert data["trials"][0]["max_total_num_tokens"] == 370000
    # resumed by today's code: named, and its new trials' constraints as many as the old ones'
    study = open_study(cfg, storage, make_sampler(cfg))
    assert study.metric_names == ["window_output_throughput"]
    tuning = scripted_tuning(cfg, study, runs)
    study.enqueue_trial({"mem-fraction-static": 0.8 + 5 * 0.01, "concurrency": 32, **FIXED})
    tuning.optimize(3, None)
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 3 and {len(t.constraints) for t in done} == {len(CONSTRAINT_KEYS)}
    assert [missed_slos(t.constraints) for t in done] == [[], ["ttft"], []]
    assert best_trial(study)[0].number == 0
