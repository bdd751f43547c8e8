"""Where the next server's inner search starts (trial/inner.py `InnerSearch.pool_moved`): the
study's best concurrency, moved in step with the KV pool only where that pool placed it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.outcome import Status, TrialOutcome
from tuner.search.mode import NAME
from tuner.trial.inner import InnerSearch

MFS = "mem-fraction-static"


def _search() -> InnerSearch:
    """Requests of 1,000 + 1,000 tokens: a pool of 100,000 tokens holds 50 at full length."""
    data = study_dict(
        study="hint",
        space={MFS: {"low": 0.8, "high": 0.95}, NAME: {"low": 4, "high": 256, "log": True}},
        workload={"kind": "random", "input_len": 1000, "output_len": 1000, "range_ratio": 1.0},
    )
    return InnerSearch(parse_study(data, "hint.yaml"))


def _point(c: int, value: float) -> dict[str, Any]:
    return {NAME: c, "value": value, "feasible": True, "clear": True}


def test_a_best_its_pool_placed_moves_with_the_next_servers_pool() -> None:
    s = _search()
    assert s.holds(100_000) == 50
    s._learn({MFS: 0.85}, 100_000, [_point(45, 900.0)], 45, 900.0)  # 0.9 of what it holds
    assert s.pool_moved(45, 175_000) == 79  # 1.75 x the pool: 1.75 x the requests
    assert s.pool_moved(45, 50_000) == 22  # and half of it, half
    assert s.pool_moved(45, None) == 45  # a pool not reported: the hint as it was


def test_a_best_placed_by_a_latency_limit_stays_where_it_was() -> None:
    s = _search()
    s._learn({MFS: 0.85}, 100_000, [_point(20, 600.0)], 20, 600.0)  # 0.4 of what it holds
    assert s.pool_moved(20, 175_000) == 20
    unknown = _search()
    unknown._learn({MFS: 0.85}, None, [_point(45, 900.0)], 45, 900.0)
    assert unknown.pool_moved(45, 175_000) == 45


def test_the_next_server_starts_there(tmp_path: Path) -> None:
    s = _search()
    s._learn({MFS: 0.85}, 100_000, [_point(45, 900.0)], 45, 900.0)
    asked: list[int] = []

    def measure(params: Mapping[str, Any], where: Path) -> TrialOutcome:
        asked.append(int(params[NAME]))
        return TrialOutcome(Status.OK, (float(asked[-1]),), {})

    s.run({MFS: 0.91}, tmp_path, measure, 175_000, None, lambda: None, lambda: 0.0)
    assert asked[0] == 79, asked
