"""`tuner capacity` and user mistakes through the real console entry point (subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.studies import tuner

KIMI = [
    "--model-config",
    "kimi-k2.5",
    "--tp",
    "8",
    "--gpu-mem-mib",
    "97887",
    "--observed-tokens",
    "116171",
    "--observed-mfs",
    "0.85",
    "--mfs",
    "0.95",
    "--hicache-size",
    "300",
    "--host-ram-gb",
    "449",
    "--avg-len",
    "4000",
    "--avg-len",
    "2000",
]


def test_capacity_json_motivating_case() -> None:
    out = tuner("capacity", *KIMI, "--naive", "--observed-kv-gb", "14.8", "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["bytes_per_token"] == 70_272
    assert [p["mfs"] for p in r["projection"]] == [0.85, 0.95]
    assert r["projection"][0]["max_total_num_tokens"] == 116_171
    assert r["hicache"][0]["hicache_size_gb_per_rank"] == 300 and not r["hicache"][0]["feasible"]
    assert r["naive"]["total_tokens"] == 410_523
    assert r["naive"]["mfs_linear_tokens"][0]["tokens"] == 129_838


def test_capacity_tables_show_naive_beside_corrected() -> None:
    out = tuner("capacity", *KIMI, "--naive", "--observed-kv-gb", "14.8", timeout=60)
    assert out.returncode == 0, out.stderr
    for figure in ("136,793", "70,272", "294,352", "410,523", "129,838", "2,400", "INFEASIBLE"):
        assert figure in out.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["capacity"], "--model-config"),
        (["capacity", "--model-config", "no-such-model"], "no such file"),
        (["capacity", "--model-config", "kimi-k2.5", "--tp", "x"], "invalid int value"),
        (["capacity", "--model-config", "kimi-k2.5", "--tp", "0"], "--tp"),
        (["capacity", "--model-config", "kimi-k2.5", "--mfs", "1.2"], "--mfs"),
        (["capacity", "--model-config", "kimi-k2.5", "--hicache-size", "1.5"], "whole number"),
        (["capacity", "--model-config", "kimi-k2.5", "--kv-dtype", "int3"], "invalid choice"),
        (["capacity", "--model-config", "kimi-k2.5", "--observed-tokens", "5"], "go together"),
        (["capacity", "--model-config", "kimi-k2.5", "--naive"], "--observed-kv-gb"),
        (["capacity", "--model-config", "kimi-k2.5", "--observed-kv-gb", "3"], "--naive"),
        (["capacity", "--model-config", "kimi-k2.5", "--avg-len", "-1"], "--avg-len"),
        (["capacity", "--model-config", "kimi-k2.5", "--frobnicate"], "unrecognized"),
        (["nonsense"], "invalid choice"),
        (["tune", "does-not-exist.yaml"], "no such file"),
    ],
)
def test_user_mistakes_are_one_line_exit_2(args: list[str], fragment: str) -> None:
    out = tuner(*args, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert fragment in lines[0]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"num_hidden_layers": "many"}', "num_hidden_layers"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_model_config_file(tmp_path: Path, content: str, fragment: str) -> None:
    f = tmp_path / "config.json"
    f.write_text(content)
    out = tuner("capacity", "--model-config", str(f), timeout=60)
    assert out.returncode == 2 and fragment in out.stderr and str(f) in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_study_file_writes_nothing(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(
        "study: s\nserver: {model-path: m}\nspace:\n  mem-fraction-static: {low: 0.9, high: 0.8}\n"
    )
    out = tuner("tune", str(study), timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"tuner: error: {study}: space.mem-fraction-static: low (0.9) must be below high (0.8)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]
