"""A trial's flags are normalized once, where they enter the trial (`TrialRunner.flags_for`),
and passed on as they are: the pre-check, what a failure teaches and the launch read the
normalized value instead of resolving every name again (4 times per trial before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tuner.sglang.flags as sglang_flags
from tests.helpers.prepared import STUDY, scripted_tuning
from tuner.config.load import parse_study
from tuner.sglang.flags import LaunchFlags, effective_flags

#: the study's fixed flags name two of them by SGLang's aliases and prefixes
FIXED = {"tp": 1, "mem-frac": 0.5}


def runner_counting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Any, list[dict]]:
    """The scripted runner, and the flag sets `full_names` (the normalization) is asked for."""
    cfg = parse_study({**STUDY, "server": {**STUDY["server"], "tp": 1}})
    runner = scripted_tuning(cfg, None, tmp_path).runner  # type: ignore[arg-type]
    calls: list[dict] = []
    real = sglang_flags.full_names

    def counting(flags: Any) -> dict[str, Any]:
        calls.append(dict(flags))
        return real(flags)

    monkeypatch.setattr(sglang_flags, "full_names", counting)
    return runner, calls


@pytest.mark.parametrize(
    ("mfs", "concurrency", "status"),
    [
        (0.87, 64, "ok"),  # started, measured
        (0.95, 64, "start_failed"),  # CUDA-graph OOM: learned from
        (0.90, 128, "died"),  # died under load: learned from
    ],
)
def test_a_trials_flags_are_normalized_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mfs: float, concurrency: int, status: str
) -> None:
    runner, calls = runner_counting(monkeypatch, tmp_path)
    params = {"mem-fraction-static": mfs, "concurrency": concurrency}
    outcome = runner.run(1, params, tmp_path / "t1")
    assert outcome.status == status
    assert len(calls) == 1, calls
    assert calls[0]["mem-fraction-static"] == mfs and calls[0]["tp"] == 1


def test_a_rejection_normalizes_once_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runner, calls = runner_counting(monkeypatch, tmp_path)
    runner.run(1, {"mem-fraction-static": 0.95, "concurrency": 64}, tmp_path / "t1")
    calls.clear()
    outcome = runner.run(2, {"mem-fraction-static": 0.97, "concurrency": 64}, tmp_path / "t2")
    assert outcome.status == "rejected" and "0.95" in outcome.reason
    assert len(calls) == 1


def test_the_flags_a_trial_passes_on_are_launch_flags(tmp_path: Path) -> None:
    cfg = parse_study(
        {
            **STUDY,
            "server": {**STUDY["server"], **FIXED},
            "space": {
                "concurrency": STUDY["space"]["concurrency"],
                "hicache-size": {"choices": [0, 40]},
            },
        }
    )
    runner = scripted_tuning(cfg, None, tmp_path).runner  # type: ignore[arg-type]
    flags = runner.flags_for({"hicache-size": 40, "concurrency": 8})
    assert isinstance(flags, LaunchFlags)
    assert flags["tensor-parallel-size"] == 1 and flags["mem-fraction-static"] == 0.5
    assert flags["enable-hierarchical-cache"] is True and "concurrency" not in flags
    assert effective_flags(flags) is flags  # taken as it is, never resolved again
    off = runner.flags_for({"hicache-size": 0, "concurrency": 8})
    assert "enable-hierarchical-cache" not in off and "hicache-size" not in off
