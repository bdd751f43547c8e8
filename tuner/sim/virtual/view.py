"""The server's /metrics in a virtual load run, as the client would scrape it. Pure."""

from __future__ import annotations

import math

from tuner.loadgen.metrics import ServerView
from tuner.sim.engine import Engine, EngineStats


class ViewSampler:
    """The server's /metrics as the client would scrape it: counters before and after, gauges
    once per `interval_s` of the run."""

    def __init__(self, engine: Engine, t0: float, interval_s: float):
        self.engine = engine
        self.before = engine.stats()
        self.interval = interval_s if interval_s > 0 else math.inf
        self.next_at = t0 + self.interval
        self.samples: list[EngineStats] = []
        self.t0 = t0

    def sample_until(self, now: float) -> None:
        while self.next_at <= now:
            self.samples.append(self.engine.stats())
            self.next_at += self.interval

    def view(self, duration_s: float) -> ServerView:
        a, b = self.engine.stats(), self.before
        gen = a.generation_tokens_total - b.generation_tokens_total
        prompt = a.prompt_tokens_total - b.prompt_tokens_total
        cached = a.cached_tokens_total - b.cached_tokens_total
        s = self.samples

        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        usage = [x.token_usage for x in s]
        return ServerView(
            generation_tokens=float(gen),
            prompt_tokens=float(prompt),
            cached_tokens=float(cached),
            requests=float(a.num_requests_total - b.num_requests_total),
            output_throughput=gen / duration_s if duration_s > 0 else None,
            cache_hit_rate=cached / prompt if prompt else mean([x.cache_hit_rate for x in s]),
            mean_running_reqs=mean([float(x.num_running_reqs) for x in s]),
            mean_queue_reqs=mean([float(x.num_queue_reqs) for x in s]),
            mean_token_usage=mean(usage),
            max_token_usage=max(usage) if usage else None,
            samples=len(s),
        )
