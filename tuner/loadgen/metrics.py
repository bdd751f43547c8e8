"""Per-request records -> bench_serving's metrics; Prometheus text -> the server's view. Pure.

Definitions follow SGLang's bench_serving (sglang-reference.md section 7):
  request throughput = completed / dur; output throughput = output tokens / dur;
  total token throughput = (input + output) / dur; TTFT = time to the first non-empty chunk;
  TPOT = (latency - ttft) / (output_len - 1) for output_len > 1; ITL = inter-chunk gap / new
  tokens in the chunk; E2E = latency; concurrency = sum(latency) / dur. Times reported in ms.

One extension: a run bounded by duration cancels its in-flight requests at the deadline. As in
bench_serving (and SGLang's counters, which count a request when it finishes), throughputs count
completed requests only; the tokens the cut requests had received are reported apart
(`cut_output`, and `window_output_throughput` = all tokens received in the window / dur).
TTFT is the exception: a cut request counts with its TTFT, or, if its first token never came,
with its wait so far (a lower bound). Otherwise the requests that queued longest, the ones an
overloaded server makes wait, would vanish from the percentiles and overload would look fast.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request. Times in seconds; `start_s` relative to the run's start."""

    index: int
    ok: bool
    prompt_len: int
    output_len: int
    start_s: float
    latency_s: float
    ttft_s: float | None = None
    itl_s: tuple[float, ...] = ()
    error: str | None = None
    cancelled: bool = False
    cached_tokens: int | None = None
    conversation: int | None = None
    turn: int = 0


@dataclass(frozen=True)
class Stats:
    """Summary of one latency series in ms (zeros for an empty series)."""

    mean: float = 0.0
    median: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    std: float = 0.0
    n: int = 0


@dataclass(frozen=True)
class Metrics:
    """bench_serving's summary of a run plus errors.

    `output_throughput` is bench_serving's: output tokens of completed requests / duration.
    `window_output_throughput` (tuner's score) also counts the tokens that requests still in
    flight at a duration-bounded run's end had received. bench_serving always waits for every
    request, so it has no such figure; here a long request cut at the deadline would otherwise
    count nothing, and a window full of them would score near zero. With nothing cut the two
    are equal; with long outputs at high concurrency they can differ several-fold.
    """

    duration_s: float
    completed: int
    errors: int
    cancelled: int
    total_input: int
    total_output: int
    cut_output: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    window_output_throughput: float
    concurrency: float
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    error_kinds: Mapping[str, int] = field(default_factory=dict)

    @property
    def error_rate(self) -> float:
        """Errors over requests that ended (completed or failed; cancelled ones excluded)."""
        ended = self.completed + self.errors
        return self.errors / ended if ended else 0.0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an already sorted sequence."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stats_ms(values_s: Iterable[float]) -> Stats:
    """Mean, median, p90/p95/p99, max and std (population, as numpy) in ms of values in s."""
    v = sorted(x * 1000.0 for x in values_s)
    if not v:
        return Stats()
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v))
    return Stats(
        mean=mean,
        median=percentile(v, 50),
        p90=percentile(v, 90),
        p95=percentile(v, 95),
        p99=percentile(v, 99),
        max=v[-1],
        std=std,
        n=len(v),
    )


def tpot_s(rec: RequestRecord) -> float | None:
    """Time per output token after the first; None when undefined (one token, no TTFT)."""
    if not rec.ok or rec.ttft_s is None or rec.output_len <= 1:
        return None
    return (rec.latency_s - rec.ttft_s) / (rec.output_len - 1)


def ttft_or_wait_s(rec: RequestRecord) -> float:
    """TTFT; for a request cut before its first token, the time it waited (a lower bound)."""
    return rec.ttft_s if rec.ttft_s is not None else rec.latency_s


def summarize(records: Sequence[RequestRecord], duration_s: float) -> Metrics:
    """bench_serving's metrics over `records` for a timed run of `duration_s` seconds."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok and not r.cancelled]
    cancelled = [r for r in records if r.cancelled]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_len for r in done)
    cut_out = sum(r.output_len for r in cancelled)
    kinds: dict[str, int] = {}
    for r in failed:
        key = (r.error or "error").split(":", 1)[0]
        kinds[key] = kinds.get(key, 0) + 1
    dur = duration_s if duration_s > 0 else 0.0

    def rate(x: float) -> float:
        return x / dur if dur else 0.0

    tpots = [t for t in (tpot_s(r) for r in done) if t is not None]
    return Metrics(
        duration_s=duration_s,
        completed=len(done),
        errors=len(failed),
        cancelled=len(cancelled),
        total_input=total_in,
        total_output=total_out,
        cut_output=cut_out,
        request_throughput=rate(len(done)),
        input_throughput=rate(total_in),
        output_throughput=rate(total_out),
        total_throughput=rate(total_in + total_out),
        window_output_throughput=rate(total_out + cut_out),
        concurrency=rate(sum(r.latency_s for r in done)),
        ttft_ms=stats_ms(ttft_or_wait_s(r) for r in (*done, *cancelled)),
        tpot_ms=stats_ms(tpots),
        itl_ms=stats_ms(x for r in done for x in r.itl_s),
        e2e_ms=stats_ms(r.latency_s for r in done),
        error_kinds=kinds,
    )


def goodput(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    e2e_ms: float | None = None,
) -> float:
    """Completed requests per second that met every given SLO (bench_serving's goodput)."""
    if duration_s <= 0:
        return 0.0
    good = 0
    for r in records:
        if not r.ok:
            continue
        if ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1000 > ttft_ms):
            continue
        t = tpot_s(r)
        if tpot_ms is not None and t is not None and t * 1000 > tpot_ms:
            continue
        if e2e_ms is not None and r.latency_s * 1000 > e2e_ms:
            continue
        good += 1
    return good / duration_s


def bench_serving_json(m: Metrics) -> dict[str, float | int]:
    """bench_serving's result keys (and its `total_token_throughput` alias) plus our additions."""
    out: dict[str, float | int] = {
        "completed": m.completed,
        "duration": m.duration_s,
        "total_input_tokens": m.total_input,
        "total_output_tokens": m.total_output,
        "request_throughput": m.request_throughput,
        "input_throughput": m.input_throughput,
        "output_throughput": m.output_throughput,
        "total_throughput": m.total_throughput,
        "total_token_throughput": m.total_throughput,
        "concurrency": m.concurrency,
        "errors": m.errors,
        "error_rate": m.error_rate,
        "cancelled": m.cancelled,
        "cut_output_tokens": m.cut_output,
        "window_output_throughput": m.window_output_throughput,
    }
    for name, s in (
        ("ttft", m.ttft_ms),
        ("tpot", m.tpot_ms),
        ("itl", m.itl_ms),
        ("e2e_latency", m.e2e_ms),
    ):
        out[f"mean_{name}_ms"] = s.mean
        out[f"median_{name}_ms"] = s.median
        out[f"std_{name}_ms"] = s.std
        out[f"p90_{name}_ms"] = s.p90
        out[f"p99_{name}_ms"] = s.p99
    out["p95_itl_ms"] = m.itl_ms.p95
    out["max_itl_ms"] = m.itl_ms.max
    return out


# ---------------------------------------------------------------- the server's view (/metrics)

#: Prometheus samples by metric name, one value per label set (histogram buckets dropped).
Samples = dict[str, list[float]]


def parse_prometheus(text: str) -> Samples:
    """Parse Prometheus exposition text into {name: [value per series]}; comments skipped."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            rest = line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        if name.endswith("_bucket"):
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        out.setdefault(name.strip(), []).append(value)
    return out


def total(samples: Samples, name: str) -> float | None:
    """Sum over series (counters and counts across ranks/models); None when absent."""
    vals = samples.get(name)
    return sum(vals) if vals else None


def mean_of(samples: Samples, name: str) -> float | None:
    """Mean over series (ratios such as token_usage across ranks); None when absent."""
    vals = samples.get(name)
    return sum(vals) / len(vals) if vals else None


@dataclass(frozen=True)
class ServerView:
    """What the server's own `/metrics` says about the run (None: the server does not export it)."""

    generation_tokens: float | None
    prompt_tokens: float | None
    cached_tokens: float | None
    requests: float | None
    output_throughput: float | None
    cache_hit_rate: float | None
    mean_running_reqs: float | None
    mean_queue_reqs: float | None
    mean_token_usage: float | None
    max_token_usage: float | None
    samples: int

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-ready mapping."""
        return asdict(self)


def _delta(before: Samples, after: Samples, name: str) -> float | None:
    a, b = total(after, name), total(before, name)
    if a is None or b is None:
        return None
    return a - b


def server_view(
    before: Samples, after: Samples, during: Sequence[Samples], duration_s: float
) -> ServerView:
    """Counter deltas between two scrapes and gauge means over the scrapes taken during the run."""
    gen = _delta(before, after, "sglang:generation_tokens_total")
    prompt = _delta(before, after, "sglang:prompt_tokens_total")
    cached = _delta(before, after, "sglang:cached_tokens_total")

    def gauge_mean(name: str, agg=total) -> float | None:
        vals = [v for v in (agg(s, name) for s in during) if v is not None]
        return sum(vals) / len(vals) if vals else None

    usage = [v for v in (mean_of(s, "sglang:token_usage") for s in during) if v is not None]
    hit: float | None = None
    if prompt and cached is not None:
        hit = cached / prompt
    elif during:
        hit = gauge_mean("sglang:cache_hit_rate", mean_of)
    return ServerView(
        generation_tokens=gen,
        prompt_tokens=prompt,
        cached_tokens=cached,
        requests=_delta(before, after, "sglang:num_requests_total"),
        output_throughput=gen / duration_s if gen is not None and duration_s > 0 else None,
        cache_hit_rate=hit,
        mean_running_reqs=gauge_mean("sglang:num_running_reqs"),
        mean_queue_reqs=gauge_mean("sglang:num_queue_reqs"),
        mean_token_usage=sum(usage) / len(usage) if usage else None,
        max_token_usage=max(usage) if usage else None,
        samples=len(during),
    )
