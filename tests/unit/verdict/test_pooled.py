"""Latency tails pooled over runs (tuner/verdict/tails.py): bins that read as numpy's percentile, from
the strict side; counts and bins that merge; one verdict on every request of several runs."""

from __future__ import annotations

import json
import random

import pytest

from tuner.config.objective import SLOSection
from tuner.loadgen.metrics import RequestRecord, percentile
from tuner.verdict.tails import (
    histogram,
    merge,
    near_limits,
    pooled_metrics,
    pooled_verdict,
    quantile,
    tails_of,
    thin_tails,
)

TTFT_S = 0.2
OUT = 101  # output tokens: TPOT = (latency - TTFT) / 100


def requests(tpots_ms: list[float], errors: int = 0, cancelled: int = 0) -> list[RequestRecord]:
    """A run's records: completed requests with these TPOTs, then failed and cut ones."""
    out = [
        RequestRecord(i, True, 100, OUT, 0.0, TTFT_S + t / 1000 * (OUT - 1), TTFT_S)
        for i, t in enumerate(tpots_ms)
    ]
    n = len(out)
    out += [RequestRecord(n + i, False, 100, 0, 0.0, 0.1, error="500") for i in range(errors)]
    n = len(out)
    out += [RequestRecord(n + i, False, 100, 3, 0.0, 5.0, cancelled=True) for i in range(cancelled)]
    return out


def tpot_run(n: int, slow: int, slow_ms: float, fast_ms: float = 30.0) -> list[RequestRecord]:
    """n requests at fast_ms TPOT of which `slow` at slow_ms."""
    return requests([fast_ms] * (n - slow) + [slow_ms] * slow)


def raw_p99(records: list[RequestRecord]) -> float:
    """The run's own p99 TPOT in ms, as tuner.loadgen.metrics computes it."""
    tpots = sorted((r.latency_s - r.ttft_s) / (r.output_len - 1) * 1000 for r in records if r.ok)
    return percentile(tpots, 99)


SLO = SLOSection(p99_tpot_ms=50)


@pytest.mark.parametrize("q", [50, 90, 99])
def test_binned_percentile_is_never_below_numpys_and_within_one_percent(q: float) -> None:
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.choice([1, 2, 3, 7, 50, 99, 100, 101, rng.randint(1, 600)])
        values_s = [rng.lognormvariate(-3, 1.2) for _ in range(n)]  # ~50 ms, a long tail
        exact = percentile(sorted(v * 1000 for v in values_s), q)
        binned = quantile(histogram(values_s), q)
        assert exact * (1 - 1e-9) <= binned <= exact * 1.01, (n, exact, binned)


def test_merged_bins_read_as_the_percentile_of_all_runs_together() -> None:
    rng = random.Random(11)
    runs = [[rng.expovariate(1 / 0.04) for _ in range(rng.randint(20, 300))] for _ in range(4)]
    merged = merge(histogram(r) for r in runs)
    assert merged == histogram(v for r in runs for v in r)
    assert sum(merged.values()) == sum(len(r) for r in runs)
    exact = percentile(sorted(v * 1000 for r in runs for v in r), 99)
    assert exact <= quantile(merged, 99) <= exact * 1.01
    assert quantile({}, 99) == 0.0


def test_tails_of_one_run_keeps_what_the_slo_limits_and_the_counts() -> None:
    recs = requests([30.0] * 97, errors=3, cancelled=5)
    tails = tails_of(recs, SLOSection(p99_tpot_ms=50, p99_ttft_ms=1000, max_error_rate=0.02))
    assert json.loads(json.dumps(tails)) == tails  # an optuna attribute as it is
    assert set(tails["bins"]) == {"p99_tpot_ms", "p99_ttft_ms"}  # no ITL, no E2E limit
    assert tails["limits"] == {"p99_tpot_ms": 50, "p99_ttft_ms": 1000, "max_error_rate": 0.02}
    assert tails["ended"] == 100 and tails["errors"] == 3  # cut requests did not end
    assert sum(tails["bins"]["p99_tpot_ms"].values()) == 97
    assert sum(tails["bins"]["p99_ttft_ms"].values()) == 97 + 5  # a cut request waited: TTFT


def test_error_rate_pools_over_every_ended_request() -> None:
    slo = SLOSection(p99_tpot_ms=50, max_error_rate=0.01)
    runs = [tails_of(requests([30.0] * (100 - e), errors=e, cancelled=4), slo) for e in (1, 0, 5)]
    pooled, missed = pooled_verdict(runs)
    assert pooled["ended"] == 300 and pooled["error_rate"] == pytest.approx(6 / 300)
    assert missed == ["error rate 2.0% > 1.0% over 3 runs (300 requests)"]
    # without the unlucky run, 1 error in 200 holds
    assert pooled_verdict(runs[:2])[1] == []


def test_pooled_misses_where_the_mean_of_the_runs_p99s_holds() -> None:
    # two runs with a few requests at 45-46 ms, one with 5% of them at 58 ms: the p99s average
    # 49.7 ms, under 50; but 10 of the 600 requests together (1.7%) are at 58 ms
    recs = [tpot_run(200, 4, 45.0), tpot_run(200, 4, 46.0), tpot_run(200, 10, 58.0)]
    p99s = [raw_p99(r) for r in recs]
    assert p99s == pytest.approx([45.0, 46.0, 58.0])
    assert sum(p99s) / 3 == pytest.approx(49.67, abs=0.01)  # holds 50 on average
    pooled, missed = pooled_verdict([tails_of(r, SLO) for r in recs])
    assert pooled["runs"] == 3 and pooled["ended"] == 600
    assert 58.0 <= pooled["p99_tpot_ms"] <= 58.0 * 1.01
    assert missed == [f"p99 TPOT {pooled['p99_tpot_ms']:.1f} ms > 50 ms over 3 runs (600 requests)"]


def test_pooled_holds_where_one_unlucky_run_drags_the_mean_of_p99s_over() -> None:
    # 2 slow requests in one run of 100 make that run's p99 100 ms (mean of p99s 53 ms), but
    # 2 in 300 together are under 1%
    recs = [tpot_run(100, 0, 30.0), tpot_run(100, 0, 30.0), tpot_run(100, 2, 100.0)]
    p99s = [raw_p99(r) for r in recs]
    assert p99s == pytest.approx([30.0, 30.0, 100.0]) and sum(p99s) / 3 > 50
    pooled, missed = pooled_verdict([tails_of(r, SLO) for r in recs])
    assert missed == [] and pooled["p99_tpot_ms"] < 31


def test_verdict_names_each_latency_it_misses_and_only_those() -> None:
    slo = SLOSection(p99_ttft_ms=100, p99_tpot_ms=50, p99_e2e_latency_ms=1000)
    # TTFT 200 ms everywhere, TPOT 30 ms, E2E 0.2 + 3.0 = 3.2 s
    pooled, missed = pooled_verdict([tails_of(tpot_run(50, 0, 30.0), slo)] * 2)
    assert [m.split(" ms")[0].rsplit(" ", 1)[0] for m in missed] == ["p99 TTFT", "p99 E2E"]
    assert all(m.endswith("over 2 runs (100 requests)") for m in missed)
    assert pooled["p99_ttft_ms"] == pytest.approx(200, rel=0.01)
    # no limits recorded: nothing to miss
    assert pooled_verdict([{"ended": 3, "errors": 3, "bins": {}}])[1] == []


def test_a_latency_missing_from_a_run_is_not_pooled() -> None:
    a = tails_of(tpot_run(10, 0, 30.0), SLOSection(p99_tpot_ms=50, p99_itl_ms=20))
    b = tails_of(tpot_run(10, 0, 30.0), SLO)
    assert "p99_itl_ms" not in pooled_metrics([a, b]) and "p99_tpot_ms" in pooled_metrics([a, b])


def test_near_limits_names_the_latencies_held_by_less_than_the_margin() -> None:
    pooled = {
        "p99_tpot_ms": 48.0,  # within 5% of 50: held, by luck as often as not
        "p99_ttft_ms": 900.0,  # far below 1000
        "error_rate": 0.0099,  # error rates are counts, not a start's luck: never "near"
        "limits": {"p99_tpot_ms": 50, "p99_ttft_ms": 1000, "max_error_rate": 0.01},
    }
    assert near_limits(pooled) == ["p99_tpot_ms"]
    assert near_limits(pooled, margin=0.11) == ["p99_tpot_ms", "p99_ttft_ms"]
    assert near_limits({**pooled, "p99_tpot_ms": 51.0}) == []  # a miss is not "near": it missed
    assert near_limits({"p99_tpot_ms": 49.0}) == []  # no limits recorded, nothing to be near


def test_a_p99_over_fewer_than_100_values_a_run_is_thin() -> None:
    """The median run's count decides (one long run does not give the others a tail); runs
    without tails (a death) are left out; TTFT counts every request started, TPOT those ended."""
    slo = SLOSection(p99_ttft_ms=1000, p99_tpot_ms=50)
    short = tails_of(requests([30.0] * 6, cancelled=20), slo)
    long = tails_of(requests([30.0] * 150), slo)
    assert thin_tails([short, short, long, None]) == {"p99_ttft_ms": 26, "p99_tpot_ms": 6}
    assert thin_tails([long, long, short]) == {}
    assert thin_tails([None]) == {}
