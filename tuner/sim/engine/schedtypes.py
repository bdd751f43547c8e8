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
        self.log_groups: tuple[int, ...] = ()  # DP attention: each line's group


class QueueFull(Exception):
    """`--max-queued-requests` reached (the HTTP layer answers 503 "The request queue is full.")."""


@dataclass(frozen=True)
class SpecParams:
    """Speculative decoding as the engine plays it (resolved by SIM-SERVER from the flags and
    the profile's draft): each decode iteration drafts `num_steps` tokens (topk candidates
    each), verifies `num_draft_tokens` per request in one target pass, and keeps 1 + the
    accepted run of drafts per request."""

    num_steps: int
    topk: int
    num_draft_tokens: int
    #: P(draft position i accepted | the ones before were), topk already folded in
    accept: tuple[float, ...]
    #: free KV slots a decode step needs per running request (page size 1)
    decode_reserve: int
    #: the draft's weights read by every draft step, per GPU (GiB)
    draft_weights_gib: float = 0.0
    #: the draft's KV bytes per token per GPU, read by every draft step
    draft_bytes_per_token: int = 0
    #: 0.5.23's accept rate (correct drafts / (draft tokens - 1)); else 0.5.6.post2's
    #: (accepted tokens, bonus included, / draft tokens)
    accept_rate_of_drafts: bool = False


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
    #: DP attention: this many schedulers (groups), each with these params and its own pool,
    #: stepping in lockstep (dpengine.py); 1: one scheduler
    dp_groups: int = 1
    #: GPUs per DP attention group (a group's logs carry the TP rank of its first GPU)
    attn_tp: int = 1
    load_balance_method: str = "round_robin"
    #: DP attention's replicated attention weights, read by every decode step (GiB per GPU)
    dp_extra_weights_gib: float = 0.0
    spec: SpecParams | None = None
    #: SGLang's overlap scheduler runs (0.5.6.post2 turns it off under speculative decoding)
    overlap: bool = True


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
    #: the DP attention group of each log line (empty: one scheduler)
    log_groups: tuple[int, ...] = ()


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
    spec_accept_length: float = 0.0  # at the last decode log line (SGLang's gauge)
    spec_accept_rate: float = 0.0
    #: mean accept length since start, None before the first decode log (internal_states)
    avg_spec_accept_length: float | None = None
    max_running_requests: int = 0
