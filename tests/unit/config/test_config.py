"""Study-file validation: every mistake is one line naming the file and the key path."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path

import pytest

from tests.helpers.studies import REPO, study_dict
from tuner.config.base import parse_duration
from tuner.config.load import load_study, parse_study
from tuner.config.target import Timeouts
from tuner.errors import ConfigError
from tuner.search.space import client_params


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
    cfg = parse_study(study_dict(space=space))
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
        parse_study(study_dict(**patch), source="s.yaml")
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


@pytest.mark.parametrize(
    ("patch", "key", "fragment"),
    [
        ({"budget": {"n_trials": True}}, "budget.n_trials", "valid integer"),
        ({"workload": {"duration_s": float("inf")}}, "workload.duration_s", "finite"),
        ({"workload": {"input_len": 10**9}}, "workload.input_len", "at most"),
        ({"server": {"model-path": "m", "hicache-size": 1.5}}, "server.hicache-size", "int"),
        ({"server": {"model-path": "m", "api-key": "x"}}, "server.api-key", "api_key_env"),
        ({"server": {"model-path": "m", "bogus-flag": 1}}, "server.bogus-flag", "unknown"),
        (
            {"space": {"mem-fractoin-static": {"low": 0.8, "high": 0.9}}},
            "space.mem-fractoin-static",
            "did you mean mem-fraction-static",
        ),
        (
            {"space": {"mem-fraction-static": {"low": 0.8, "high": 1.2}}},
            "space.mem-fraction-static",
            "fraction in (0, 1)",
        ),
        ({"baseline": {"concurrency": 99}}, "baseline.concurrency", "outside"),
        (
            {
                "server": {"model-path": "m", "tp": 8, "hicache-size": 60},
                "hardware": {"host_ram_gb": 449},
            },
            "server.hicache-size",
            "8 ranks x 60 GB = 480 GB",
        ),
        (
            {
                "server": {"model-path": "m", "tp-size": 4},
                "space": {"hicache-size": {"low": 200, "high": 300, "type": "int"}},
                "hardware": {"host_ram_gb": 449},
            },
            "space.hicache-size",
            "largest that fits: 109 GB per rank",
        ),
        (
            {"server": {"model-path": "m", "tp": 2, "tensor-parallel-size": 2}},
            "server",
            "same flag",
        ),
    ],
)
def test_values_checked_against_sglang_and_the_space(patch: dict, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_study(study_dict(**patch), source="s.yaml")
    msg = str(info.value)
    assert msg.startswith(f"s.yaml: {key}"), msg
    assert fragment in msg, msg


def test_secret_words_are_whole_words() -> None:
    from tuner.config.validate import is_secret

    assert is_secret("api-key") and is_secret("hf-token") and is_secret("db-password")
    assert not is_secret("max-total-tokens") and not is_secret("tokenizer-path")


def test_unchecked_flags_pass_as_given() -> None:
    cfg = parse_study(
        study_dict(
            server={"model-path": "m", "enable-lora": True},
            target={"unchecked_flags": ["enable-lora"]},
        )
    )
    assert cfg.server["enable-lora"] is True


def test_non_utf8_study_file_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_bytes("study: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_study(p)


def test_a_fifo_or_device_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from tuner.config.yamlfile import special_file

    os.mkfifo(tmp_path / "s.yaml")
    with pytest.raises(ConfigError, match="FIFO, not a regular file"):
        load_study(tmp_path / "s.yaml")  # reading it would block forever
    assert special_file(Path("/dev/zero")) == "a device, not a regular file"
    assert special_file(tmp_path) is None  # a directory: the reader names it
    assert special_file(tmp_path / "missing") is None
    bad = study_dict(hardware={"model_config": "/dev/zero"})
    with pytest.raises(ConfigError, match=r"hardware\.model_config: /dev/zero: a device"):
        parse_study(bad, "s.yaml")


def test_oversized_and_deeply_nested_yaml_are_one_line(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1 << 20) + b"\n")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_study(big)
    deep = tmp_path / "deep.yaml"
    deep.write_text("study: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_study(deep)


def test_an_alias_bomb_is_rendered_briefly(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)
    ]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join([*levels, "study: *a8", ""]))
    with pytest.raises(ConfigError) as err:
        load_study(bomb)  # repr of 10**9 items by reference would never return
    # The file's path is the tmp dir's, whose length varies by machine: bound the rest.
    message = str(err.value).removeprefix(f"{bomb}: ")
    assert message.startswith("study:") and len(message) < 200


def test_a_storage_password_is_masked_even_when_the_url_is_unparsable() -> None:
    from tuner.study.storage import check_url, masked

    for url in (
        "postgresql://u:hun/ter@2@127.0.0.1:notaport/db",
        "postgresql://u:a:b@127.0.0.1:x/db",
        "pg:u:hunter2@host",
    ):
        shown = masked(url)
        assert "hunter2" not in shown and "ter@2" not in shown and "a:b" not in shown, shown
        assert "***" in shown
    assert masked("not a url at all") == "not a url at all"
    with pytest.raises(ConfigError) as err:
        check_url("postgresql://u:hun/ter@2@127.0.0.1:notaport/db", key="--storage")
    assert "ter@2" not in str(err.value)


def test_flags_of_a_newer_sglang_are_checked_against_its_table() -> None:
    # the study names no version: a flag only 0.5.23 has is the host's to judge (tuner check,
    # export), but its value is checked against 0.5.23's table here
    server = {"model-path": "m", "cuda-graph-max-bs-decode": 64, "enable-hicache": True}
    assert parse_study(study_dict(server=server)).server["cuda-graph-max-bs-decode"] == 64
    bad = {**server, "cuda-graph-max-bs-decode": "many"}
    with pytest.raises(ConfigError, match=r"server\.cuda-graph-max-bs-decode: expected a whole"):
        parse_study(study_dict(server=bad))
    with pytest.raises(ConfigError, match=r"server\.enable-lorax: unknown SGLang flag"):
        parse_study(study_dict(server={"model-path": "m", "enable-lorax": True}))


def test_poll_waits_start_short_and_double_up_to_poll_s() -> None:
    """A group gone or a server ready just after the first look is seen within 0.05 s; a long
    start-up is polled every poll_s, never more often than the schedule says."""
    waits = list(islice(Timeouts(poll_s=1.0).poll_waits(), 8))
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert list(islice(Timeouts(poll_s=0.02).poll_waits(), 3)) == [0.02, 0.02, 0.02]
