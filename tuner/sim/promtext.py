"""Prometheus text for the simulator's `/metrics`, named as SGLang names its metrics. Pure.

Gauges and counters come from `Engine.stats()`; the three latency histograms are observed by the
server as tokens are delivered.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any


def _bounds(text: str) -> tuple[float, ...]:
    """Histogram bucket bounds written as one line of numbers."""
    return tuple(float(x) for x in text.split())


#: SGLang's bucket bounds (seconds)
BUCKETS: Mapping[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": _bounds(
        "0.1 0.2 0.4 0.6 0.8 1.0 2.0 4.0 6.0 8.0 10.0 20.0 40.0 60.0 80.0 120.0 160.0"
    ),
    "inter_token_latency_seconds": _bounds(
        "0.002 0.004 0.006 0.008 0.010 0.015 0.020 0.025 0.030 0.035 0.040 0.060 0.080 "
        "0.100 0.200 0.400 0.600 0.800 1.0 2.0 4.0 6.0 8.0"
    ),
    "e2e_request_latency_seconds": _bounds(
        "0.1 0.2 0.4 0.6 0.8 1.0 2.0 4.0 6.0 8.0 10.0 20.0 40.0 60.0 80.0 100.0 "
        "150.0 200.0 250.0 300.0 350.0 500.0 1000.0"
    ),
}

GAUGES = {
    "num_running_reqs": "The number of running requests.",
    "num_used_tokens": "The number of used tokens.",
    "token_usage": "The token usage.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "cache_hit_rate": "The prefix cache hit rate.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "num_retracted_reqs": "The number of retracted requests.",
}
COUNTERS = {
    "prompt_tokens_total": "Number of prefill tokens processed.",
    "generation_tokens_total": "Number of generation tokens processed.",
    "cached_tokens_total": "Number of cached prompt tokens.",
    "num_requests_total": "Number of requests processed.",
    "load_back_tokens_total": "Number of tokens loaded back from the host cache (HiCache).",
    "evicted_tokens_total": "Number of tokens evicted from the device cache.",
}


class Histograms:
    """Cumulative-bucket histograms (O(log buckets) per observation)."""

    def __init__(self) -> None:
        self.counts = {name: [0] * (len(b) + 1) for name, b in BUCKETS.items()}
        self.sums = dict.fromkeys(BUCKETS, 0.0)

    def observe(self, name: str, value: float) -> None:
        """Add one observation (seconds)."""
        self.counts[name][bisect.bisect_left(BUCKETS[name], value)] += 1
        self.sums[name] += value


def render(stats: Any, hist: Histograms, model_name: str) -> str:
    """The `/metrics` body: `sglang:<name>{model_name="..."}` gauges, counters, histograms."""
    label = f'model_name="{model_name}"'
    out: list[str] = []
    for name, help_text in GAUGES.items():
        out += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} gauge"]
        out.append(f"sglang:{name}{{{label}}} {float(getattr(stats, name, 0) or 0)}")
    for name, help_text in COUNTERS.items():
        out += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} counter"]
        out.append(f"sglang:{name}{{{label}}} {float(getattr(stats, name, 0) or 0)}")
    for name, bounds in BUCKETS.items():
        out += [
            f"# HELP sglang:{name} Histogram of {name.replace('_', ' ')}.",
            f"# TYPE sglang:{name} histogram",
        ]
        running = 0
        counts = hist.counts[name]
        for bound, count in zip(bounds, counts, strict=False):
            running += count
            out.append(f'sglang:{name}_bucket{{{label},le="{bound}"}} {float(running)}')
        running += counts[-1]
        out.append(f'sglang:{name}_bucket{{{label},le="+Inf"}} {float(running)}')
        out.append(f"sglang:{name}_sum{{{label}}} {hist.sums[name]}")
        out.append(f"sglang:{name}_count{{{label}}} {float(running)}")
    return "\n".join(out) + "\n"
