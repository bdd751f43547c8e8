"""The KV-cache calculus, as SGLang computes it (sglang-reference.md sections 1-3). Pure.

Units: GPU memory in MiB (as nvidia-smi and SGLang's defaults use it), KV budgets in bytes,
HiCache sizes in decimal GB (SGLang's `--hicache-size` multiplies by 1e9), SGLang's own
"GB" in log lines is GiB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import ModelConfigError

MIB = 2**20
GIB = 2**30
GB = 10**9

#: SGLang keeps this much host RAM free when it checks a HiCache request (per rank).
HICACHE_HOST_RESERVE_BYTES = 10 * GIB

KV_DTYPE_BYTES = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp4_e2m1": 0.5,
}
KV_DTYPES = ("auto", *KV_DTYPE_BYTES)
_MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Parallel:
    """How a server spreads over its GPUs: SGLang's `--tp-size`, `--dp-size`, `--pp-size` and
    `--enable-dp-attention` (sglang-reference.md section 10).

    Without DP attention, `--dp-size D` runs D replicas of T x P GPUs each. With it, the same
    T x P GPUs run attention data-parallel in D groups of T / D GPUs (SGLang 0.5.6.post2
    `layers/dp_attention.py:231`, `attn_tp_size = tp_size // dp_size`): a GPU keeps the KV of its
    own group's requests only, so an MLA model no longer replicates every request's latent on
    every GPU. Either way each GPU process holds its own KV pool (and HiCache host pool), and
    the D groups or replicas hold different requests.
    """

    tp: int = 1
    dp: int = 1
    pp: int = 1
    dp_attention: bool = False

    @property
    def gpus(self) -> int:
        """GPUs the server runs on: T x P, times D only for replicas."""
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    @property
    def ranks(self) -> int:
        """GPU processes, each with its own KV pool and, with HiCache, its own host pool."""
        return self.gpus

    @property
    def attn_tp(self) -> int:
        """GPUs one request's attention (and KV heads) is split over."""
        return self.tp // self.dp if self.dp_attention else self.tp

    @property
    def attn_dp(self) -> int:
        """Attention data-parallel groups: SGLang splits `--max-running-requests` among them
        (0.5.6.post2 `managers/tp_worker.py:292-300`)."""
        return self.dp if self.dp_attention else 1

    def describe(self) -> str:
        """`TP 8 x DP 2 x PP 1`, or `TP 8 x PP 1 with DP attention (8 groups)`."""
        if self.dp_attention:
            return f"TP {self.tp} x PP {self.pp} with DP attention ({self.dp} groups)"
        return f"TP {self.tp} x DP {self.dp} x PP {self.pp}"

    def problem(self) -> str | None:
        """Why SGLang refuses this split, or None."""
        for name in ("tp", "dp", "pp"):
            if getattr(self, name) < 1:
                return f"{name}: expected a positive integer, got {getattr(self, name)}"
        if self.dp_attention and self.tp % self.dp:
            return f"DP attention needs dp ({self.dp}) to divide tp ({self.tp})"
        return None


@dataclass(frozen=True)
class KVLayout:
    """What one token costs in the KV pool of one GPU rank."""

    kind: str  # "mla" or "mha"
    num_layers: int
    dtype_bytes: float
    bytes_per_token: int
    detail: str  # the arithmetic, for humans


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's fields: vision-language configs nest them under `text_config`."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping) and "num_hidden_layers" in inner:
        return inner
    return config


#: no model's layer count, head count or width comes near this; beyond it a field is garbage
MAX_MODEL_FIELD = 2**31


def _field(cfg: Mapping[str, Any], name: str, default: int | None = None) -> int:
    """A positive integer field; `default` when the field is absent or null (HF's convention
    for num_key_value_heads and head_dim)."""
    value = cfg.get(name)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_MODEL_FIELD:
        shown = value if not isinstance(value, int) or abs(value) < 10**12 else "a huge number"
        raise ModelConfigError(f"{name}: expected a positive integer, got {shown!r}")
    return value


def context_length(config: Mapping[str, Any]) -> int | None:
    """The model's context length (`max_position_embeddings`), None when the config gives
    none; ModelConfigError when it is there but not a positive integer."""
    cfg = text_config(config)
    if cfg.get("max_position_embeddings") is None:
        return None
    return _field(cfg, "max_position_embeddings")


def kv_dtype_bytes(config: Mapping[str, Any], kv_dtype: str = "auto") -> float:
    """Bytes per KV element: `auto` follows the model's dtype, as SGLang does."""
    if kv_dtype != "auto":
        if kv_dtype not in KV_DTYPE_BYTES:
            raise ModelConfigError(f"kv-dtype: expected one of {', '.join(KV_DTYPES)}")
        return KV_DTYPE_BYTES[kv_dtype]
    cfg = text_config(config)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16"
    if not isinstance(dtype, str) or dtype not in _MODEL_DTYPE_BYTES:
        raise ModelConfigError(f"torch_dtype: unsupported model dtype {dtype!r}")
    return _MODEL_DTYPE_BYTES[dtype]


def kv_layout(config: Mapping[str, Any], tp: int = 1, kv_dtype: str = "auto") -> KVLayout:
    """Bytes per token per GPU rank from a Hugging Face config.json; `tp`: the attention TP
    size (`Parallel.attn_tp`: T, or T / D under DP attention).

    MLA (DeepSeek-V3, Kimi-K2): the latent KV is replicated on every TP rank, so TP does not
    divide it. MHA/GQA: KV heads split across the attention TP ranks, but never below one
    head per rank (SGLang 0.5.6.post2 `model_executor/model_runner.py:1414`,
    `get_num_kv_heads(get_attention_tp_size())`).
    """
    if tp < 1:
        raise ModelConfigError(f"tp: expected a positive integer, got {tp}")
    cfg = text_config(config)
    layers = _field(cfg, "num_hidden_layers")
    dbytes = kv_dtype_bytes(config, kv_dtype)
    if cfg.get("kv_lora_rank"):
        lora, rope = _field(cfg, "kv_lora_rank"), _field(cfg, "qk_rope_head_dim")
        bpt = int((lora + rope) * layers * dbytes)
        detail = f"MLA: ({lora} + {rope}) x {layers} layers x {dbytes:g} B, same on every TP rank"
        return KVLayout("mla", layers, dbytes, bpt, detail)
    heads = _field(cfg, "num_attention_heads")
    kv_heads = _field(cfg, "num_key_value_heads", default=heads)
    if cfg.get("head_dim") is None:
        head_dim = max(1, _field(cfg, "hidden_size") // heads)
    else:
        head_dim = _field(cfg, "head_dim")
    per_rank = max(1, kv_heads // tp)
    bpt = int(per_rank * head_dim * layers * 2 * dbytes)
    detail = (
        f"MHA/GQA: max(1, {kv_heads} kv heads // attention tp {tp}) = {per_rank} x {head_dim} head_dim"
        f" x {layers} layers x 2 (K,V) x {dbytes:g} B"
    )
    return KVLayout("mha", layers, dbytes, bpt, detail)


def with_draft(bytes_per_token: int, target_layers: int, draft_layers: int) -> int:
    """Bytes per token per GPU rank with a speculative draft's KV in the same pool, as SGLang
    0.5.23 sizes it (`model_executor/pool_configurator.py:310-313`: the cell grows by
    `int(cell x draft layers / target layers)`): an EAGLE, EAGLE-3 or MTP draft reuses the
    target's per-layer KV size. 0.5.6.post2 instead gives the draft a pool of its own after the
    target's is sized (the simulator plays each version's rule)."""
    if draft_layers <= 0 or target_layers <= 0:
        return bytes_per_token
    return bytes_per_token + int(bytes_per_token * draft_layers / target_layers)


# --- the KV pool ------------------------------------------------------------------------


def pool_tokens(
    mfs: float,
    free_at_init_bytes: float,
    fixed_bytes: float,
    bytes_per_token: int,
    page_size: int = 1,
    max_total_tokens: int | None = None,
) -> int:
    """`max_total_num_tokens`: floor((mfs x free_at_init - weights - other) / bytes per token).

    `fixed_bytes` is everything allocated before KV profiling (weights, buffers). The result is
    capped by `--max-total-tokens` and rounded down to the page size; it may be <= 0, which
    SGLang reports as "Not enough memory".
    """
    rest = mfs * free_at_init_bytes - fixed_bytes
    tokens = math.floor(rest / bytes_per_token)
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    if tokens > 0 and page_size > 1:
        tokens = tokens // page_size * page_size
    return tokens


def calibrate_fixed_bytes(
    observed_tokens: int, observed_mfs: float, free_at_init_bytes: float, bytes_per_token: int
) -> float:
    """Infer weights + other from one observed pool: fixed = mfs x free - tokens x bpt."""
    return observed_mfs * free_at_init_bytes - observed_tokens * bytes_per_token


def max_running_requests(
    total_tokens: int,
    context_len: int,
    max_running_requests_flag: int | None = None,
    attn_dp: int = 1,
) -> int:
    """SGLang's cap on one scheduler's running requests (one per DP replica or attention DP
    group): min(tokens // 2, or the flag split among the attention DP groups, the
    req_to_token pool size) (0.5.6.post2 `managers/tp_worker.py:292-300`; `attn_dp`:
    `Parallel.attn_dp`). The pool holds clamp(tokens / context x 512, 2048, 4096) requests,
    or the flag itself when given (`model_executor/model_runner.py:1650-1660`). 0.5.23 caps a
    given flag at tokens // 2 too (`mem_cache/kv_cache_configurator.py:3119-3132`)."""
    if total_tokens <= 0:
        return 0
    if max_running_requests_flag is None:
        req_pool = min(max(int(total_tokens / max(context_len, 1) * 512), 2048), 4096)
        return min(total_tokens // 2, req_pool)
    return min(max_running_requests_flag // attn_dp, max_running_requests_flag)


def admissible_requests(total_tokens: int, avg_len: float, running_cap: int) -> int:
    """How many requests of `avg_len` tokens (prompt + output) fit in the pool at once."""
    if avg_len <= 0:
        raise ValueError("avg_len must be positive")
    return max(0, min(int(total_tokens // avg_len), running_cap))


# --- HiCache -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HiCacheVerdict:
    """What `--hicache-size GB` (per rank) asks of the host, and whether SGLang can start with it."""

    size_gb_per_rank: float
    ranks: int
    host_tokens_per_rank: int
    host_total_gb: float
    feasible: bool
    reason: str


def hicache_verdict(
    size_gb_per_rank: float,
    bytes_per_token: int,
    device_tokens: int,
    host_ram_bytes: float | None,
    ranks: int = 1,
    page_size: int = 1,
) -> HiCacheVerdict:
    """Judge one `--hicache-size` value the way SGLang's start-up will.

    Every GPU rank (`Parallel.ranks`: T x P, times D only for replicas) allocates its own
    pinned host pool of the full size. Each rank checks `size > available - 10 GiB` on its
    own, concurrently, so the real limit is the sum over ranks. The host pool must also hold
    more tokens than the device pool.
    """
    per_rank_bytes = size_gb_per_rank * GB
    host_tokens = math.ceil(per_rank_bytes / bytes_per_token)
    host_tokens = -(-host_tokens // page_size) * page_size
    total_gb = size_gb_per_rank * ranks
    if size_gb_per_rank <= 0:
        return HiCacheVerdict(size_gb_per_rank, ranks, 0, 0.0, True, "HiCache off")
    if host_tokens <= device_tokens:
        return HiCacheVerdict(
            size_gb_per_rank,
            ranks,
            host_tokens,
            total_gb,
            False,
            f"host pool of {host_tokens:,} tokens is not larger than the device pool of "
            f"{device_tokens:,} tokens (SGLang: AssertionError 'The host memory should be larger "
            "than the device memory')",
        )
    if host_ram_bytes is not None:
        budget = host_ram_bytes - HICACHE_HOST_RESERVE_BYTES
        if per_rank_bytes > budget:
            return HiCacheVerdict(
                size_gb_per_rank,
                ranks,
                host_tokens,
                total_gb,
                False,
                f"{size_gb_per_rank:g} GB per rank exceeds host RAM {host_ram_bytes / GB:.0f} GB "
                "less SGLang's 10 GiB reserve (ValueError 'Not enough host memory available')",
            )
        if total_gb * GB > budget:
            return HiCacheVerdict(
                size_gb_per_rank,
                ranks,
                host_tokens,
                total_gb,
                False,
                f"{ranks} ranks x {size_gb_per_rank:g} GB = {total_gb:,.0f} GB of pinned host RAM; "
                f"the host has {host_ram_bytes / GB:.0f} GB (each rank allocates its own pool: "
                "later ranks fail 'Not enough host memory available' or the host overcommits)",
            )
    reason = (
        f"{ranks} ranks x {size_gb_per_rank:g} GB = {total_gb:,.0f} GB host RAM; "
        f"{host_tokens:,} prefix tokens per rank kept on the host"
    )
    return HiCacheVerdict(size_gb_per_rank, ranks, host_tokens, total_gb, True, reason)


def max_hicache_gb_per_rank(host_ram_bytes: float, ranks: int = 1) -> int:
    """The largest whole `--hicache-size` every rank (`Parallel.ranks`) can allocate together
    on this host."""
    budget = host_ram_bytes - HICACHE_HOST_RESERVE_BYTES
    return max(0, math.floor(budget / ranks / GB))


HICACHE_STATEMENT = (
    "HiCache keeps evicted prefixes in host RAM so a later request that shares them loads them "
    "back over PCIe instead of recomputing; it does not raise max_total_num_tokens, "
    "max_running_requests or admission: running requests always live in the GPU pool."
)
