"""The study's pooled throughput curve: the fit, the narrowed step, and the choice of each
server's concurrency by it (pure: servers are functions of concurrency)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.paths import REPO
from tuner.config.load import parse_study
from tuner.outcome import Status, TrialOutcome
from tuner.search.curve import fit, narrowed
from tuner.trial.inner import InnerSearch

SHAPE = {8: 0.2, 64: 0.90, 91: 0.985, 99: 1.0, 108: 0.975, 118: 0.95, 153: 0.93, 256: 0.5}


def test_fit_recovers_the_shape_under_each_servers_level() -> None:
    levels = [0.93, 1.0, 1.06, 1.02]
    subsets = [(8, 64, 99, 108), (99, 108, 118, 256), (91, 108, 153), (64, 118, 153)]
    table = [{c: 2600 * lv * SHAPE[c] for c in cs} for lv, cs in zip(levels, subsets, strict=True)]
    shape = fit(table)
    assert set(shape) == set(SHAPE)
    for c in SHAPE:  # exact without noise, up to one constant
        assert shape[c] - shape[99] == pytest.approx(math.log(SHAPE[c] / SHAPE[99]), abs=1e-3)


def test_one_server_alone_ranks_its_points_as_measured() -> None:
    shape = fit([{"a": 10.0, "b": 12.0, "c": 11.0}])
    assert sorted(shape, key=shape.__getitem__) == ["a", "c", "b"]
    assert fit([]) == {} and fit([{"a": 0.0}]) == {}  # nothing measured: nothing ranked


def test_the_step_narrows_to_the_nearest_pooled_point_clearly_worse() -> None:
    shape = {c: math.log(v) for c, v in SHAPE.items()}
    # 91 and 118 are within 3% of 99 on one side... 118 is 5% worse, 1.19x away
    assert narrowed(shape, 99, 2**0.5, 1.06, 0.03) == pytest.approx(math.sqrt(118 / 99))
    assert narrowed(shape, 99, 2**0.5, 1.10, 0.03) == pytest.approx(1.10)  # the floor holds
    flat = {c: 0.0 for c in SHAPE}
    assert narrowed(flat, 99, 2**0.5, 1.06, 0.03) == 2**0.5  # nothing bracketed yet
    assert narrowed(shape, 100, 2**0.5, 1.06, 0.03) == 2**0.5  # the hint was never pooled


def _cfg() -> Any:
    d = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    return parse_study(d, "demo-sim.yaml")


def _at(c: int) -> float:
    """SHAPE between its points (linear in log concurrency)."""
    keys = sorted(SHAPE)
    lo = max([k for k in keys if k <= c], default=keys[0])
    hi = min([k for k in keys if k >= c], default=keys[-1])
    f = 0.0 if hi == lo else math.log(c / lo) / math.log(hi / lo)
    return SHAPE[lo] + f * (SHAPE[hi] - SHAPE[lo])


def _measure(level: float, bump: Mapping[int, float] | None = None) -> Callable[..., TrialOutcome]:
    """A server: `level` times SHAPE, times `bump` at some points (its own noise)."""

    def measure(params: Mapping[str, Any], where: Path) -> TrialOutcome:
        c = int(params["concurrency"])
        v = 2600 * level * _at(c) * (bump or {}).get(c, 1.0)
        metrics = {"window_output_throughput": v, "output_throughput": v}
        return TrialOutcome(Status.OK, (v,), {"c_ttft": -0.5}, metrics=metrics)

    return measure


def _run(inner: InnerSearch, tmp: Path, n: int, measure: Any, pool: int | None = None) -> Any:
    params = {"mem-fraction-static": 0.8 + n / 100}
    return inner.run(params, tmp / str(n), measure, pool, None, lambda: None, lambda: 0.0)


def _peers(levels: tuple[float, ...] = (1.0, 0.97, 1.02)) -> InnerSearch:
    """An InnerSearch after servers that measured every concurrency from 40 to 200 (their
    pools admitting all): the pooled curve is SHAPE wherever the next server looks."""
    inner = InnerSearch(_cfg())
    group = json.dumps({}, sort_keys=True)  # the flags but mem-fraction-static: none here
    for level in levels:
        inner.table.append({(group, c): 2600 * level * _at(c) for c in range(40, 201)})
    inner.best = (2600.0, 108)  # the next search starts at 108 (an earlier lucky best)
    return inner


def test_a_servers_concurrency_is_the_one_its_peers_rank_best(tmp_path: Path) -> None:
    """Three servers agree on the curve; a fourth, luckier, measures 108 4% above its curve
    (its own noise), its highest point. Its trial takes the point its peers rank best, valued
    as measured there, not its maximum."""
    out = _run(_peers(), tmp_path, 9, _measure(1.08, {108: 1.04}))
    points = {int(p["concurrency"]): p["value"] for p in out.points}
    assert max(points, key=points.__getitem__) == 108 and len(points) > 1
    best = max(points, key=_at)
    assert best != 108 and out.client == {"concurrency": best}
    assert out.values[0] == pytest.approx(points[best], rel=1e-3)


def test_a_point_where_the_pool_binds_is_judged_on_its_own_server(tmp_path: Path) -> None:
    """The same lucky server with a small pool (it holds ~88 of the demo's ~860-token
    requests at full length): beyond that its curve is its own, and so is the choice."""
    out = _run(_peers(), tmp_path, 9, _measure(1.08, {108: 1.04}), pool=76_000)
    assert out.client == {"concurrency": 108}
    # a pool that admits them all: its peers decide
    assert _run(_peers(), tmp_path, 8, _measure(1.08, {108: 1.04}), pool=10**6).client != {
        "concurrency": 108
    }


def test_recall_rebuilds_from_the_study_what_the_searches_learned(tmp_path: Path) -> None:
    """A resumed run, or another worker, recalls from the study's trials what an unbroken run
    kept in memory: the hint, the concurrencies that held, the pooled table."""
    import optuna
    from optuna.distributions import FloatDistribution

    live = InnerSearch(_cfg())
    live.start_next = 91  # the first server: where a baseline would start it
    frozen = []
    for n, level in enumerate((1.05, 0.98, 1.01)):
        out = _run(live, tmp_path, n, _measure(level, {99: 1.02}), pool=10**6 if n else 80_000)
        mfs = 0.8 + n / 100
        frozen.append(
            optuna.trial.create_trial(
                params={"mem-fraction-static": mfs},
                distributions={"mem-fraction-static": FloatDistribution(0.7, 0.99)},
                values=list(out.values),
                user_attrs={**out.to_attrs(), "max_total_num_tokens": 10**6 if n else 80_000},
                constraints=dict(out.constraints),
            )
        )
    recalled = InnerSearch(_cfg())
    recalled.recall(frozen)
    assert recalled.best == pytest.approx(live.best, rel=1e-4)
    assert recalled.seen == live.seen
    assert recalled.table == [pytest.approx(row, rel=1e-4) for row in live.table]
    assert len(live.table) == 3 and any(len(k) == 3 for k in live.table[0])  # pool bound


def test_a_shared_prefix_counts_in_every_request_where_pooling_is_judged() -> None:
    """Kimi's 32 prefixes of 2,000 tokens fill half of a 116k-token pool before any question:
    counting a prefix once would call concurrency 58 unbound where the pool binds near 30."""
    d = yaml.safe_load((REPO / "search_spaces" / "kimi-k2.5-tp8.yaml").read_text())
    inner = InnerSearch(parse_study(d, "kimi-k2.5-tp8.yaml"))
    key = inner._keyer("{}", 116_171)
    assert key(29) == ("{}", 29)  # 29 requests of 4,000 tokens fit: pooled
    assert key(40) == ("{}", 40, 0)  # its own
