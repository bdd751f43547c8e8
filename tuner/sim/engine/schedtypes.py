"""The engine's boundary types: its parameters, what a step returns, its gauges, its exceptions."""

from __future__ import annotations

from dataclasses import dataclass

OOM_MESSAGE = "Prefill out of memory. Try to lower your batch size."


class EngineOOM(Exception):
    """The simulated server dies: a prefill batch did not fit in GPU memory. `log_lines`: what
    the fatal iteration logged first (SGLang logs the prefill batch before it runs it)."""

    def __init__(self, message: str = OOM_MESSAGE, log_lines: tuple[str, ...] = ()):
        super().__init__(message)
        self.log_lines = log_lines


class QueueFull(Exception):
    """`--max-queued-requests` reached (the HTTP layer answers 503 "The request queue is full.")."""


@dataclass(frozen=True)
class EngineParams:
    """The scheduler's resolved configuration (from launch flags + profile, by SIM-SERVER)."""

    max_total_tokens: int
    max_running_requests: int
    page_size: int = 1
    chunked_prefill_size: int = 8192  # <= 0 disables chunking
    max_prefill_tokens: int = 16384
    schedule_conservativeness: float = 1.0
    schedule_policy: str = "fcfs"
    radix_cache: bool = True
    hicache_host_tokens: int = 0  # per-rank host pool in tokens; 0 = HiCache off
    hicache_write_policy: str = "write_through"
    context_len: int = 131072
    decode_log_interval: int = 40
    oom_prefill_tokens: int | None = None  # a prefill batch with more new tokens dies
    max_queued_requests: int | None = None
    seed: int = 0
    cuda_graph_max_bs: int | None = None  # decode batches above it run without CUDA graphs
    log_version: str = "0.5.6.post2"  # whose Prefill/Decode batch line format to write


@dataclass(frozen=True)
class TokenEvent:
    """What one step did to one request (completion_tokens is cumulative)."""

    rid: str
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int
    finished: bool
    finish_reason: dict | None


@dataclass(frozen=True)
class Step:
    """One scheduler iteration: how long it took, what it produced, what SGLang would log."""

    duration_s: float
    events: tuple[TokenEvent, ...]
    log_lines: tuple[str, ...]


@dataclass(frozen=True)
class EngineStats:
    """The scheduler's gauges and counters (SGLang's /metrics names without the prefix)."""

    num_running_reqs: int
    num_queue_reqs: int
    num_used_tokens: int
    token_usage: float
    cache_hit_rate: float
    max_total_num_tokens: int
    num_retracted_reqs: int
    gen_throughput: float
    prompt_tokens_total: int
    generation_tokens_total: int
    cached_tokens_total: int
    num_requests_total: int
    load_back_tokens_total: int
    evicted_tokens_total: int
    retracted_reqs_total: int
    new_token_ratio: float
    host_used_tokens: int
    clock_s: float
