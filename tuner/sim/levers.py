"""A profile's two levers beyond memory: its speculative draft (`speculative:`) and what DP
attention costs (`dp_attention:`). Pure.

    speculative:
      algorithms: [EAGLE3]          # the resolved --speculative-algorithm values it serves
      weights_gib_per_gpu: 0.6      # the draft's weights per GPU at the profile's TP
      layers: 1                     # draft layers with KV (0.5.23 grows the target's cell by them)
      kv_bytes_per_token: 1152      # 0.5.6.post2's separate draft pool: bytes per token per GPU
      graph_base_mib: 256           # draft CUDA graphs: base + per token x graph bs x tokens
      graph_mib_per_token: 0.5
      default_kind: chat            # the acceptance kind traffic plays unless --sim-acceptance
      acceptance:                   # P(draft position i accepted | positions before it were)
        chat: [0.75, 0.68, 0.62]
    dp_attention:
      attention_weights_gib: 9.77   # weights split over the attention TP group (whole model)
      graph_mib_per_bs_rank: 3.0    # CUDA-graph memory per graph batch per DP rank

The acceptance model: a draft chain of depth d = min(num_steps, num_draft_tokens - 1); position
i is accepted with probability p_i given the ones before it were; a verify step yields 1 + the
accepted run (SGLang's accept length, bonus token included). Positions past the profile's list
repeat its last value. A tree (topk > 1) is played as k = min(topk, (num_draft_tokens - 1) // d)
independent candidates a level, 1 - (1 - p_i)^k (ASSUMPTION: the verified tree's nodes spread
evenly over its depth; SGLang keeps the most likely ones, and real candidates are correlated, so
this is optimistic for wide trees).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.errors import InputFileError

#: speculative algorithms as SGLang resolves them (NEXTN is EAGLE)
DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
_SPEC_NUMBERS = ("weights_gib_per_gpu", "graph_base_mib", "graph_mib_per_token")
_SPEC_KEYS = {
    *_SPEC_NUMBERS,
    "algorithms",
    "layers",
    "kv_bytes_per_token",
    "default_kind",
    "acceptance",
}
_DP_KEYS = {"attention_weights_gib", "graph_mib_per_bs_rank", "graph_mib_per_bs_rank_large"}
#: SGLang's own DP-attention graph reserve past this graph batch size (server_args.py:868)
LARGE_GRAPH_BS = 300


@dataclass(frozen=True)
class DraftProfile:
    """The profile's speculative draft (module docstring)."""

    algorithms: tuple[str, ...]
    weights_gib_per_gpu: float
    layers: int
    kv_bytes_per_token: int | None
    graph_base_mib: float
    graph_mib_per_token: float
    acceptance: Mapping[str, tuple[float, ...]]
    default_kind: str

    def chain(self, kind: str, steps: int, topk: int, draft_tokens: int) -> tuple[float, ...]:
        """Conditional acceptance per draft position for this shape (module docstring)."""
        probs = self.acceptance[kind]
        depth = max(0, min(steps, draft_tokens - 1))
        if depth == 0:
            return ()
        # the tree's draft_tokens - 1 nodes spread over its depth bound the candidates a level
        k = max(1, min(topk, (draft_tokens - 1) // depth))
        out = []
        for i in range(depth):
            p = probs[min(i, len(probs) - 1)]
            out.append(1.0 - (1.0 - p) ** k)
        return tuple(out)

    def graph_mib(self, graph_bs: int, steps: int, topk: int, draft_tokens: int) -> float:
        """The draft's CUDA graphs: decode steps over bs x topk tokens, extend over bs x
        draft tokens."""
        tokens = graph_bs * (topk * steps + draft_tokens)
        return self.graph_base_mib + self.graph_mib_per_token * tokens


@dataclass(frozen=True)
class DPAttentionCosts:
    """What DP attention costs a GPU beyond its KV (module docstring)."""

    attention_weights_gib: float
    graph_mib_per_bs_rank: float = 3.0
    graph_mib_per_bs_rank_large: float = 1.5

    def extra_weights_gib(self, tp: int, attn_tp: int) -> float:
        """Attention weights a GPU holds beyond its TP share: split over attn_tp GPUs, not tp
        (sglang/srt/models/deepseek_v2.py:1267-1364: q_b, kv_b and o_proj are parallel over
        the attention TP group)."""
        return self.attention_weights_gib * (1 / max(attn_tp, 1) - 1 / max(tp, 1))

    def graph_mib(self, graph_bs: int, groups: int) -> float:
        """Extra CUDA-graph memory: the MoE layers of a captured batch run on the batch of
        every group (`global_dp_buffer_len = num_tokens x dp_size`, model_executor/
        cuda_graph_runner.py:581)."""
        mib = self.graph_mib_per_bs_rank * graph_bs * groups
        if graph_bs > LARGE_GRAPH_BS:
            mib += self.graph_mib_per_bs_rank_large * graph_bs * groups
        return mib


def _num(file: str, key: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e9:
        raise InputFileError(file, f"{key}: expected a number >= 0, got {value!r}")
    if positive and value == 0:
        raise InputFileError(file, f"{key}: must be positive")
    return float(value)


def _probs(file: str, key: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise InputFileError(file, f"{key}: expected a list of probabilities")
    out = tuple(_num(file, key, p) for p in value)
    if any(p > 1 for p in out):
        raise InputFileError(file, f"{key}: probabilities must be in 0..1")
    return out


def parse_speculative(file: str, raw: Any) -> DraftProfile | None:
    """The `speculative:` section, or None when the profile has none."""
    if raw is None:
        return None
    key = "speculative"
    if not isinstance(raw, Mapping):
        raise InputFileError(file, f"{key}: expected a mapping")
    bad = sorted((set(raw) ^ _SPEC_KEYS) - {"kv_bytes_per_token"})
    if bad:
        raise InputFileError(file, f"{key}.{bad[0]}: unknown or missing")
    algorithms = raw["algorithms"]
    if (
        not isinstance(algorithms, list)
        or not algorithms
        or any(a not in DRAFT_ALGORITHMS for a in algorithms)
    ):
        raise InputFileError(file, f"{key}.algorithms: a list of {', '.join(DRAFT_ALGORITHMS)}")
    layers = raw["layers"]
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= 1000:
        raise InputFileError(file, f"{key}.layers: expected a positive integer")
    kv = raw.get("kv_bytes_per_token")
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv <= 0):
        raise InputFileError(file, f"{key}.kv_bytes_per_token: expected a positive integer")
    kinds = raw["acceptance"]
    if not isinstance(kinds, Mapping) or not kinds:
        raise InputFileError(file, f"{key}.acceptance: expected a mapping of kind -> list")
    acceptance = {str(k): _probs(file, f"{key}.acceptance.{k}", v) for k, v in kinds.items()}
    default = raw["default_kind"]
    if default not in acceptance:
        raise InputFileError(file, f"{key}.default_kind: not one of the acceptance kinds")
    nums = {k: _num(file, f"{key}.{k}", raw[k]) for k in _SPEC_NUMBERS}
    return DraftProfile(
        algorithms=tuple(algorithms),
        layers=layers,
        kv_bytes_per_token=kv,
        acceptance=acceptance,
        default_kind=default,
        **nums,
    )


def parse_dp_attention(file: str, raw: Any) -> DPAttentionCosts | None:
    """The `dp_attention:` section, or None (DP attention then costs no extra memory)."""
    if raw is None:
        return None
    key = "dp_attention"
    if not isinstance(raw, Mapping):
        raise InputFileError(file, f"{key}: expected a mapping")
    unknown = sorted(set(raw) - _DP_KEYS)
    if unknown:
        raise InputFileError(file, f"{key}.{unknown[0]}: unknown key")
    if "attention_weights_gib" not in raw:
        raise InputFileError(file, f"{key}.attention_weights_gib: missing")
    return DPAttentionCosts(**{k: _num(file, f"{key}.{k}", v) for k, v in raw.items()})
