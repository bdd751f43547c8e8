"""SGLang's start-up milestones, read from its log lines. Pure.

The lines SGLang writes while it starts (sglang-reference.md sections 2 and 5), each turned into
one short milestone with units on every number, for the live display of `tuner tune`:

    Load weight begin. avail mem=78.45 GB                           -> loading weights
    Load weight end. type=..., avail mem=63.42 GB, mem usage=15.04 GB. -> weights loaded: 15.04 GB
    KV Cache is allocated. #tokens: 452310, K size: 27.61 GB, V size: 27.61 GB
                                                                     -> KV cache: 452,310 tokens (55.22 GB)
    Allocating 64.00 GB host memory for hierarchical KV cache.      -> HiCache host pool: 64.00 GB
    Capture cuda graph begin. ...                                   -> capturing CUDA graphs
    Capture cuda graph end. Time elapsed: 12.31 s. ...              -> CUDA graphs captured in 12.31 s
    (0.5.23: `Load weight end. elapsed=...`, `KV Cache is allocated. dtype: ..., #tokens: ...`,
    `Capture target decode CUDA graph begin/end. bs=[...], elapsed=12.31 s, ...`: same milestones)
    max_total_num_tokens=..., max_running_requests=4096, ..., available_gpu_mem=6.68 GB
                                                                     -> scheduler: 4,096 requests max running, 6.68 GB GPU memory free
    The server is fired up and ready to roll!                       -> ready to roll

SGLang writes "GB" for GiB; the milestones keep its numbers and its word. With tensor
parallelism every rank writes the same lines: a caller reports each milestone once per start
(by `key`). Only these numbers leave the log: a line's other text (SGLang logs its whole
server_args, an API key included) never does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Milestone:
    """One step of a server's start-up: `key` names it (one per start), `text` says it."""

    key: str
    text: str


def _num(text: str) -> str:
    """`452310` -> `452,310`; decimals kept as SGLang wrote them."""
    return f"{int(text):,}" if text.isdigit() else text


def _kv(m: re.Match[str]) -> str:
    sizes = [float(x) for x in re.findall(r"[KV] size: ([\d.]+) GB", m.string)]
    size = f" ({sum(sizes):.2f} GB)" if sizes else ""
    return f"KV cache allocated: {_num(m.group(1))} tokens{size}"


def _scheduler(m: re.Match[str]) -> str:
    running = re.search(r"max_running_requests=(\d+)", m.string)
    free = re.search(r"available_gpu_mem=([\d.]+) GB", m.string)
    parts = [f"{_num(running.group(1))} requests max running"] if running else []
    if free:
        parts.append(f"{free.group(1)} GB GPU memory free")
    return "scheduler: " + ", ".join(parts or [f"{_num(m.group(1))} tokens in the pool"])


#: (key, pattern, text of the match), in start-up order
_RULES: tuple[tuple[str, re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    ("weights_begin", re.compile(r"Load weight begin\b"), lambda m: "loading weights"),
    (
        "weights",
        re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB"),
        lambda m: f"weights loaded: {m.group(1)} GB",
    ),
    # 0.5.23 adds `dtype: X, ` before the count
    ("kv_cache", re.compile(r"KV Cache is allocated\. (?:dtype: \S+, )?#tokens: (\d+)"), _kv),
    (
        "hicache",
        re.compile(r"Allocating ([\d.]+) GB host memory for hierarchical KV cache"),
        lambda m: f"HiCache host pool: {m.group(1)} GB",
    ),
    # 0.5.23: "Capture target decode CUDA graph begin/end. bs=[...], elapsed=12.31 s, ..."
    (
        "graphs_begin",
        re.compile(r"Capture (?:cuda graph|target decode CUDA graph) begin\b"),
        lambda m: "capturing CUDA graphs",
    ),
    (
        "graphs",
        re.compile(
            r"Capture (?:cuda graph end\. Time elapsed: ([\d.]+) s"
            r"|target decode CUDA graph end\..*?elapsed=([\d.]+) s)"
        ),
        lambda m: f"CUDA graphs captured in {m.group(1) or m.group(2)} s",
    ),
    ("scheduler", re.compile(r"max_total_num_tokens=(\d+)"), _scheduler),
    ("ready", re.compile(r"The server is fired up and ready to roll"), lambda m: "ready to roll"),
)


def milestones(lines: Iterable[str]) -> list[Milestone]:
    """The milestones in `lines`, in order (repeats included: the caller keeps the first)."""
    out = []
    for line in lines:
        for key, pattern, text in _RULES:
            m = pattern.search(line)
            if m:
                out.append(Milestone(key, text(m)))
                break
    return out
