"""Prometheus text for the simulator's `/metrics`, named and labelled as SGLang does. Pure.

Which collector a metric belongs to decides its labels (tests/fidelity/test_metrics_fidelity.py names the
source lines):

* scheduler gauges: `model_name, engine_type, tp_rank, pp_rank` (0.5.23: `, moe_ep_rank`); only
  rank 0 reports, as SGLang's stats-logging rank;
* tokenizer counters and histograms: `model_name` (0.5.23: `model_name, engine_type`, plus
  `is_streaming` on the request counters, TTFT and E2E, and `cache_source` on cached tokens);
* radix-cache counters: `cache_type` (0.5.23: `cache_type, tp_rank, pp_rank, dp_rank`, plus
  `pool` on load-backs).
Gauges and the 0.5.6.post2 counters come from `Engine.stats()`; the latency histograms and the
per-stream request tallies are observed by the server as tokens are delivered.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.sim.http.oaishapes import newer


def _bounds(text: str) -> tuple[float, ...]:
    """Histogram bucket bounds written as one line of numbers."""
    return tuple(float(x) for x in text.split())


#: SGLang's default bucket bounds (seconds), the same in 0.5.6.post2 and 0.5.23
BUCKETS: Mapping[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": _bounds(
        "0.1 0.2 0.4 0.6 0.8 1 2 4 6 8 10 20 40 60 80 100 200 400"
    ),
    "inter_token_latency_seconds": _bounds(
        "0.002 0.004 0.006 0.008 0.010 0.015 0.020 0.025 0.030 0.035 0.040 0.060 0.080 "
        "0.100 0.200 0.400 0.600 0.800 1.0 2.0 4.0 6.0 8.0"
    ),
    "e2e_request_latency_seconds": _bounds(
        "0.1 0.2 0.4 0.6 0.8 1 2 4 6 8 10 20 40 60 80 100 200 400 600 1200 1800 2400"
    ),
}
HIST_HELP = {
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "e2e_request_latency_seconds": "Histogram of End-to-end request latency in seconds",
}
#: histograms SGLang 0.5.23 splits by `is_streaming`
STREAM_SPLIT = ("time_to_first_token_seconds", "e2e_request_latency_seconds")

GAUGES = {
    "num_running_reqs": "The number of running requests.",
    "num_used_tokens": "The number of used tokens.",
    "token_usage": "The token usage.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "cache_hit_rate": "The prefix cache hit rate.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "num_retracted_reqs": "The number of retracted requests.",
    # registered whatever the algorithm, 0 without speculative decoding (0.5.6.post2
    # metrics/collector.py:306-318; 0.5.23 observability/metrics_collector.py:511-522)
    "spec_accept_length": "The average acceptance length of speculative decoding.",
    "spec_accept_rate": (
        "The average acceptance rate of speculative decoding "
        "(`accepted tokens / total draft tokens` in batch)."
    ),
}
#: 0.5.23's words for the speculative gauges
GAUGES_NEW_HELP = {
    "spec_accept_length": (
        "Mean acceptance length of speculative decoding (accepted drafts + bonus token per "
        "forward)."
    ),
    "spec_accept_rate": (
        "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."
    ),
}
COUNTERS = {
    "prompt_tokens_total": "Number of prefill tokens processed.",
    "generation_tokens_total": "Number of generation tokens processed.",
    "cached_tokens_total": "Number of cached prompt tokens.",
    "num_requests_total": "Number of requests processed.",
}
CACHE_COUNTERS = {
    "evicted_tokens_total": "The number of tokens evicted from GPU to CPU.",
    "load_back_tokens_total": "The number of tokens loaded from CPU to GPU.",
}


class Histograms:
    """Cumulative-bucket histograms and the finished-request tallies, per `is_streaming`."""

    def __init__(self) -> None:
        self.counts = {
            (name, s): [0] * (len(b) + 1) for name, b in BUCKETS.items() for s in (False, True)
        }
        self.sums = dict.fromkeys(self.counts, 0.0)
        #: is_streaming -> [prompt tokens, generation tokens, cached tokens, requests]
        self.tally = {False: [0, 0, 0, 0], True: [0, 0, 0, 0]}

    def observe(self, name: str, value: float, stream: bool = False) -> None:
        """Add one observation (seconds), O(log buckets)."""
        self.counts[name, stream][bisect.bisect_left(BUCKETS[name], value)] += 1
        self.sums[name, stream] += value

    def finished(self, prompt: int, generated: int, cached: int, stream: bool) -> None:
        """Count one finished request (0.5.23's counters are split by stream)."""
        t = self.tally[stream]
        t[0] += prompt
        t[1] += generated
        t[2] += cached
        t[3] += 1


def _labels(**kv: Any) -> str:
    return ",".join(f'{k}="{v}"' for k, v in kv.items())


def _family(out: list[str], name: str, kind: str, help_text: str) -> None:
    out += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} {kind}"]


def _histogram(out: list[str], name: str, counts: list[int], total: float, label: str) -> None:
    running = 0
    for bound, count in zip(BUCKETS[name], counts, strict=False):
        running += count
        out.append(f'sglang:{name}_bucket{{{label},le="{bound}"}} {float(running)}')
    running += counts[-1]
    out.append(f'sglang:{name}_bucket{{{label},le="+Inf"}} {float(running)}')
    out.append(f"sglang:{name}_sum{{{label}}} {total}")
    out.append(f"sglang:{name}_count{{{label}}} {float(running)}")


def render(
    stats: Any,
    hist: Histograms,
    model_name: str,
    version: str = "0.5.6.post2",
    cache_type: str = "RadixCache",
    groups: Sequence[Any] = (),
    attn_tp: int = 1,
) -> str:
    """The `/metrics` body of the version played (module docstring). `groups`: each DP
    attention group's stats, whose scheduler gauges are series of their own, labelled with the
    group's first TP rank and its `dp_rank` (0.5.6.post2 scheduler_metrics_mixin.py:63-71,
    0.5.23 observability/metrics_collector.py:1384-1392)."""
    new = newer(version)
    sched = dict(model_name=model_name, engine_type="unified", tp_rank=0, pp_rank=0)
    tok = dict(model_name=model_name)
    cache = dict(cache_type=cache_type)
    if new:
        sched["moe_ep_rank"] = 0
        tok["engine_type"] = "unified"
        cache.update(tp_rank=0, pp_rank=0, dp_rank=0)
    series = [(sched, stats)]
    if groups:
        series = [
            ({**sched, "tp_rank": g * attn_tp, "dp_rank": g}, group)
            for g, group in enumerate(groups)
        ]
    out: list[str] = []
    for name, help_text in GAUGES.items():
        _family(out, name, "gauge", GAUGES_NEW_HELP.get(name, help_text) if new else help_text)
        for labels, values in series:
            value = float(getattr(values, name, 0) or 0)
            out.append(f"sglang:{name}{{{_labels(**labels)}}} {value}")
    for i, (name, help_text) in enumerate(COUNTERS.items()):  # i: the tally's column
        _family(out, name, "counter", help_text)
        if not new:
            out.append(f"sglang:{name}{{{_labels(**tok)}}} {float(getattr(stats, name, 0) or 0)}")
        elif name == "cached_tokens_total":  # by source; the simulator's hits are all on device
            cached = hist.tally[False][2] + hist.tally[True][2]
            if cached:
                out.append(
                    f'sglang:{name}{{{_labels(**tok)},cache_source="device"}} {float(cached)}'
                )
        else:
            for stream in (False, True):
                label = _labels(**tok, is_streaming=str(stream).lower())
                out.append(f"sglang:{name}{{{label}}} {float(hist.tally[stream][i])}")
    for name in BUCKETS:
        _family(out, name, "histogram", HIST_HELP[name])
        if new and name in STREAM_SPLIT:
            for stream in (False, True):
                label = _labels(**tok, is_streaming=str(stream).lower())
                key = (name, stream)
                _histogram(out, name, hist.counts[key], hist.sums[key], label)
            continue
        # 0.5.6.post2, and ITL in both: one series for streamed and whole responses
        a, b = hist.counts[name, False], hist.counts[name, True]
        total = hist.sums[name, False] + hist.sums[name, True]
        _histogram(out, name, [x + y for x, y in zip(a, b, strict=True)], total, _labels(**tok))
    for name, help_text in CACHE_COUNTERS.items():
        _family(out, name, "counter", help_text)
        label = _labels(**cache, **({"pool": "kv"} if new and name.startswith("load") else {}))
        out.append(f"sglang:{name}{{{label}}} {float(getattr(stats, name, 0) or 0)}")
    return "\n".join(out) + "\n"
