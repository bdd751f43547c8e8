"""Audit findings 5 and 6: `hicache-size` decides whether HiCache is on, wherever it is set
(server: or space:), and the launch, the pre-check and the export all see the same flags."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.studies import study_dict
from tuner.capacity.precheck import Hardware, Knowledge, precheck
from tuner.config.load import parse_study
from tuner.errors import ConfigError
from tuner.report.export import best_flags
from tuner.search.space import server_flags
from tuner.server.launch import build_launch, effective_flags

SPACE = {"mem-fraction-static": {"low": 0.8, "high": 0.9, "step": 0.01}}


def study(server: dict[str, Any], space: dict[str, Any] | None = None):
    return parse_study(study_dict(server={"model-path": "m", **server}, space=space or SPACE))


def launched(cfg, params: dict[str, Any]) -> list[str]:
    """The argv a trial runs (as runner.flags_for merges the fixed and the trial's flags)."""
    flags = {**cfg.server, **server_flags(params)}
    return list(build_launch(["sglang"], flags, 30000).argv)


def test_a_fixed_positive_hicache_size_turns_hicache_on_at_launch_and_in_the_export() -> None:
    cfg = study({"hicache-size": 60})
    argv = launched(cfg, {"mem-fraction-static": 0.85})
    assert "--enable-hierarchical-cache" in argv and "60" in argv
    assert best_flags(cfg, {"mem-fraction-static": 0.85})["enable-hierarchical-cache"] is True


def test_a_searched_zero_turns_off_a_fixed_enable_flag_and_drops_hicache_flags() -> None:
    cfg = study(
        {"enable-hierarchical-cache": True, "hicache-write-policy": "write_back"},
        {**SPACE, "hicache-size": {"choices": [0, 20]}},
    )
    off = launched(cfg, {"mem-fraction-static": 0.85, "hicache-size": 0})
    assert not any(a.startswith(("--enable-hierarchical", "--hicache")) for a in off)
    flags = best_flags(cfg, {"mem-fraction-static": 0.85, "hicache-size": 0})
    assert not any(k.startswith(("enable-hierarchical", "hicache")) for k in flags)
    on = launched(cfg, {"mem-fraction-static": 0.85, "hicache-size": 20})
    assert "--enable-hierarchical-cache" in on and "--hicache-write-policy" in on


def test_the_precheck_judges_the_hicache_the_server_is_launched_with() -> None:
    hw = Hardware(host_ram_gb=50)
    flags = {"model-path": "m", "mem-fraction-static": 0.85, "hicache-size": 60}
    assert not precheck(flags, hw, Knowledge()).feasible  # on: 60 GB cannot fit in 50
    # a searched 0 is off even with the enable flag fixed: nothing to judge
    off = {"model-path": "m", "enable-hierarchical-cache": True, "hicache-size": 0}
    assert precheck(off, hw, Knowledge()).feasible
    assert effective_flags(off) == {"model-path": "m"}


@pytest.mark.parametrize(
    ("server", "words"),
    [
        ({"enable-hierarchical-cache": True, "hicache-size": 0}, "0 means HiCache off"),
        ({"enable-hierarchical-cache": False, "hicache-size": 40}, "turns HiCache on"),
    ],
)
def test_contradictory_fixed_hicache_flags_are_refused_in_one_line(server, words) -> None:
    with pytest.raises(ConfigError) as exc:
        study(server)
    text = str(exc.value)
    assert "server.hicache-size" in text and words in text and "\n" not in text
