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
from tuner.capacity import dpattention
from tuner.capacity.draftreading import Draft, DraftInputs, draft_reading, resolve_draft, v056_pool
from tuner.capacity.speculation import extra_slots_per_request, running_requests_flag
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
    #: `--max-running-requests` (None: SGLang's; 48 under speculation)
    max_running_requests: int | None = None
    #: a speculative draft (None: no speculation)
    draft: DraftInputs | None = None
    #: the observation (or weights) is a plain TP server's: add the draft's weights and what
    #: DP attention replicates
    plain_basis: bool = False
    #: GiB per GPU DP attention adds to the weights (None: estimated from the config)
    dp_attention_extra_gib: float | None = None


def parallel(inp: CapacityInputs) -> cap.Parallel:
    return cap.Parallel(tp=inp.tp, dp=inp.dp, dp_attention=inp.dp_attention)


@dataclass(frozen=True)
class _Shape:
    """What the reading divides and subtracts by: cells, the draft, the extras, the caps."""

    par: cap.Parallel
    cell: int  # what SGLang 0.5.23 divides the KV budget by (the draft's share included)
    plain_cell: int  # a plain TP server's cell (for --plain-basis)
    draft: Draft | None
    dp_extra_bytes: float
    dp_extra_detail: str
    flag: int | None  # --max-running-requests as SGLang runs it
    reset: bool  # SGLang reset it to 48 for speculation
    extra_slots: int  # KV slots a running request holds beyond its own tokens


def _context_len(inp: CapacityInputs) -> int:
    if inp.context_len:
        return inp.context_len
    return cap.context_length(inp.model_config) or 131072


def _running_cap(tokens: int, inp: CapacityInputs, shape: _Shape) -> int:
    """Running requests of one scheduler (one DP group or replica)."""
    return cap.max_running_requests(tokens, _context_len(inp), shape.flag, shape.par.attn_dp)


def _admission(tokens: int, inp: CapacityInputs, shape: _Shape) -> list[dict[str, Any]]:
    """Requests of each length at once, per DP group (or replica) and over all D of them."""
    running_cap = _running_cap(tokens, inp, shape)
    out = []
    for length in inp.avg_lens:
        each = cap.admissible_requests(tokens, length + shape.extra_slots, running_cap)
        out.append({"avg_len": length, "requests": each, "requests_total": each * inp.dp})
    return out


def _fixed(inp: CapacityInputs, shape: _Shape, free0: float) -> tuple[float, str] | None:
    """The fixed part (weights + other, bytes per GPU) and where it came from."""
    draft_w = shape.draft.weights_bytes if shape.draft else 0.0
    added = draft_w + shape.dp_extra_bytes if inp.plain_basis else 0.0
    if inp.observed_tokens is not None and inp.observed_mfs is not None:
        cell = shape.plain_cell if inp.plain_basis else shape.cell
        fixed = cap.calibrate_fixed_bytes(inp.observed_tokens, inp.observed_mfs, free0, cell)
        basis = (
            f"calibrated from {inp.observed_tokens:,} tokens at mfs {inp.observed_mfs:g}: "
            f"weights + other = {fixed / cap.GIB:.1f} GiB per GPU"
        )
    elif inp.weights_gib is not None:
        fixed = inp.weights_gib * cap.GIB + (0.0 if inp.plain_basis else draft_w)
        basis = f"from weights {inp.weights_gib:g} GiB per GPU (no other allocations counted)"
        if shape.draft and not inp.plain_basis:
            basis += f", plus the draft's {draft_w / cap.GIB:g} GiB"
    else:
        return None
    if inp.plain_basis:
        parts = [f"{draft_w / cap.GIB:g} GiB of draft weights"] if shape.draft else []
        if shape.par.attn_tp != shape.par.tp:
            parts.append(f"{shape.dp_extra_bytes / cap.GIB:.1f} GiB DP attention replicates")
        basis += " on a plain TP server, plus " + " and ".join(parts)
        fixed += added
    return fixed, basis


def _projection(
    inp: CapacityInputs, shape: _Shape
) -> tuple[list[dict[str, Any]], str | None, float]:
    """Pool size at each mfs; the basis says where the fixed part (weights + other) came from."""
    if inp.gpu_mem_mib is None:
        return [], None, 0.0
    free0 = inp.gpu_mem_mib * cap.MIB
    found = _fixed(inp, shape, free0)
    if found is None:
        return [], None, 0.0
    fixed, basis = found
    bpt = shape.cell
    mfs_values = list(dict.fromkeys([*([inp.observed_mfs] if inp.observed_mfs else []), *inp.mfs]))
    rows = []
    for mfs in mfs_values:
        tokens = max(0, cap.pool_tokens(mfs, free0, fixed, bpt, inp.page_size))  # none, not < 0
        headroom = (1 - mfs) * free0 / cap.GIB
        running = _running_cap(tokens, inp, shape)
        row: dict[str, Any] = {
            "mfs": mfs,
            "max_total_num_tokens": tokens,
            "kv_gb": round(max(tokens, 0) * bpt / cap.GB, 2),
            "headroom_gib": round(headroom, 2),
            "max_running_requests": running,
            "max_running_requests_total": running * inp.dp,
            "admissible": _admission(tokens, inp, shape) if tokens > 0 else [],
        }
        if shape.draft is not None:
            flag = shape.flag or 0
            row["sglang_0_5_6"] = v056_pool(shape.draft, mfs, free0, fixed, inp.page_size, flag)
        if inp.observed_tokens is not None and not inp.plain_basis:
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


def shape_of(inp: CapacityInputs) -> tuple[cap.KVLayout, _Shape]:
    """The target's layout under the attention TP, and what the draft and DP attention add.
    Raises ModelConfigError (a model or draft config field) and ValueError (a draft's step
    parameters SGLang refuses)."""
    par = parallel(inp)
    layout = cap.kv_layout(inp.model_config, par.attn_tp, inp.kv_dtype)
    plain = cap.kv_layout(inp.model_config, inp.tp, inp.kv_dtype).bytes_per_token
    draft = None
    if inp.draft is not None:
        draft = resolve_draft(inp.draft, inp.model_config, layout, par.attn_tp, inp.kv_dtype)
    extra, detail = 0.0, ""
    if par.dp_attention and par.attn_tp != par.tp:
        estimate = dpattention.replicated_weight_bytes(inp.model_config, par)
        if inp.dp_attention_extra_gib is not None:
            extra, detail = inp.dp_attention_extra_gib * cap.GIB, "given (--dp-attention-extra-gib)"
        elif estimate is not None:
            extra, detail = estimate
        else:
            detail = "not estimated for this model (not MLA): give --dp-attention-extra-gib"
    flag, reset = running_requests_flag(inp.max_running_requests, draft is not None)
    slots = 0
    if draft is not None:
        slots = extra_slots_per_request(inp.page_size, draft.steps, draft.topk, draft.draft_tokens)
    cell = draft.cell if draft is not None else layout.bytes_per_token
    return layout, _Shape(par, cell, plain, draft, extra, detail, flag, reset, slots)


def _defaults(inp: CapacityInputs, shape: _Shape) -> dict[str, Any]:
    """SGLang's defaults on this GPU; with DP attention or a draft, 0.5.6.post2's reserve."""
    assert inp.gpu_mem_mib is not None
    chunk, graph_bs = default_chunked_prefill_and_graph_bs(inp.gpu_mem_mib, inp.tp)
    out: dict[str, Any] = {
        "mem_fraction_static": default_mem_fraction_static(inp.gpu_mem_mib, inp.tp),
        "chunked_prefill_size": chunk,
        "cuda_graph_max_bs": graph_bs,
    }
    algorithm = shape.draft.inputs.algorithm if shape.draft else None
    if shape.par.attn_dp > 1 or algorithm:
        reserve = dpattention.default_reserve(
            inp.gpu_mem_mib, shape.par, chunk, graph_bs, algorithm
        )
        out["mem_fraction_static"] = reserve.pop("mem_fraction_static")
        out["reserve_mib"] = reserve
    if shape.par.attn_dp > 1:
        out["chunked_prefill_size_per_group"] = chunk // shape.par.dp
    return out


def analyze(inp: CapacityInputs) -> dict[str, Any]:
    """The whole reading as a JSON-ready dict (keys documented in docs/capacity.md)."""
    layout, shape = shape_of(inp)
    par, bpt = shape.par, shape.cell
    out: dict[str, Any] = {
        "bytes_per_token": bpt,
        "kv_layout": {"kind": layout.kind, "detail": layout.detail},
        "tp": inp.tp,
        "dp": inp.dp,
        "dp_attention": inp.dp_attention,
        "gpus": par.gpus,
        "parallel": {
            "describe": par.describe(),
            "ranks": par.ranks,
            "attn_tp": par.attn_tp,
            "attn_dp": par.attn_dp,
            "groups": inp.dp,
        },
        "context_len": _context_len(inp),
    }
    if par.dp_attention and par.attn_tp != par.tp:
        out["dp_attention_weights"] = {
            "extra_gib_per_gpu": round(shape.dp_extra_bytes / cap.GIB, 2),
            "detail": shape.dp_extra_detail,
            "added": inp.plain_basis,
        }
    if inp.gpu_mem_mib is not None:
        out["sglang_defaults"] = _defaults(inp, shape)
    if inp.observed_tokens is not None:
        seen = shape.plain_cell if inp.plain_basis else bpt
        out["observed"] = {
            "max_total_num_tokens": inp.observed_tokens,
            "mfs": inp.observed_mfs,
            "kv_gb": round(inp.observed_tokens * seen / cap.GB, 2),
            "kv_gib": round(inp.observed_tokens * seen / cap.GIB, 2),
            "admissible": [] if inp.plain_basis else _admission(inp.observed_tokens, inp, shape),
            "plain_basis": inp.plain_basis,
        }
    projection, basis, _ = _projection(inp, shape)
    out["projection"] = projection
    out["projection_basis"] = basis
    first = projection[0]["max_total_num_tokens"] if projection else 0
    device_tokens = first if inp.plain_basis else (inp.observed_tokens or first)
    if shape.draft is not None:
        graph_bs = out.get("sglang_defaults", {}).get("cuda_graph_max_bs", 160)
        # graphs are captured up to the request pool: the largest running cap a pool here has
        pools = [p["max_total_num_tokens"] for p in projection] + [inp.observed_tokens or 0]
        caps = [_running_cap(t, inp, shape) for t in pools if t > 0]
        running = max(caps, default=max(1, (shape.flag or graph_bs) // par.attn_dp))
        out["speculative"] = draft_reading(
            shape.draft, inp.page_size, shape.flag or 0, shape.reset, graph_bs, running
        )
    host_bytes = None if inp.host_ram_gb is None else inp.host_ram_gb * cap.GB
    # the host pool mirrors the target's KV: its tokens at the target's cell
    host_cell = layout.bytes_per_token
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
            cap.hicache_verdict(gb, host_cell, device_tokens, host_bytes, par.ranks, inp.page_size)
            for gb in inp.hicache_sizes_gb
        )
    ]
    if host_bytes is not None:
        out["hicache_max_gb_per_rank"] = cap.max_hicache_gb_per_rank(host_bytes, par.ranks)
    out["hicache_note"] = cap.HICACHE_STATEMENT
    if inp.naive:
        out["naive"] = _naive(inp)
    return out
