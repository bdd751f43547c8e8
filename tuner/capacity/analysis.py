"""`tuner capacity`'s reading of a deployment: the corrected calculus, and the naive one beside it. Pure.

The naive mode reproduces the arithmetic people do by hand (bytes per token from a rough KV
figure read as GiB, HiCache GB divided over GPUs and added to the running pool, the pool scaled in
proportion to mfs) so the two readings can be compared line by line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.capacity import calculus as cap
from tuner.sglang.defaults import default_chunked_prefill_and_graph_bs, default_mem_fraction_static

#: SGLang's tuning advice: keep 5-8 GB of `available_gpu_mem` for CUDA graphs and activations.
HEADROOM_ADVICE_GIB = 5.0


@dataclass(frozen=True)
class CapacityInputs:
    """Everything `tuner capacity` was told; optional parts unlock more of the reading."""

    model_config: Mapping[str, Any]
    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    kv_dtype: str = "auto"
    page_size: int = 1
    gpu_mem_mib: float | None = None
    weights_gib: float | None = None
    observed_tokens: int | None = None
    observed_mfs: float | None = None
    observed_kv_gb: float | None = None
    mfs: Sequence[float] = field(default_factory=tuple)
    hicache_sizes_gb: Sequence[float] = field(default_factory=tuple)
    host_ram_gb: float | None = None
    avg_lens: Sequence[float] = field(default_factory=tuple)
    context_len: int | None = None
    naive: bool = False


def parallel(inp: CapacityInputs) -> cap.Parallel:
    return cap.Parallel(tp=inp.tp, dp=inp.dp, dp_attention=inp.dp_attention)


def _context_len(inp: CapacityInputs) -> int:
    if inp.context_len:
        return inp.context_len
    cfg = cap.text_config(inp.model_config)
    return int(cfg.get("max_position_embeddings") or 131072)


def _admission(tokens: int, inp: CapacityInputs) -> list[dict[str, Any]]:
    running_cap = cap.max_running_requests(tokens, _context_len(inp))
    return [
        {"avg_len": length, "requests": cap.admissible_requests(tokens, length, running_cap)}
        for length in inp.avg_lens
    ]


def _projection(inp: CapacityInputs, bpt: int) -> tuple[list[dict[str, Any]], str | None, float]:
    """Pool size at each mfs; the basis says where the fixed part (weights + other) came from."""
    if inp.gpu_mem_mib is None:
        return [], None, 0.0
    free0 = inp.gpu_mem_mib * cap.MIB
    if inp.observed_tokens is not None and inp.observed_mfs is not None:
        fixed = cap.calibrate_fixed_bytes(inp.observed_tokens, inp.observed_mfs, free0, bpt)
        basis = (
            f"calibrated from {inp.observed_tokens:,} tokens at mfs {inp.observed_mfs:g}: "
            f"weights + other = {fixed / cap.GIB:.1f} GiB per GPU"
        )
    elif inp.weights_gib is not None:
        fixed = inp.weights_gib * cap.GIB
        basis = f"from weights {inp.weights_gib:g} GiB per GPU (no other allocations counted)"
    else:
        return [], None, 0.0
    mfs_values = list(dict.fromkeys([*([inp.observed_mfs] if inp.observed_mfs else []), *inp.mfs]))
    rows = []
    for mfs in mfs_values:
        tokens = max(0, cap.pool_tokens(mfs, free0, fixed, bpt, inp.page_size))  # none, not < 0
        headroom = (1 - mfs) * free0 / cap.GIB
        row: dict[str, Any] = {
            "mfs": mfs,
            "max_total_num_tokens": tokens,
            "kv_gb": round(max(tokens, 0) * bpt / cap.GB, 2),
            "headroom_gib": round(headroom, 2),
            "max_running_requests": cap.max_running_requests(tokens, _context_len(inp)),
            "admissible": _admission(tokens, inp) if tokens > 0 else [],
        }
        if inp.observed_tokens is not None:
            row["delta_tokens"] = tokens - inp.observed_tokens
        if tokens <= 0:
            row["warning"] = "no KV pool: SGLang fails 'Not enough memory' at start-up"
        elif headroom < HEADROOM_ADVICE_GIB:
            row["warning"] = (
                f"only {headroom:.1f} GiB left for CUDA graphs and activations (SGLang advises 5-8 GB):"
                " capture or a large prefill may run out of memory; only a measurement can tell"
            )
        rows.append(row)
    return rows, basis, fixed


def _naive(inp: CapacityInputs) -> dict[str, Any]:
    """The back-of-envelope reading: every step of it is one of the three mistakes."""
    if inp.observed_kv_gb is None or inp.observed_tokens is None:
        raise ValueError("naive mode needs observed_kv_gb and observed_tokens")
    # The rough "14.8 GB" is read as GiB and spread over the observed tokens (rounded, as by hand).
    bpt = round(inp.observed_kv_gb * cap.GIB / inp.observed_tokens)
    ranks = inp.tp * inp.dp
    extra = [
        {"hicache_size_gb": gb, "extra_tokens": int(gb / ranks * cap.GIB // bpt)}
        for gb in inp.hicache_sizes_gb
    ]
    extra_tokens = extra[0]["extra_tokens"] if extra else 0
    total = inp.observed_tokens + extra_tokens
    linear = []
    if inp.observed_mfs:
        for mfs in inp.mfs:
            tokens = int(inp.observed_tokens * mfs / inp.observed_mfs)
            linear.append(
                {
                    "mfs": mfs,
                    "tokens": tokens,
                    "gain_pct": round(100 * (tokens / inp.observed_tokens - 1), 1),
                }
            )
    return {
        "bytes_per_token": bpt,
        "extra_tokens": extra_tokens,
        "extra_by_hicache_size": extra,
        "total_tokens": total,
        "concurrent_requests": [
            {"avg_len": length, "requests": round(total / length)} for length in inp.avg_lens
        ],
        "mfs_linear_tokens": linear,
        "assumptions": [
            "bytes/token = rough KV figure / observed tokens",
            "--hicache-size is a total spread over the GPUs and adds running capacity",
            "the KV pool is proportional to --mem-fraction-static",
        ],
    }


def analyze(inp: CapacityInputs) -> dict[str, Any]:
    """The whole reading as a JSON-ready dict (keys documented in docs/capacity.md)."""
    par = parallel(inp)
    layout = cap.kv_layout(inp.model_config, par.attn_tp, inp.kv_dtype)
    bpt = layout.bytes_per_token
    out: dict[str, Any] = {
        "bytes_per_token": bpt,
        "kv_layout": {"kind": layout.kind, "detail": layout.detail},
        "tp": inp.tp,
        "dp": inp.dp,
        "dp_attention": inp.dp_attention,
        "gpus": par.gpus,
        "context_len": _context_len(inp),
    }
    if inp.gpu_mem_mib is not None:
        chunk, graph_bs = default_chunked_prefill_and_graph_bs(inp.gpu_mem_mib, inp.tp)
        out["sglang_defaults"] = {
            "mem_fraction_static": default_mem_fraction_static(inp.gpu_mem_mib, inp.tp),
            "chunked_prefill_size": chunk,
            "cuda_graph_max_bs": graph_bs,
        }
    if inp.observed_tokens is not None:
        out["observed"] = {
            "max_total_num_tokens": inp.observed_tokens,
            "mfs": inp.observed_mfs,
            "kv_gb": round(inp.observed_tokens * bpt / cap.GB, 2),
            "kv_gib": round(inp.observed_tokens * bpt / cap.GIB, 2),
            "admissible": _admission(inp.observed_tokens, inp),
        }
    projection, basis, _ = _projection(inp, bpt)
    out["projection"] = projection
    out["projection_basis"] = basis
    device_tokens = inp.observed_tokens or (
        projection[0]["max_total_num_tokens"] if projection else 0
    )
    host_bytes = None if inp.host_ram_gb is None else inp.host_ram_gb * cap.GB
    out["hicache"] = [
        {
            "hicache_size_gb_per_rank": v.size_gb_per_rank,
            "host_total_gb": v.host_total_gb,
            "host_tokens_per_rank": v.host_tokens_per_rank,
            "feasible": v.feasible,
            "reason": v.reason,
            "running_tokens": device_tokens,
        }
        for v in (
            cap.hicache_verdict(gb, bpt, device_tokens, host_bytes, par.ranks, inp.page_size)
            for gb in inp.hicache_sizes_gb
        )
    ]
    if host_bytes is not None:
        out["hicache_max_gb_per_rank"] = cap.max_hicache_gb_per_rank(host_bytes, par.ranks)
    out["hicache_note"] = cap.HICACHE_STATEMENT
    if inp.naive:
        out["naive"] = _naive(inp)
    return out
