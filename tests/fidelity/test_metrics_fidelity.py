"""SGLang's /metrics: names, labels and histogram buckets per version, against the simulator.

Facts name SGLang's collectors: OLD = v0.5.6.post2 `sglang/srt/metrics/collector.py` (MC) and
`managers/scheduler_metrics_mixin.py`; NEW = v0.5.23 `sglang/srt/observability/
metrics_collector.py` (OC), file:line.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers.played import MODEL, NEW, OLD, VERSIONS, get, played, post, sse

SERIES = re.compile(r"^(sglang:\w+)\{([^}]*)\} (\S+)$")


@pytest.fixture(scope="module", params=VERSIONS)
def scraped(request):
    """(version, {metric name: [label dict, ...]}, raw text) after one streamed, one whole."""
    with played(request.param) as sim:
        body = {"text": "a b c d", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
        assert post(sim, "/generate", body)[0] == 200
        sse(sim, "/generate", body)
        status, text = get(sim, "/metrics")
        assert status == 200
        series: dict[str, list[dict[str, str]]] = {}
        for line in text.splitlines():
            m = SERIES.match(line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
                series.setdefault(m.group(1), []).append(labels)
        yield request.param, series, text


def label_names(series: dict, name: str) -> list[str]:
    return list(series[name][0])


def test_scheduler_gauge_labels(scraped):
    version, series, _ = scraped
    # OLD scheduler_metrics_mixin.py:63-71: model_name, engine_type "unified", tp_rank, pp_rank
    # NEW OC:1377-1392: the same plus moe_ep_rank (engine_type from
    # disaggregation/utils.py:156-161: "unified" without disaggregation)
    expected = ["model_name", "engine_type", "tp_rank", "pp_rank"]
    if version == NEW:
        expected.append("moe_ep_rank")
    for name in (
        "num_running_reqs",
        "token_usage",
        "num_queue_reqs",
        "gen_throughput",
        "cache_hit_rate",
        "max_total_num_tokens",
        "num_used_tokens",
        "num_retracted_reqs",
    ):
        labels = series[f"sglang:{name}"][0]
        assert list(labels) == expected, name
        assert labels["model_name"] == MODEL and labels["engine_type"] == "unified"
        assert labels["tp_rank"] == "0" and labels["pp_rank"] == "0"


def test_tokenizer_counter_labels(scraped):
    version, series, _ = scraped
    if version == OLD:
        # tokenizer_manager.py:361-364 labels = {"model_name"}; MC:744-818 counters
        for name in (
            "prompt_tokens_total",
            "generation_tokens_total",
            "num_requests_total",
            "cached_tokens_total",
        ):
            assert [list(s) for s in series[f"sglang:{name}"]] == [["model_name"]], name
        return
    # OC:1804-1812 tokenizer_metric_labels: model_name, engine_type; OC:1856-1941 add
    # is_streaming to the request counters ("true"/"false", OC:2105-2108)
    for name in ("prompt_tokens_total", "generation_tokens_total", "num_requests_total"):
        got = {s["is_streaming"] for s in series[f"sglang:{name}"]}
        assert got == {"true", "false"} and label_names(series, f"sglang:{name}") == [
            "model_name",
            "engine_type",
            "is_streaming",
        ]
    requests = {s["is_streaming"] for s in series["sglang:num_requests_total"]}
    assert requests == {"true", "false"}
    # OC:1935-1939 cached_tokens_total by cache_source, only once some tokens were cached
    for labels in series.get("sglang:cached_tokens_total", []):
        assert list(labels) == ["model_name", "engine_type", "cache_source"]


def buckets(text: str, name: str) -> list[str]:
    first = None
    out = []
    for line in text.splitlines():
        if line.startswith(f"sglang:{name}_bucket{{"):
            key = line.split('le="')[0]
            first = first or key
            if key == first:
                out.append(line.split('le="')[1].split('"')[0])
    return out


def test_histogram_buckets_and_labels(scraped):
    version, series, text = scraped
    # MC:830-903 (OLD) = OC:1955-2037 (NEW): the default bucket bounds
    assert buckets(text, "time_to_first_token_seconds") == [
        "0.1",
        "0.2",
        "0.4",
        "0.6",
        "0.8",
        "1.0",
        "2.0",
        "4.0",
        "6.0",
        "8.0",
        "10.0",
        "20.0",
        "40.0",
        "60.0",
        "80.0",
        "100.0",
        "200.0",
        "400.0",
        "+Inf",
    ]
    assert buckets(text, "e2e_request_latency_seconds")[-5:] == [
        "600.0",
        "1200.0",
        "1800.0",
        "2400.0",
        "+Inf",
    ]
    itl = buckets(text, "inter_token_latency_seconds")
    assert itl[:3] == ["0.002", "0.004", "0.006"] and itl[-2:] == ["8.0", "+Inf"] and len(itl) == 24
    ttft = series["sglang:time_to_first_token_seconds_count"]
    e2e = series["sglang:e2e_request_latency_seconds_count"]
    itl_count = series["sglang:inter_token_latency_seconds_count"]
    if version == OLD:  # MC:906-924: model_name only
        assert [list(s) for s in ttft + e2e + itl_count] == [["model_name"]] * 3
    else:  # OC:2041-2071: is_streaming on TTFT and E2E, not on ITL
        assert {s["is_streaming"] for s in ttft} == {"true", "false"}
        assert {s["is_streaming"] for s in e2e} == {"true", "false"}
        assert [list(s) for s in itl_count] == [["model_name", "engine_type"]]


def test_radix_cache_counter_labels(scraped):
    version, series, _ = scraped
    evicted = series["sglang:evicted_tokens_total"][0]
    load_back = series["sglang:load_back_tokens_total"][0]
    if version == OLD:  # mem_cache/base_prefix_cache.py:63-66: {"cache_type": class name}
        assert evicted == {"cache_type": "RadixCache"} == load_back
    else:  # OC:2416-2432 radix_cache_metric_labels; OC:2553-2560 load-backs add "pool"
        assert list(evicted) == ["cache_type", "tp_rank", "pp_rank", "dp_rank"]
        assert list(load_back) == [*evicted, "pool"] and load_back["pool"] == "kv"
