"""Study-file validation: every mistake is one line naming the file and the key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config import load_study, parse_duration, parse_study
from tuner.errors import ConfigError
from tuner.space import client_params

REPO = Path(__file__).resolve().parents[2]
MINIMAL = {
    "study": "s",
    "server": {"model-path": "m"},
    "space": {"concurrency": {"low": 1, "high": 8}},
}


def test_every_shipped_study_file_parses() -> None:
    files = sorted((REPO / "search_spaces").glob("*.yaml"))
    assert files
    for f in files:
        assert load_study(f).study


def test_kinds_are_inferred() -> None:
    space = {
        "mem-fraction-static": {"low": 0.8, "high": 0.9, "step": 0.01},
        "hicache-size": {"low": 0, "high": 40, "step": 8},
        "schedule-policy": {"choices": ["fcfs", "lpm"]},
        "concurrency": {"low": 8, "high": 256, "log": True},
    }
    cfg = parse_study({**MINIMAL, "space": space})
    kinds = {k: v.kind for k, v in cfg.space.items()}
    assert kinds == {
        "mem-fraction-static": "float",
        "hicache-size": "int",
        "schedule-policy": "categorical",
        "concurrency": "int",
    }
    # every searched flag but the client's concurrency needs a restart
    assert list(client_params(dict.fromkeys(cfg.space, 1))) == ["concurrency"]


@pytest.mark.parametrize(
    ("patch", "key", "fragment"),
    [
        (
            {"space": {"mem-fraction-static": {"low": 0.95, "high": 0.9}}},
            "space.mem-fraction-static",
            "low (0.95) must be below high (0.9)",
        ),
        (
            {"space": {"mem_fraction_static": {"low": 0.8, "high": 0.9}}},
            "space",
            "dashed flag name",
        ),
        (
            {"space": {"hicache-size": {"low": 0, "high": 10, "type": "int", "step": 1.5}}},
            "space.hicache-size",
            "whole number",
        ),
        (
            {"space": {"concurrency": {"low": 0, "high": 8, "log": True}}},
            "space.concurrency",
            "low > 0",
        ),
        ({"space": {}}, "space", "at least one"),
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"target": {"hots": "x"}}, "target.hots", "unknown key"),
        ({"target": {"port": 70000}}, "target.port", "65535"),
        ({"target": {"launch": []}}, "target.launch", "non-empty"),
        ({"target": {"env": {"A-B": "1"}}}, "target.env", "environment variable"),
        ({"budget": {"timeout": "eight hours"}}, "budget.timeout", "duration"),
        ({"budget": {"n_trials": 0}}, "budget.n_trials", "greater than or equal to 1"),
        ({"objective": {"metric": "speed"}}, "objective.metric", "output_throughput"),
        ({"workload": {"kind": "sharegpt"}}, "workload", "dataset"),
        ({"server": {"tp": 8}}, "server", "model-path"),
        ({"baseline": {"mem-fraction-static": 0.8}}, "baseline", "not a searched parameter"),
        ({"study": "no spaces please"}, "study", "letters"),
        ({"sampler": {"name": "cmaes"}}, "sampler.name", "tpe"),
        (
            {"objective": {"slo": {"p99_ttft_ms": 9000}}, "workload": {"duration_s": 6}},
            "objective",
            "cannot be observed",
        ),
    ],
)
def test_bad_study_names_file_and_key(patch: dict, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_study({**MINIMAL, **patch}, source="s.yaml")
    msg = str(info.value)
    assert msg.startswith(f"s.yaml: {key}"), msg
    assert fragment in msg, msg
    assert "\n" not in msg


def test_yaml_errors_are_one_line_with_position(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("study: a\nserver: [unclosed\n")
    with pytest.raises(ConfigError, match=r"x\.yaml:\d+:\d+: invalid YAML"):
        load_study(f)
    f.write_text("study: a\nstudy: b\n")
    with pytest.raises(ConfigError, match="duplicate key 'study'"):
        load_study(f)
    f.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_study(f)
    f.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_study(f)
    with pytest.raises(ConfigError, match="no such file"):
        load_study(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("8h", 28800), (60, 60)]
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds
