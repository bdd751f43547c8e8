"""A launch's layout from its flags, as SGLang reads them: the parallel split, what it refuses
before loading anything, the KV cell a trial's pool is divided by, and which starts calibrate
which trials. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.capacity import calculus as cap
from tuner.capacity.dpattention import default_reserve
from tuner.capacity.speculation import mtp_layers, speculation_of
from tuner.errors import ModelConfigError
from tuner.sglang.defaults import default_chunked_prefill_and_graph_bs
from tuner.sglang.flags import LaunchFlags, effective_flags

#: flags that change the weights per GPU or the KV cell (or, under speculation, the slots
#: SGLang 0.5.6.post2 adds to the pool): a start's pool calibrates only trials equal in these
POOL_FLAGS = (
    "model-path",
    "tensor-parallel-size",
    "data-parallel-size",
    "pipeline-parallel-size",
    "expert-parallel-size",
    "enable-dp-attention",
    "attn-dp-size",
    "enable-dp-lm-head",
    "kv-cache-dtype",
    "quantization",
    "speculative-algorithm",
    "speculative-draft-model-path",
    "speculative-num-steps",
    "speculative-eagle-topk",
    "speculative-num-draft-tokens",
    "max-running-requests",
)


def pool_key(flags: Mapping[str, Any]) -> tuple:
    """The layout's flags (`POOL_FLAGS`): equal keys, equal weights per GPU and KV cell."""
    launched = effective_flags(flags)
    return tuple((k, str(launched.get(k))) for k in POOL_FLAGS)


def parallel_of(flags: Mapping[str, Any]) -> cap.Parallel:
    """TP, DP, PP and DP attention as SGLang reads the flags (any alias or unique prefix).
    0.5.23's `--attn-dp-size N` is DP attention over N groups, which it also makes of the
    deprecated `--dp-size N --enable-dp-attention` (`arg_groups/parallel_hook.py:39-61`)."""
    launched = effective_flags(flags)
    attn_dp = int(launched.get("attn-dp-size") or 1)
    if attn_dp > 1:
        return cap.Parallel(
            tp=int(launched.get("tensor-parallel-size") or 1),
            dp=attn_dp,
            pp=int(launched.get("pipeline-parallel-size") or 1),
            dp_attention=True,
        )
    return cap.Parallel(
        tp=int(launched.get("tensor-parallel-size") or 1),
        dp=int(launched.get("data-parallel-size") or 1),
        pp=int(launched.get("pipeline-parallel-size") or 1),
        dp_attention=bool(launched.get("enable-dp-attention")),
    )


def launch_problem(flags: Mapping[str, Any]) -> str | None:
    """What SGLang refuses in these flags' parallel layout or speculation before it loads
    anything (both versions), or None: a DP attention whose dp does not divide tp
    (0.5.6.post2 `server_args.py:1570`, 0.5.23 `arg_groups/parallel_hook.py:326`), replicas
    beside 0.5.23's attention DP (`parallel_hook.py:287-292`), STANDALONE speculation under
    DP attention (0.5.6.post2 `server_args.py:1733-1737`, 0.5.23 `speculative_hook.py:
    1078-1084`), a draft's top-k or draft tokens without its steps (0.5.6.post2
    `server_args.py:1789-1793`, 0.5.23 `speculative_hook.py:1159-1163`), its steps without
    its top-k (both compare it with 1 and crash)."""
    launched = effective_flags(flags)
    attn_dp = int(launched.get("attn-dp-size") or 1)
    if attn_dp > 1 and int(launched.get("data-parallel-size") or 1) > 1:
        return "--dp-size with --attn-dp-size: SGLang 0.5.23 refuses replicas beside attention DP"
    par = parallel_of(launched)
    if (problem := par.problem()) is not None:
        return problem + " (SGLang asserts tp % dp == 0)"
    spec = speculation_of(launched)
    if spec is None or not spec.has_draft:
        return None
    if spec.algorithm == "STANDALONE" and par.attn_dp > 1:
        return "STANDALONE speculative decoding does not support DP attention (SGLang's ValueError)"
    if spec.steps is None and not launched.get("speculative-adaptive"):
        if spec.topk is not None or spec.draft_tokens is not None:
            return (
                "--speculative-eagle-topk or --speculative-num-draft-tokens without "
                "--speculative-num-steps (SGLang asserts all three are unset or steps is given)"
            )
    elif spec.steps is not None and spec.topk is None:
        return "--speculative-num-steps without --speculative-eagle-topk (SGLang compares None > 1)"
    return None


def cell_bounds(
    flags: Mapping[str, Any],
    model_config: Mapping[str, Any] | None,
    server: Mapping[str, Any],
    bytes_per_token: int | None,
) -> tuple[int, int | None] | None:
    """(low, high) bytes per token per GPU rank of this trial's pool, or None when unknown.

    Low: the target's cell under the trial's attention TP and KV dtype (the model config),
    else the study's (`bytes_per_token`, of its fixed `server:` flags, which a partial flag
    set is read over). High: with a draft's share as 0.5.23 adds it
    (`calculus.with_draft`); the draft is known only as the model's own MTP head
    (`num_nextn_predict_layers`), so a separate draft's high is None (unbounded); no draft,
    high = low. 0.5.6.post2 divides its pool by the low one, 0.5.23 by the high one.
    """
    launched = effective_flags(flags)
    if server:  # both normalized already: merged as they are
        launched = LaunchFlags({**effective_flags(server), **launched})
    low: int | None = bytes_per_token
    layers = 0
    if model_config is not None:
        kv = str(launched.get("kv-cache-dtype") or "auto")
        try:
            layout = cap.kv_layout(model_config, parallel_of(launched).attn_tp, kv)
        except ModelConfigError:
            return None
        low, layers = layout.bytes_per_token, layout.num_layers
    if not low:
        return None
    spec = speculation_of(launched)
    if spec is None or not spec.has_draft:
        return low, low
    mtp = None
    if model_config is not None and spec.own_mtp(launched.get("model-path")):
        mtp = mtp_layers(model_config)
    if mtp is None or not layers:
        return low, None
    return low, cap.with_draft(low, layers, mtp)


def reserve_mib(flags: Mapping[str, Any], gpu_mem_mib: float) -> float:
    """MiB SGLang 0.5.6.post2's default mfs keeps outside the pool for these flags
    (`dpattention.default_reserve`, `srt/server_args.py:848-890`): the chunked prefill's
    activations, the CUDA graphs (per DP group under DP attention), a draft's share; the
    chunk and graph batch SGLang picks for the GPU where the flags leave them out."""
    launched = effective_flags(flags)
    par = parallel_of(launched)
    chunk, graph_bs = default_chunked_prefill_and_graph_bs(gpu_mem_mib, par.tp)
    chunk = int(launched.get("chunked-prefill-size") or chunk)
    graph_bs = int(launched.get("cuda-graph-max-bs") or graph_bs)
    spec = speculation_of(launched)
    algorithm = spec.algorithm if spec is not None else None
    return default_reserve(gpu_mem_mib, par, max(chunk, 0), graph_bs, algorithm)["total"]
