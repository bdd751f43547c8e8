"""The export warns about flags the winner's SGLang version would refuse, naming the successor."""

from __future__ import annotations

from typing import Any

from tuner.check.flagset import version_problems
from tuner.report.export import render_yaml


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
    if warnings := version_problems(data["flags"], version):
        data["warnings"] = warnings
    return data


def test_a_flag_the_version_split_is_a_warning_in_the_yaml_header() -> None:
    flags = {"model-path": "m", "cuda-graph-max-bs": 160, "mem-fraction-static": 0.85}
    text = render_yaml(_data(flags, "0.5.23"))
    header = [line for line in text.splitlines() if line.startswith("# WARNING")]
    assert header == [
        "# WARNING: --cuda-graph-max-bs: ambiguous on SGLang 0.5.23 (could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill) (SGLang 0.5.23 split it into "
        "--cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill)"
    ]
    assert "cuda-graph-max-bs: 160" in text  # the winner as measured; the user decides


def test_no_warning_when_every_flag_exists_or_the_version_is_unknown() -> None:
    flags = {"model-path": "m", "cuda-graph-max-bs": 160, "tp": 2}
    assert "warnings" not in _data(flags, "0.5.6.post2")
    assert "warnings" not in _data(flags, "0.9.0")  # no table: SGLang judges
    assert "WARNING" not in render_yaml(_data(flags, "0.5.6.post2"))
