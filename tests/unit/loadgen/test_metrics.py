"""bench_serving's metric math on hand-made records; Prometheus parsing; the server's view."""

from __future__ import annotations

import pytest

from tuner.loadgen.metrics import (
    RequestRecord,
    bench_serving_json,
    goodput,
    parse_prometheus,
    percentile,
    server_view,
    stats_ms,
    summarize,
)


def rec(i: int, out: int, lat: float, ttft: float | None, itl=(), ok=True, **kw) -> RequestRecord:
    return RequestRecord(
        index=i,
        ok=ok,
        prompt_len=kw.pop("prompt", 10),
        output_len=out,
        start_s=0.0,
        latency_s=lat,
        ttft_s=ttft,
        itl_s=tuple(itl),
        **kw,
    )


def test_throughputs_latencies_and_concurrency() -> None:
    records = [
        rec(0, 5, 1.0, 0.2, itl=[0.2] * 4),
        rec(1, 9, 2.0, 0.4, itl=[0.2] * 8),
        rec(2, 1, 0.5, 0.5),  # single token: no TPOT, no ITL
    ]
    m = summarize(records, duration_s=4.0)
    assert m.completed == 3 and m.errors == 0 and m.cancelled == 0
    assert m.total_input == 30 and m.total_output == 15
    assert m.request_throughput == pytest.approx(0.75)
    assert m.output_throughput == pytest.approx(15 / 4)
    assert m.total_throughput == pytest.approx(45 / 4)
    assert m.concurrency == pytest.approx(3.5 / 4)
    assert m.ttft_ms.mean == pytest.approx(1100 / 3)
    assert m.ttft_ms.median == pytest.approx(400)
    # TPOT = (lat - ttft) / (out - 1): 0.8/4 = 200 ms and 1.6/8 = 200 ms; the 1-token one excluded
    assert m.tpot_ms.n == 2 and m.tpot_ms.mean == pytest.approx(200)
    assert m.itl_ms.n == 12 and m.itl_ms.max == pytest.approx(200)
    assert m.e2e_ms.median == pytest.approx(1000) and m.e2e_ms.max == pytest.approx(2000)


def test_percentiles_match_numpy_linear() -> None:
    v = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(v, 50) == 3.0
    assert percentile(v, 90) == pytest.approx(7.6)  # numpy.percentile(v, 90)
    assert percentile(v, 99) == pytest.approx(9.76)
    assert percentile([5.0], 99) == 5.0
    s = stats_ms([0.001, 0.002, 0.003, 0.004])
    assert s.mean == pytest.approx(2.5) and s.std == pytest.approx(1.118034, rel=1e-5)
    assert s.p90 == pytest.approx(3.7) and s.p95 == pytest.approx(3.85)


def test_errors_and_cancelled_requests() -> None:
    records = [
        rec(0, 4, 1.0, 0.1, itl=[0.3] * 3),
        rec(1, 0, 0.2, None, ok=False, error="http 500: boom"),
        rec(2, 0, 5.0, None, ok=False, error="timeout"),
        rec(3, 0, 5.0, None, ok=False, error="timeout"),
        rec(4, 3, 0.7, 0.1, ok=False, error="cancelled", cancelled=True, prompt=100),
        rec(5, 0, 0.7, None, ok=False, error="cancelled", cancelled=True, prompt=1000),
    ]
    m = summarize(records, duration_s=2.0)
    assert (m.completed, m.errors, m.cancelled) == (1, 3, 2)
    assert m.error_kinds == {"http 500": 1, "timeout": 2}
    assert m.error_rate == pytest.approx(0.75)
    # as bench_serving, only completed requests count; cut tokens are reported apart
    assert m.total_output == 4 and m.total_input == 10 and m.cut_output == 3
    assert m.output_throughput == pytest.approx(2.0)
    assert m.window_output_throughput == pytest.approx(3.5)
    assert m.e2e_ms.n == 1 and m.concurrency == pytest.approx(0.5)


def test_empty_run_is_all_zeros() -> None:
    m = summarize([], duration_s=0.0)
    assert m.completed == 0 and m.output_throughput == 0.0 and m.error_rate == 0.0
    assert m.ttft_ms.mean == 0.0 and m.itl_ms.n == 0
    j = bench_serving_json(m)
    assert j["completed"] == 0 and j["p99_ttft_ms"] == 0.0


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = [
        rec(0, 5, 1.0, 0.2),  # ttft 200, tpot 200
        rec(1, 5, 3.0, 0.6),  # ttft 600, tpot 600
        rec(2, 1, 0.3, 0.3),  # single token: tpot undefined, passes a tpot SLO
        rec(3, 0, 0.1, None, ok=False, error="timeout"),
    ]
    assert goodput(records, 1.0) == 3.0
    assert goodput(records, 2.0, ttft_ms=500) == 1.0
    assert goodput(records, 1.0, tpot_ms=300) == 2.0
    assert goodput(records, 1.0, ttft_ms=250, e2e_ms=500) == 0.0
    assert goodput(records, 0.0) == 0.0


def test_bench_serving_keys() -> None:
    m = summarize([rec(0, 5, 1.0, 0.2, itl=[0.2] * 4)], 2.0)
    j = bench_serving_json(m)
    for key in (
        "completed",
        "duration",
        "request_throughput",
        "output_throughput",
        "total_throughput",
        "total_token_throughput",
        "concurrency",
        "errors",
    ):
        assert key in j
    for name in ("ttft", "tpot", "itl", "e2e_latency"):
        for stat in ("mean", "median", "p90", "p99"):
            assert f"{stat}_{name}_ms" in j
    assert j["p95_itl_ms"] == pytest.approx(200) and j["max_itl_ms"] == pytest.approx(200)
    assert j["total_token_throughput"] == j["total_throughput"] == pytest.approx(7.5)


PROM_BEFORE = """# HELP sglang:generation_tokens_total Number of generation tokens.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 1000.0
sglang:prompt_tokens_total{model_name="m"} 5000.0
sglang:cached_tokens_total{model_name="m"} 100.0
sglang:num_requests_total{model_name="m"} 10.0
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 0.5
"""
PROM_AFTER = (
    PROM_BEFORE.replace("1000.0", "3000.0")
    .replace("5000.0", "9000.0")
    .replace("100.0", "2100.0")
    .replace("} 10.0", "} 30.0")
)


def test_parse_prometheus_sums_series_and_drops_buckets() -> None:
    text = 'sglang:num_running_reqs{tp_rank="0"} 3\nsglang:num_running_reqs{tp_rank="1"} 5\nup 1\n'
    s = parse_prometheus(PROM_BEFORE + text)
    assert s["sglang:num_running_reqs"] == [3.0, 5.0]
    assert s["sglang:generation_tokens_total"] == [1000.0]
    assert "sglang:time_to_first_token_seconds_bucket" not in s
    assert s["sglang:time_to_first_token_seconds_sum"] == [0.5] and s["up"] == [1.0]


def test_server_view_deltas_and_gauge_means() -> None:
    during = [
        parse_prometheus(
            "sglang:num_running_reqs 10\nsglang:num_queue_reqs 4\nsglang:token_usage 0.5\n"
        ),
        parse_prometheus(
            "sglang:num_running_reqs 20\nsglang:num_queue_reqs 0\nsglang:token_usage 0.9\n"
        ),
    ]
    v = server_view(parse_prometheus(PROM_BEFORE), parse_prometheus(PROM_AFTER), during, 4.0)
    assert v.generation_tokens == 2000 and v.prompt_tokens == 4000 and v.cached_tokens == 2000
    assert v.requests == 20 and v.output_throughput == pytest.approx(500)
    assert v.cache_hit_rate == pytest.approx(0.5)
    assert v.mean_running_reqs == 15 and v.mean_queue_reqs == 2
    assert v.mean_token_usage == pytest.approx(0.7) and v.max_token_usage == pytest.approx(0.9)
    assert v.samples == 2


def test_server_view_without_metrics_is_none_fields() -> None:
    v = server_view({}, {}, [], 1.0)
    assert (
        v.generation_tokens is None and v.output_throughput is None and v.mean_running_reqs is None
    )


def test_cut_requests_count_in_ttft_with_their_wait() -> None:
    """Under overload the queued requests are the ones cut: dropping them would hide the wait."""
    done = [rec(i, 10, 1.0, 0.1) for i in range(9)]
    queued = rec(9, 0, 5.0, None, ok=False, cancelled=True)  # waited 5 s, no token yet
    started = rec(10, 3, 5.0, 2.0, ok=False, cancelled=True)  # first token after 2 s, then cut
    m = summarize([*done, queued, started], 5.0)
    assert m.completed == 9 and m.cancelled == 2
    assert m.ttft_ms.max == pytest.approx(5000)  # the queued one's wait, a lower bound
    assert m.ttft_ms.n == 11
    assert m.e2e_ms.n == 9  # latency stays a completed-request figure, as in bench_serving
