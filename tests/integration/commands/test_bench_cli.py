"""`tuner bench` end to end: the real console script against a fake SGLang on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.helpers.fake_http import FakeConfig, FakeSGLang, ServerThread
from tests.helpers.paths import DATA
from tests.helpers.studies import tuner


def bench(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tuner bench ARGV`, the real console script in a subprocess."""
    return tuner("bench", *argv, timeout=120, env=env)


def test_bench_writes_bench_serving_json(tmp_path: Path) -> None:
    fake = FakeSGLang(FakeConfig(token_delay_s=0.001))
    out = tmp_path / "r.json"
    with ServerThread(fake) as srv:
        p = bench(
            "--url",
            srv.url,
            "--concurrency",
            "4",
            "--num-requests",
            "12",
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--range-ratio",
            "1",
            "--json",
            str(out),
            "--no-progress",
        )
    assert p.returncode == 0, p.stderr
    assert "Serving Benchmark Result" in p.stdout and "Output token throughput" in p.stdout
    r = json.loads(out.read_text())
    for key in (
        "completed",
        "duration",
        "request_throughput",
        "output_throughput",
        "total_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_itl_ms",
        "p99_e2e_latency_ms",
        "p90_ttft_ms",
        "concurrency",
        "errors",
        "self_check",
        "server",
    ):
        assert key in r, key
    assert r["completed"] == 12 and r["total_output_tokens"] == 96
    assert r["output_throughput"] == pytest.approx(96 / r["duration"])
    assert r["server"]["generation_tokens"] == 96
    assert r["max_concurrency"] == 4 and r["backend"] == "sglang"


def test_bench_chat_backend_with_api_key_and_dataset(tmp_path: Path) -> None:
    fake = FakeSGLang(FakeConfig(api_key="k3y"))
    out = tmp_path / "r.json"
    with ServerThread(fake) as srv:
        p = bench(
            "--url",
            srv.url,
            "--concurrency",
            "2",
            "--backend",
            "openai-chat",
            "--workload",
            "jsonl",
            "--dataset",
            str(DATA / "prompts.jsonl"),
            "--api-key-env",
            "BENCH_KEY",
            "--json",
            str(out),
            env={"BENCH_KEY": "k3y"},  # with the progress display (on stderr)
        )
    assert p.returncode == 0, p.stderr
    assert "k3y" not in p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["completed"] == 3 and r["total_output_tokens"] == 64 + 8 + 256


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--concurrency", "0"], "--concurrency: must be >= 1"),
        (["--concurrency", "2", "--workload", "jsonl"], "--dataset"),
        (["--concurrency", "2", "--workload", "jsonl", "--dataset", "BAD"], "prompts_bad.jsonl:3"),
        (["--concurrency", "2", "--api-key-env", "NO_SUCH_VAR_X"], "NO_SUCH_VAR_X"),
        (["--concurrency", "2", "--duration", "1", "--num-requests", "3"], "not allowed"),
        (["--concurrency", "two"], "invalid int"),
        (["--concurrency", "2", "--input-len", "0"], "--input-len: must be >= 1"),
    ],
)
def test_bad_arguments_one_line_exit_2(argv: list[str], needle: str, tmp_path: Path) -> None:
    argv = [str(DATA / "prompts_bad.jsonl") if a == "BAD" else a for a in argv]
    p = bench("--url", "http://127.0.0.1:9", *argv, "--no-progress")
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


def test_bad_url_is_usage_error() -> None:
    p = bench("--url", "localhost:30000", "--concurrency", "1", "--no-progress")
    assert p.returncode == 2 and "--url" in p.stderr


def test_unreachable_url_exit_1_one_line() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = bench(
        "--url",
        f"http://127.0.0.1:{port}",
        "--concurrency",
        "1",
        "--num-requests",
        "2",
        "--no-progress",
    )
    assert p.returncode == 1
    assert "cannot reach" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_server_that_never_answers_is_exit_1_not_an_empty_result(tmp_path: Path) -> None:
    """Connections accepted, no token ever: nothing was measured, so no exit 0 (and no JSON)."""
    out = tmp_path / "r.json"
    with ServerThread(FakeSGLang(FakeConfig(hang_every=1))) as srv:
        p = bench(
            *("--url", srv.url, "--concurrency", "2", "--duration", "1", "--no-progress"),
            *("--json", str(out)),
        )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "answered no token" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr and not out.exists()


@pytest.mark.slow
def test_bench_against_the_simulator(tmp_path: Path) -> None:
    from tests.helpers.simproc import sim_server

    out = tmp_path / "sim.json"
    with sim_server("--sim-profile", "llama-3.1-8b-h100", "--enable-metrics") as sim:
        p = bench(
            "--url",
            sim.url,
            "--concurrency",
            "8",
            "--num-requests",
            "24",
            "--workload",
            "shared-prefix",
            "--num-groups",
            "3",
            "--prompts-per-group",
            "8",
            "--prefix-len",
            "300",
            "--question-len",
            "20",
            "--output-len",
            "16",
            "--flush-cache",
            "--json",
            str(out),
            "--no-progress",
        )
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["completed"] == 24 and r["total_output_tokens"] == 24 * 16
    assert r["server"]["generation_tokens"] == r["total_output_tokens"]
    assert r["server"]["cache_hit_rate"] > 0.5


def test_bench_takes_bench_serving_flag_names(tmp_path: Path) -> None:
    """A bench_serving command line works as typed; its JSONL output file is appended to."""
    fake = FakeSGLang(FakeConfig(token_delay_s=0.001))
    out = tmp_path / "results.jsonl"
    out.write_text('{"earlier": "run"}\n')
    with ServerThread(fake) as srv:
        p = bench(
            *("--backend", "sglang-native", "--base-url", srv.url, "--max-concurrency", "4"),
            *("--num-prompts", "12", "--dataset-name", "random", "--random-input-len", "32"),
            *("--random-output-len", "8", "--random-range-ratio", "1", "--request-rate", "inf"),
            *("--seed", "3", "--warmup-requests", "1", "--disable-tqdm"),
            *("--output-file", str(out)),
        )
    assert p.returncode == 0, p.stderr
    earlier, line = out.read_text().splitlines()
    r = json.loads(line)
    assert r["backend"] == "sglang" and r["dataset_name"] == "random"
    assert r["max_concurrency"] == 4 and r["request_rate"] is None
    assert (r["random_input_len"], r["random_output_len"], r["random_range_ratio"]) == (32, 8, 1.0)
    assert r["completed"] == 12 and r["total_output_tokens"] == 96
    assert r["output_throughput"] == pytest.approx(96 / r["duration"])  # bench_serving's own


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--profile"], "--profile is a bench_serving option tuner bench does not support"),
        (["--tokenizer", "meta-llama/x"], "--tokenizer is a bench_serving option"),
        (["--dataset-name", "mmmu"], "--dataset-name: tuner bench builds random"),
        (["--dataset-name", "sharegpt"], "--dataset-path: a sharegpt workload needs"),
        (["--backend", "trt"], "--backend: 'trt' is not an API tuner speaks"),
        (["--random-input-len", "0"], "--random-input-len: must be >= 1"),
    ],
)
def test_bench_serving_flags_it_cannot_honour_are_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture
) -> None:
    from tuner.cli import main

    try:  # in this process: these stop before any request
        code = main(["bench", "--max-concurrency", "2", "--disable-tqdm", *argv])
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
