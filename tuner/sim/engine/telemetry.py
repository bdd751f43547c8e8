"""What the simulated scheduler reports: SGLang's log lines, lifetime counters, gen throughput."""

from __future__ import annotations

from tuner.sim.http.oaishapes import newer


class Counters:
    """Lifetime counters (Prometheus `*_total`): they survive flush_cache."""

    __slots__ = ("cached", "gen", "load_back", "prompt", "requests", "retracted")

    def __init__(self) -> None:
        self.prompt = 0
        self.gen = 0
        self.cached = 0
        self.requests = 0
        self.load_back = 0
        self.retracted = 0

    def finished(self, prompt_tokens: int, gen_tokens: int, cached_tokens: int) -> None:
        """Count one finished or aborted request."""
        self.requests += 1
        self.prompt += prompt_tokens
        self.gen += gen_tokens
        self.cached += cached_tokens

    @property
    def cache_hit_rate(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0


class DecodeMeter:
    """Decode steps and the gen throughput SGLang logs every `interval` of them."""

    __slots__ = ("gen_since_log", "gen_throughput", "interval", "last_log", "steps")

    def __init__(self, interval: int):
        self.interval = max(1, interval)
        self.steps = 0
        self.last_log = 0.0
        self.gen_since_log = 0
        self.gen_throughput = 0.0

    def record(self, batch: int, t_end: float) -> bool:
        """Count one decode step ending at `t_end`; True when its log line is due."""
        self.steps += 1
        self.gen_since_log += batch
        if self.steps % self.interval:
            return False
        elapsed = t_end - self.last_log
        self.gen_throughput = self.gen_since_log / elapsed if elapsed > 0 else 0.0
        self.last_log = t_end
        self.gen_since_log = 0
        return True


def prefill_line(
    new_seq: int,
    new_token: int,
    cached: int,
    usage: float,
    running: int,
    queued: int,
    version: str = "0.5.6.post2",
    pending: int = 0,
    input_throughput: float = 0.0,
) -> str:
    """SGLang's log line for a prefill batch (0.5.23 adds pending tokens and throughput)."""
    line = (
        f"Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, "
        f"#cached-token: {cached}, token usage: {usage:.2f}, "
        f"#running-req: {running}, #queue-req: {queued},"
    )
    if newer(version):
        line += (
            f" #pending-token: {pending}, cuda graph: False, "
            f"input throughput (token/s): {input_throughput:.2f}"
        )
    return line


def decode_line(
    running: int,
    used: int,
    usage: float,
    cuda_graph: bool,
    gen_throughput: float,
    queued: int,
    version: str = "0.5.6.post2",
    accept: tuple[float, float] | None = None,
) -> str:
    """SGLang's log line for a decode step (every `--decode-log-interval` steps); `accept`:
    speculative decoding's (accept len, accept rate) since the last line, written after the
    token usage (0.5.6.post2 scheduler_metrics_mixin.py:270-294, 0.5.23
    metrics_reporter.py:963-1005)."""
    spec = "" if accept is None else f"accept len: {accept[0]:.2f}, accept rate: {accept[1]:.2f}, "
    return (
        f"Decode batch, #running-req: {running}, #token: {used}, "
        f"token usage: {usage:.2f}, {spec}cuda graph: {cuda_graph}, "
        f"gen throughput (token/s): {gen_throughput:.2f}, "
        f"#queue-req: {queued}" + ("" if newer(version) else ",")
    )


def retract_line(retracted: int, old_ratio: float, new_ratio: float) -> str:
    """SGLang's warning when the KV pool is full during decode."""
    return (
        "KV cache pool is full. Retract requests. "
        f"#retracted_reqs: {retracted}, #new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}"
    )
