"""Audit findings 7 and 8: a `--x/--no-x` switch (BooleanOptionalAction) set false launches as
`--no-x`, and the export is what that SGLang's `--config` accepts, under SGLang's full names
(an alias or prefix in the study file included); store_true flags keep their behaviour."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.report.export import best_flags, render_cmd, render_yaml
from tuner.server.launch import build_launch, flag_args
from tuner.sim.flags import parse_flags

SIM_23 = ["python", "-m", "tuner.sim", "--sim-sglang-version", "0.5.23"]


def _data(flags: dict[str, Any], version: str) -> dict[str, Any]:
    """export_data's shape for a winner measured on SGLang `version`."""
    return {
        "study": "s",
        "trial": 1,
        "flags": flags,
        "client": {},
        "objective": "window_output_throughput",
        "value": 1.0,
        "confirmation": {},
        "metrics": {},
        "server": {"version": version},
        "exported_at": "2026-12-03T00:00:00Z",
    }


def _relaunch(text: str, tmp_path: Path, version: str):
    """Parse best.yaml as the simulator's SGLang `version` does, with the header's command line."""
    path = tmp_path / "best.yaml"
    path.write_text(text)
    use = next(line for line in text.splitlines() if "use: python" in line)
    extra = shlex.split(use.split("--config best.yaml", 1)[1])
    head = ["--sim-sglang-version", version, "--sim-profile", "llama-3.1-8b-h100"]
    return parse_flags([*head, "--config", str(path), *extra])


def test_false_on_a_boolean_optional_switch_launches_as_no_flag() -> None:
    flags = {"model-path": "m", "enable-fused-qk-norm-rope": False}
    argv = build_launch(SIM_23, flags, 30000).argv
    assert "--no-enable-fused-qk-norm-rope" in argv
    ns = parse_flags([*argv[3:], "--sim-profile", "llama-3.1-8b-h100"])
    assert ns.enable_fused_qk_norm_rope is False  # not None: SGLang's own choice
    # a switch only 0.5.23 has is one whatever the version: dllm-fdfo defaults to True
    assert flag_args({"dllm-fdfo": False}) == ["--no-dllm-fdfo"]


def test_store_true_flags_keep_false_as_left_out() -> None:
    assert flag_args({"enable-metrics": False, "enable-mixed-chunk": True}) == [
        "--enable-mixed-chunk"
    ]
    # 0.5.6.post2 declares it store_true: there false is its default, and --no- is unknown
    assert flag_args({"enable-fused-qk-norm-rope": False}, "0.5.6.post2") == []


def test_an_exported_switch_goes_on_the_command_line_and_relaunches(tmp_path: Path) -> None:
    for value in (True, False):
        flags = {"model-path": "m", "enable-fused-qk-norm-rope": value, "enable-metrics": True}
        text = render_yaml(_data(flags, "0.5.23 (virtual time)"))
        assert "enable-fused-qk-norm-rope:" not in text  # 0.5.23's --config refuses the key
        ns = _relaunch(text, tmp_path, "0.5.23")
        assert ns.enable_fused_qk_norm_rope is value and ns.enable_metrics is True
        cmd = render_cmd(_data(flags, "0.5.23"))
        assert ("--no-enable-fused-qk-norm-rope" in cmd) is (not value)


def test_aliases_and_prefixes_are_exported_and_launched_under_full_names(tmp_path: Path) -> None:
    cfg = parse_study(
        study_dict(
            server={"model-path": "m", "enable-metrics-for-all": True, "tp": 1},
            space={"mem-frac": {"low": 0.8, "high": 0.9, "step": 0.01}},
        )
    )
    flags = best_flags(cfg, {"mem-frac": 0.85})
    assert list(flags) == [
        "model-path",
        "enable-metrics-for-all-schedulers",
        "tensor-parallel-size",
        "mem-fraction-static",
    ]
    ns = _relaunch(render_yaml(_data(flags, "0.5.23")), tmp_path, "0.5.23")
    assert ns.enable_metrics_for_all_schedulers is True and ns.mem_fraction_static == 0.85
    argv = build_launch(["sglang"], {**cfg.server, "mem-frac": 0.85}, 30000).argv
    assert "--tensor-parallel-size" in argv and "--enable-metrics-for-all-schedulers" in argv
    assert "--tp" not in argv and "--mem-frac" not in argv
