"""The study file's `objective:` section: the metric to maximise, its SLOs, a Pareto latency;
and the names the metric goes by.

tuner's default score is `window_output_throughput`: every output token received during a load
run's window / the window's length (tuner.loadgen.metrics). bench_serving's `output_throughput` counts
completed requests only; bench_serving always waits for every request, while a duration-bounded
run cuts the requests in flight at its end, and counting only the completed ones would score a
window of long requests near zero. With nothing cut the two figures are one; with long outputs
at high concurrency they can differ several-fold, so each keeps its own name.

Study files written before the score had its own name say `metric: output_throughput` and mean
the window figure: that spelling is still accepted with that meaning (`OLD_METRIC_NAMES`), and
fingerprints hash it under the old name, so those studies resume (space.fingerprint).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from tuner.config.base import Model

#: a metric's old name in study files -> today's (the same figure)
OLD_METRIC_NAMES = {"output_throughput": "window_output_throughput"}


def today_name(value: Any) -> Any:
    """A metric's name as it is called today (an old spelling mapped; anything else as is)."""
    return OLD_METRIC_NAMES.get(value, value) if isinstance(value, str) else value


#: what `objective.metric` may be (the old spelling accepted before the check)
Metric = Annotated[
    Literal["window_output_throughput", "total_throughput", "request_throughput", "goodput"],
    BeforeValidator(today_name),
]


class SLOSection(Model):
    """Latency limits a configuration must meet to count (ms; error rate as a fraction)."""

    p99_ttft_ms: float | None = Field(None, gt=0)
    p99_tpot_ms: float | None = Field(None, gt=0)
    p99_itl_ms: float | None = Field(None, gt=0)
    p99_e2e_latency_ms: float | None = Field(None, gt=0)
    max_error_rate: float = Field(0.01, ge=0, le=1)


class ObjectiveSection(Model):
    """What to maximise, under which SLOs; optionally a Pareto front against a latency."""

    metric: Metric = (
        "window_output_throughput"  # old spelling output_throughput: config/objective.py
    )
    slo: SLOSection = SLOSection()
    pareto_latency: (
        Literal["p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2e_latency_ms"] | None
    ) = None
