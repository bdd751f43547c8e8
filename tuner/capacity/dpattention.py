"""DP attention's memory besides the KV cell, and SGLang's default reserve with DP attention or
a draft. Pure.

Under `--enable-dp-attention --dp-size D` (0.5.23: `--attn-dp-size D`) an MLA model's
attention runs tensor-parallel over `T / D` GPUs instead of T: its sharded projections (`q_b`
or `q`, `kv_b`, `o`) are split D times less (0.5.6.post2 `srt/models/deepseek_v2.py:
1267-1366`, `tp_size=attn_tp_size`; 0.5.23 `deepseek_v2.py:2051`), and the input embedding is
split over the attention group only (0.5.6.post2 `deepseek_v2.py:2984-2987` replicates it
whole; 0.5.23 `layers/vocab_parallel_embedding.py:182-185` shards it over the attention-TP
group). So every GPU holds more weights, and an observation of a plain TP server's pool does not
calibrate a DP-attention one: `replicated_weight_bytes` estimates the difference.

SGLang's own default mfs keeps back `cuda_graph_max_bs x D x 3` MiB more under DP attention
(and `x 1.5` more above a max batch of 300): 0.5.6.post2 `srt/server_args.py:861-869`, 0.5.23
`srt/arg_groups/memory_hook.py:371-378`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.capacity.calculus import Parallel, kv_dtype_bytes, text_config
from tuner.capacity.speculation import default_reserve_mib


def weight_dtype_bytes(config: Mapping[str, Any]) -> float:
    """Bytes per attention weight: 1 under an fp8 `quantization_config` (DeepSeek-V3), else
    the model's dtype (Kimi-K2.5's int4 covers its experts, not its attention)."""
    quant = config.get("quantization_config") or text_config(config).get("quantization_config")
    if isinstance(quant, Mapping) and str(quant.get("quant_method", "")).lower() == "fp8":
        return 1
    return kv_dtype_bytes(config, "auto")


def _int(cfg: Mapping[str, Any], name: str) -> int:
    value = cfg.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def replicated_weight_bytes(config: Mapping[str, Any], par: Parallel) -> tuple[float, str] | None:
    """Bytes of weights a GPU holds more under `par`'s DP attention than under plain TP, with
    the arithmetic; None when DP attention is off or the model is not MLA (SGLang's DP
    attention models are the DeepSeek family; others are not estimated).

    Sharded attention projections per layer: q (`q_lora_rank x heads x (nope + rope)`, or
    `hidden x ...` without a q LoRA), kv_b (`kv_lora_rank x heads x (nope + v)`), o (`heads x v
    x hidden`), each held as 1/attn_tp instead of 1/tp; the embedding (`vocab x hidden`, when
    the config gives `vocab_size`) likewise. Dense MLP layers and the LM head are not counted."""
    if not par.dp_attention or par.attn_tp == par.tp:
        return None
    cfg = text_config(config)
    if not cfg.get("kv_lora_rank"):
        return None
    hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    layers = _int(cfg, "num_hidden_layers")
    nope, rope, v = (_int(cfg, n) for n in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    lora, q_lora = _int(cfg, "kv_lora_rank"), _int(cfg, "q_lora_rank")
    q = (q_lora or hidden) * heads * (nope + rope)
    per_layer = q + lora * heads * (nope + v) + heads * v * hidden
    share = 1 / par.attn_tp - 1 / par.tp
    dtype = weight_dtype_bytes(config)
    attention = per_layer * layers * share * dtype
    vocab = _int(cfg, "vocab_size") or _int(config, "vocab_size")
    embedding = vocab * hidden * share * dtype
    detail = (
        f"attention q/kv_b/o {per_layer / 1e6:,.1f} M params x {layers} layers"
        + (
            f" + embedding {vocab:,} x {hidden:,}"
            if vocab
            else " (no vocab_size: embedding not counted)"
        )
        + f" held as 1/{par.attn_tp} instead of 1/{par.tp} at {dtype:g} B"
    )
    return attention + embedding, detail


def graph_reserve_mib(cuda_graph_max_bs: int, dp: int) -> float:
    """MiB SGLang's default mfs adds under DP attention for its graphs' padding."""
    extra = cuda_graph_max_bs * dp * 3.0
    if cuda_graph_max_bs > 300:
        extra += cuda_graph_max_bs * dp * 1.5
    return extra


def default_reserve(
    gpu_mem_mib: float,
    par: Parallel,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int,
    spec_algorithm: str | None = None,
) -> dict[str, float]:
    """SGLang 0.5.6.post2's reserve for its default mfs (`srt/server_args.py:848-890`), in MiB
    by part: `base` (512 + chunk x 1.5 + graphs x 2 + TP x PP / 8 GiB, at least 10 GiB above
    60 GiB of GPU; the DP-attention term sits inside that floor), `dp_attention`,
    `speculative`; `mem_fraction_static` is what it yields."""
    base = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2
    base += par.tp * par.pp / 8 * 1024
    dp_term = graph_reserve_mib(cuda_graph_max_bs, par.dp) if par.attn_dp > 1 else 0.0
    floor = max(base + dp_term, 10 * 1024) if gpu_mem_mib > 60 * 1024 else base + dp_term
    spec = float(default_reserve_mib(spec_algorithm, "0.5.6.post2"))
    total = floor + spec
    return {
        "base": round(floor - dp_term, 1),
        "dp_attention": dp_term,
        "speculative": spec,
        "total": round(total, 1),
        "mem_fraction_static": round((gpu_mem_mib - total) / gpu_mem_mib, 3),
    }
