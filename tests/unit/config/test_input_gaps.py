"""Study-file inputs that once ended in a traceback or were accepted and then ignored: each is
now one ConfigError line naming the file and the key path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.paths import REPO
from tuner.config.load import load_study, parse_study
from tuner.config.yamlfile import special_file
from tuner.errors import ConfigError

DEMO = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())


def _demo(**sections: Any) -> dict[str, Any]:
    data = copy.deepcopy(DEMO)
    for name, patch in sections.items():
        if isinstance(patch, dict) and isinstance(data.get(name), dict):
            data[name].update(patch)
        else:
            data[name] = patch
    return data


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_study(data, source="s.yaml")
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


def _error_from_yaml(tmp_path: Path, text: str) -> str:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_study(f)
    msg = str(info.value).replace(str(f), "s.yaml")
    assert "\n" not in msg, msg
    return msg


# --- 1. NUL bytes: refused wherever they are, by key path --------------------------------------


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"workload": {"kind": "jsonl", "dataset": "a\0b"}}, "workload.dataset"),
        ({"target": {"launch": ["python", "-m", "x", "a\0b"]}}, "target.launch.3"),
        ({"target": {"workdir": "/tmp\0x"}}, "target.workdir"),
        ({"storage": "sqlite:////tmp/a\0b.db"}, "storage"),
        ({"server": {"served-model-name": "a\0b"}}, "server.served-model-name"),
        ({"target": {"env": {"X": "a\0b"}}}, "target.env.X"),
        ({"target": {"gpus": "0\0"}}, "target.gpus"),
        ({"hardware": {"model_config": "llama\0"}}, "hardware.model_config"),
    ],
)
def test_nul_byte_in_a_value_names_its_key(sections: dict[str, Any], key: str) -> None:
    msg = _error(_demo(**sections))
    assert msg.startswith(f"s.yaml: {key}: contains a NUL byte (\\x00)"), msg


def test_nul_byte_in_a_key_names_its_section() -> None:
    msg = _error(_demo(target={"env": {"A\0B": "1"}}))
    assert msg == "s.yaml: target.env: key 'A\\x00B' contains a NUL byte (\\x00)", msg


def test_nul_byte_from_a_yaml_escape(tmp_path: Path) -> None:
    text = (REPO / "search_spaces" / "demo-sim.yaml").read_text()
    text = text.replace("kind: random", 'kind: jsonl\n  dataset: "a\\0b"')
    msg = _error_from_yaml(tmp_path, text)
    assert msg.startswith("s.yaml: workload.dataset: contains a NUL byte"), msg


def test_special_file_tolerates_a_nul_byte() -> None:
    assert special_file(Path("/tmp/a\0b")) is None


# --- 2. model-path must name a model -------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   ", 5, True])
def test_blank_model_path_is_refused(value: Any) -> None:
    server = {**DEMO["server"], "model-path": value}
    msg = _error(_demo(server=server))
    assert msg.startswith("s.yaml: server.model-path: expected the model's path"), msg


# --- 3. workload keys the chosen kind would ignore -----------------------------------------


@pytest.mark.parametrize(
    ("workload", "key", "fragment"),
    [
        ({"dataset": "x.jsonl"}, "dataset", "kind random ignores dataset"),
        ({"kind": "multi-turn", "dataset_output_len": 9}, "dataset_output_len", "sharegpt or"),
        ({"turns": 3}, "turns", "applies to kind multi-turn"),
        ({"num_groups": 3}, "num_groups", "applies to kind shared-prefix"),
        ({"prompts_per_group": 3}, "prompts_per_group", "shared-prefix"),
        ({"prefix_len": 3}, "prefix_len", "shared-prefix"),
        ({"question_len": 3}, "question_len", "shared-prefix or multi-turn"),
        ({"shuffle": False}, "shuffle", "kind random ignores shuffle"),
        ({"kind": "shared-prefix"}, "input_len", "prefix_len + question_len"),
        ({"kind": "jsonl", "dataset": "x", "length_dist": "fixed"}, "length_dist", "kind jsonl"),
        ({"lognormal_sigma": 1.0}, "lognormal_sigma", "length_dist: lognormal only"),
    ],
)
def test_a_key_the_kind_ignores_is_refused(workload: dict, key: str, fragment: str) -> None:
    msg = _error(_demo(workload=workload))
    assert msg.startswith(f"s.yaml: workload.{key}: "), msg
    assert fragment in msg, msg


def test_the_default_kind_is_named_as_such() -> None:
    msg = _error(_demo(workload={"dataset": "x.jsonl"}))
    assert "kind random (default)" not in msg  # the demo writes kind: random
    data = _demo()
    data["workload"] = {"dataset": "x.jsonl"}
    msg = _error(data)
    assert "kind random (default) ignores dataset" in msg, msg


def test_keys_left_at_their_defaults_are_not_refused() -> None:
    data = _demo()
    data["workload"] = {"kind": "jsonl", "dataset": "x.jsonl", "output_len": 64}
    assert parse_study(data).workload.kind == "jsonl"
    data["workload"] = {"kind": "shared-prefix", "num_groups": 2, "prompts_per_group": 2}
    assert parse_study(data).workload.num_groups == 2
    data["workload"] = {"kind": "random", "length_dist": "lognormal", "lognormal_sigma": 1.0}
    assert parse_study(data).workload.lognormal_sigma == 1.0
    data["workload"] = {"kind": "random", "dataset": None}
    assert parse_study(data).workload.dataset is None


# --- 4. a client setting fixed and searched at once ----------------------------------------


def test_request_rate_fixed_and_searched_is_refused() -> None:
    data = _demo(workload={"request_rate": 5}, space={"request-rate": {"low": 1, "high": 10}})
    msg = _error(data)
    assert msg == (
        "s.yaml: workload.request_rate: is also searched under space.request-rate: "
        "keep it in one place"
    ), msg


def test_concurrency_fixed_under_server_and_searched_is_refused() -> None:
    server = {**DEMO["server"], "concurrency": 8}
    msg = _error(_demo(server=server))
    assert msg.startswith("s.yaml: server.concurrency: "), msg
    assert "keep it in one place" in msg, msg


# --- 5. key paths without pydantic's union branches ----------------------------------------


def test_a_date_value_names_the_flag_and_the_yaml_reason(tmp_path: Path) -> None:
    text = (REPO / "search_spaces" / "demo-sim.yaml").read_text()
    text = text.replace("  enable-metrics: true", "  served-model-name: 2024-01-01")
    msg = _error_from_yaml(tmp_path, text)
    assert msg.startswith("s.yaml: server.served-model-name: expected a string, a number"), msg
    assert ".str" not in msg and "more problem" not in msg, msg
    assert "quote it" in msg, msg


@pytest.mark.parametrize(
    ("key", "shown", "reason"),
    [("yes", "True", "boolean"), ("~", "None", "null"), ("12", "12", "number")],
)
def test_a_key_yaml_made_no_string_says_so(tmp_path: Path, key: str, shown: str, reason) -> None:
    text = (REPO / "search_spaces" / "demo-sim.yaml").read_text()
    text = text.replace("  enable-metrics: true", f"  {key}: 1")
    msg = _error_from_yaml(tmp_path, text)
    assert msg.startswith(f"s.yaml: server: key {shown} must be a string flag name ("), msg
    assert reason in msg and msg.endswith("quote it"), msg
    assert "[key]" not in msg, msg


def test_a_nested_choice_names_the_choice() -> None:
    space = {**DEMO["space"], "chunked-prefill-size": {"choices": [[1, 2]]}}
    msg = _error(_demo(space=space))
    assert msg == (
        "s.yaml: space.chunked-prefill-size.choices.0: "
        "expected a string, a number or a bool (got [1, 2])"
    ), msg


def test_a_when_comparison_names_its_place() -> None:
    space = {**DEMO["space"], "hicache-size": {"low": 0, "high": 8, "when": {"x": None}}}
    msg = _error(_demo(space=space))
    assert msg.startswith("s.yaml: space.hicache-size.when.x: expected a string"), msg
    assert "list[" not in msg and "dict[" not in msg, msg


# --- 6. a range type given choices ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["int", "float"])
def test_a_range_type_with_choices_says_so(kind: str) -> None:
    space = {**DEMO["space"], "chunked-prefill-size": {"type": kind, "choices": [1, 2]}}
    msg = _error(_demo(space=space))
    assert msg.startswith(
        f"s.yaml: space.chunked-prefill-size: type {kind} takes low and high, not choices"
    ), msg


def test_half_a_range_names_the_missing_bound() -> None:
    space = {**DEMO["space"], "chunked-prefill-size": {"low": 1024}}
    msg = _error(_demo(space=space))
    assert msg == "s.yaml: space.chunked-prefill-size: expected high as well as low", msg


def test_shipped_study_files_still_parse() -> None:
    for f in sorted((REPO / "search_spaces").glob("*.yaml")):
        assert load_study(f).study
