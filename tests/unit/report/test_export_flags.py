"""The export writes the flags as the winner's SGLang version spells them, and warns about
the ones it would refuse, naming the successor."""

from __future__ import annotations

from typing import Any

from tuner.check.flagset import version_problems
from tuner.report.export import render_yaml
from tuner.sglang.flags import spelled_for


def _data(flags: dict[str, Any], version: str) -> dict[str, Any]:
    """export_data's shape for a winner measured on SGLang `version`."""
    data: dict[str, Any] = {
        "study": "s",
        "trial": 3,
        "flags": flags,
        "client": {},
        "objective": "output_throughput",
        "value": 1000.0,
        "confirmation": {},
        "metrics": {},
        "server": {"version": version},
        "exported_at": "2026-12-02T05:00:00Z",
    }
    if warnings := version_problems(spelled_for(data["flags"], version), version):
        data["warnings"] = warnings
    return data


def test_a_flag_the_version_split_is_written_under_its_successor() -> None:
    # 0.5.23 refuses --cuda-graph-max-bs as ambiguous (argparse prefix of -decode and -prefill);
    # the decode graphs are what 0.5.6.post2's flag sized (tables.REPLACED)
    flags = {"model-path": "m", "cuda-graph-max-bs": 160, "mem-fraction-static": 0.85}
    text = render_yaml(_data(flags, "0.5.23"))
    assert "WARNING" not in text
    assert "cuda-graph-max-bs-decode: 160" in text and "cuda-graph-max-bs: " not in text
    assert "# written as SGLang 0.5.23 spells it: --cuda-graph-max-bs as " in text


def test_dp_attention_is_written_as_0_5_23_spells_it() -> None:
    # 0.5.23's --config refuses the deprecated switch (server_args_config_parser.py:50-60);
    # parallel_hook.py:40-63 reads it as --attn-dp-size D with dp_size 1
    flags = {"model-path": "m", "enable-dp-attention": True, "data-parallel-size": 8}
    text = render_yaml(_data(flags, "0.5.23"))
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == ["model-path: m", "attn-dp-size: 8"]
    assert "launch_server --config best.yaml\n" in text  # nothing left for the command line
    old = render_yaml(_data(flags, "0.5.6.post2"))
    assert "enable-dp-attention: true" in old and "data-parallel-size: 8" in old
    assert spelled_for({**flags, "enable-dp-attention": False}, "0.5.23") == {
        **flags,
        "enable-dp-attention": False,
    }


def test_a_flag_a_version_does_not_know_is_still_a_warning() -> None:
    flags = {"model-path": "m", "enable-hicache": True}  # 0.5.23's alias, unknown in 0.5.6.post2
    text = render_yaml(_data(flags, "0.5.6.post2"))
    assert any(line.startswith("# WARNING: --enable-hicache") for line in text.splitlines())


def test_no_warning_when_every_flag_exists_or_the_version_is_unknown() -> None:
    flags = {"model-path": "m", "cuda-graph-max-bs": 160, "tp": 2}
    assert "warnings" not in _data(flags, "0.5.6.post2")
    assert "warnings" not in _data(flags, "0.9.0")  # no table: SGLang judges
    assert "WARNING" not in render_yaml(_data(flags, "0.5.6.post2"))
