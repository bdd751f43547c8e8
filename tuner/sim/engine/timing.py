"""Step times of the simulated server: a memory-bound decode, a compute-bound prefill, PCIe copies,
speculative draft-and-verify iterations, and DP attention's lockstep steps.

`StepTimeModel` is the formula; `StepCost` applies it to one engine run, with noise.

The coefficients are the `timing:` section of a simulator profile (SIM-ENGINE owns that schema);
`StepTimeModel.from_mapping(profile.timing)` parses it. Pure.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from tuner.errors import ConfigError
from tuner.sim.engine.radix import RadixCache
from tuner.sim.engine.schedtypes import SpecParams

GB = 1e9
GIB = 2**30
#: every timing figure is ms, us, ns, GB/s or a count: beyond this it is a typo
MAX_TIMING = 1e6
#: noise is a spread of a few percent; at 50% a run's factor N(1, sd) goes negative often
MAX_NOISE_PCT = 50.0


@dataclass(frozen=True)
class StepTimeModel:
    """Step times of one deployment; the `timing:` section of a simulator profile.

    decode = fixed + weights read + KV read + per-request work (+ no-CUDA-graph penalty);
    weights read = (dense + moe x fraction of experts the batch touches) / (HBM x efficiency);
    KV read = kv tokens x bytes per token / (HBM x kv efficiency).
    prefill = fixed + new tokens x per-token compute + attention pairs x per-pair cost.
    Noise: each run draws one factor N(1, noise_run_pct%), each step another N(1, noise_step_pct%).

    Speculative decoding (`spec_decode_s`): one verify pass of the target over batch x draft
    tokens (weights for the experts those tokens touch, the KV read once per request, per-token
    work x every verified token), plus num_steps + 1 draft forwards (the draft steps and the
    draft's extend over the accepted tokens), each `draft_step_ms` + the draft's weights + its
    one-layer KV + `draft_us_per_token` x batch x topk. Without the overlap scheduler every
    step adds `no_overlap_ms` (CPU scheduling no longer hidden behind the GPU).

    DP attention (`dp_step_s`): the groups step in lockstep; a step lasts the slowest group's
    own part (its attention: its KV, and `attn_compute_share` of the per-token work of its own
    batch, done on attention TP = tp / groups GPUs) plus the shared part on the gathered batch
    of every group (fixed costs, weights with the experts every group's tokens touch and the
    replicated attention weights, the rest of the per-token work, `dp_gather_us_per_token` for
    the all-gather and scatter of hidden states, `dp_fixed_ms` for the groups' sync).
    """

    decode_fixed_ms: float = 5.0
    hbm_gbps: float = 2000.0
    hbm_efficiency: float = 0.7
    dense_weights_gib: float = 10.0
    moe_weights_gib: float = 0.0
    moe_experts: int = 0
    moe_topk: int = 0
    kv_read_efficiency: float = 0.5
    decode_per_req_us: float = 30.0
    no_cuda_graph_ms: float = 0.0
    prefill_fixed_ms: float = 5.0
    prefill_us_per_token: float = 50.0
    prefill_attn_ns_per_pair: float = 0.5
    pcie_gbps: float = 25.0
    hicache_write_overlap: float = 0.8  # share of background host writes hidden behind compute
    noise_run_pct: float = 2.0
    noise_step_pct: float = 1.0
    # speculative decoding
    draft_step_ms: float = 1.0  # one draft forward: launches, its layer's collectives, top-k
    draft_us_per_token: float = 5.0  # per drafted token (batch x topk)
    verify_us_per_token: float = 0.0  # per verified token; 0: decode_per_req_us
    no_overlap_ms: float = 0.0  # per step when the overlap scheduler is off
    # DP attention
    attn_compute_share: float = 0.3  # of per-token work: attention, done per group
    dp_gather_us_per_token: float = 0.0  # all-gather + scatter of a token's hidden states
    dp_fixed_ms: float = 0.0  # the groups' per-step synchronization
    bytes_per_token: int = 0  # set by Engine from the model, not from the profile

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> StepTimeModel:
        """Parse a profile's `timing:` mapping; unknown keys and non-numbers are errors."""
        known = {f.name for f in fields(cls)} - {"bytes_per_token"}
        values: dict[str, Any] = {}
        for key, value in (mapping or {}).items():
            if key not in known:
                raise ConfigError("unknown key", key=f"timing.{key}")
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= MAX_TIMING
            ):
                # 1e308 us per token made one virtual step last forever: bounded, finite
                raise ConfigError(
                    f"expected a number in 0..{MAX_TIMING:g}, got {value!r}", key=f"timing.{key}"
                )
            values[key] = int(value) if key in ("moe_experts", "moe_topk") else float(value)
        for key in ("hbm_gbps", "hbm_efficiency", "kv_read_efficiency", "pcie_gbps"):
            if key in values and values[key] <= 0:
                raise ConfigError("must be positive", key=f"timing.{key}")
        for key in (
            "hbm_efficiency",
            "kv_read_efficiency",
            "hicache_write_overlap",
            "attn_compute_share",
        ):
            if values.get(key, 0) > 1:
                raise ConfigError("must be a fraction in 0..1", key=f"timing.{key}")
        for key in ("noise_run_pct", "noise_step_pct"):
            if values.get(key, 0) > MAX_NOISE_PCT:
                raise ConfigError(f"must be at most {MAX_NOISE_PCT:g} (%)", key=f"timing.{key}")
        if values.get("moe_topk", 0) > values.get("moe_experts", 0):
            raise ConfigError("must not exceed timing.moe_experts", key="timing.moe_topk")
        return cls(**values)

    def decode_s(self, batch: int, kv_tokens: int, cuda_graph: bool = True) -> float:
        """Seconds of one decode step for `batch` requests attending `kv_tokens` in total."""
        if batch <= 0:
            return 0.0
        frac = 0.0
        if self.moe_experts:
            frac = 1.0 - (1.0 - self.moe_topk / self.moe_experts) ** batch
        weights = (self.dense_weights_gib + self.moe_weights_gib * frac) * GIB
        t = self.decode_fixed_ms / 1e3
        t += weights / (self.hbm_gbps * self.hbm_efficiency * GB)
        t += kv_tokens * self.bytes_per_token / (self.hbm_gbps * self.kv_read_efficiency * GB)
        t += batch * self.decode_per_req_us / 1e6
        if not cuda_graph:
            t += self.no_cuda_graph_ms / 1e3
        return t

    def _weights_s(self, tokens: int, extra_gib: float = 0.0) -> float:
        """Weights one forward reads: the dense part, the experts `tokens` touch, `extra_gib`."""
        frac = 0.0
        if self.moe_experts:
            frac = 1.0 - (1.0 - self.moe_topk / self.moe_experts) ** tokens
        gib = self.dense_weights_gib + extra_gib + self.moe_weights_gib * frac
        return gib * GIB / (self.hbm_gbps * self.hbm_efficiency * GB)

    def _kv_s(self, kv_tokens: int, bytes_per_token: int) -> float:
        return kv_tokens * bytes_per_token / (self.hbm_gbps * self.kv_read_efficiency * GB)

    def _verify_us(self) -> float:
        return self.verify_us_per_token or self.decode_per_req_us

    def draft_s(self, batch: int, kv_tokens: int, spec: SpecParams) -> float:
        """The draft's forwards of one speculative iteration: num_steps + 1 of them."""
        one = (
            self.draft_step_ms / 1e3
            + spec.draft_weights_gib * GIB / (self.hbm_gbps * self.hbm_efficiency * GB)
            + batch * spec.topk * self.draft_us_per_token / 1e6
            + self._kv_s(kv_tokens, spec.draft_bytes_per_token)
        )
        return one * (spec.num_steps + 1)

    def spec_decode_s(
        self, batch: int, kv_tokens: int, cuda_graph: bool, spec: SpecParams
    ) -> float:
        """Seconds of one draft-and-verify iteration for `batch` requests."""
        if batch <= 0:
            return 0.0
        verified = batch * spec.num_draft_tokens
        t = self.decode_fixed_ms / 1e3 + self._weights_s(verified)
        t += self._kv_s(kv_tokens, self.bytes_per_token)
        t += verified * self._verify_us() / 1e6
        if not cuda_graph:
            t += self.no_cuda_graph_ms / 1e3
        return t + self.draft_s(batch, kv_tokens, spec)

    def draft_prefill_s(self, new_tokens: int, spec: SpecParams) -> float:
        """The draft's extend over a prefill batch's new tokens (its hidden states)."""
        if new_tokens <= 0:
            return 0.0
        return self.draft_step_ms / 1e3 + new_tokens * self.draft_us_per_token / 1e6

    def dp_step_s(
        self,
        works: Sequence[Work],
        groups: int,
        extra_weights_gib: float,
        spec: SpecParams | None = None,
    ) -> float:
        """Seconds of one lockstep step of DP attention groups (class docstring)."""
        share = self.attn_compute_share
        per_tok = self._verify_us() if spec is not None else self.decode_per_req_us
        ntok = spec.num_draft_tokens if spec is not None else 1
        own = 0.0
        dec = pre = batch = 0
        graphs = True
        for w in works:
            if w.kind == DECODE:
                n = w.tokens * ntok
                dec += n
                batch += w.tokens
                g = self._kv_s(w.kv, self.bytes_per_token) + share * per_tok * n * groups / 1e6
                if spec is not None:
                    g += self._kv_s(w.kv, spec.draft_bytes_per_token) * (spec.num_steps + 1)
                graphs = graphs and w.graph
            elif w.kind == PREFILL:
                pre += w.tokens
                g = (
                    share * self.prefill_us_per_token * w.tokens * groups / 1e6
                    + w.pairs * self.prefill_attn_ns_per_pair * groups / 1e9
                )
                g = max(g, self.load_back_s(w.load))
                if spec is not None:
                    g += self.draft_prefill_s(w.tokens, spec)
            else:
                continue
            own = max(own, g)
        if not dec and not pre:
            return 0.0
        shared = self.dp_fixed_ms / 1e3 + (dec + pre) * self.dp_gather_us_per_token / 1e6
        if dec:
            shared += self.decode_fixed_ms / 1e3 + self._weights_s(dec + pre, extra_weights_gib)
            shared += (1 - share) * per_tok * dec / 1e6
            if pre or not graphs:  # an extend in the batch, or a group past its graphs
                shared += self.no_cuda_graph_ms / 1e3
            if spec is not None:
                shared += self.draft_s(batch, 0, spec)
        if pre:
            shared += self.prefill_fixed_ms / 1e3
            shared += (1 - share) * self.prefill_us_per_token * pre / 1e6
        return own + shared

    def prefill_s(self, new_tokens: int, attn_pairs: float = 0.0) -> float:
        """Seconds of one prefill batch of `new_tokens` with `attn_pairs` (query, key) pairs."""
        if new_tokens <= 0:
            return 0.0
        return (
            self.prefill_fixed_ms / 1e3
            + new_tokens * self.prefill_us_per_token / 1e6
            + attn_pairs * self.prefill_attn_ns_per_pair / 1e9
        )

    def load_back_s(self, tokens: int) -> float:
        """Seconds to copy `tokens` of KV between host and GPU over PCIe (either direction)."""
        return tokens * self.bytes_per_token / (self.pcie_gbps * GB)


#: what a DP attention group does in one lockstep step (`Work.kind`)
IDLE, PREFILL, DECODE = 0, 1, 2


class Work:
    """One group's part of a lockstep step: a prefill of `tokens` new tokens (`pairs` attention
    pairs, `load` tokens loaded back from the host) or a decode of `tokens` requests attending
    `kv` tokens (`graph`: within its CUDA graphs)."""

    __slots__ = ("graph", "kind", "kv", "load", "pairs", "tokens")

    def __init__(
        self,
        kind: int,
        tokens: int = 0,
        *,
        pairs: float = 0.0,
        load: int = 0,
        kv: int = 0,
        graph: bool = True,
    ):
        self.kind = kind
        self.tokens = tokens
        self.pairs = pairs
        self.load = load
        self.kv = kv
        self.graph = graph


class StepCost:
    """One engine run's step times: the model with run-level noise, step jitter and host writes.

    `rng` is the engine's generator (shared with its random schedule policy, so the draw order
    is the engine's); the run-level factor is drawn here, once, clipped at 3 sigma.
    """

    def __init__(
        self,
        model: StepTimeModel,
        rng: random.Random,
        cache: RadixCache | None,
        spec: SpecParams | None = None,
        overlap: bool = True,
    ):
        self.model = model
        self.rng = rng
        self.cache = cache if cache is not None and cache.hicache else None
        sigma = model.noise_run_pct / 100
        self.run_factor = 1.0 + max(-3 * sigma, min(3 * sigma, rng.gauss(0.0, sigma)))
        self.step_sigma = model.noise_step_pct / 100
        self.spec = spec
        #: CPU time per step the overlap scheduler would have hidden
        self.exposed_s = 0.0 if overlap else model.no_overlap_ms / 1e3

    def prefill_s(self, new_tokens: int, attn_pairs: float, load_tokens: int) -> float:
        """A prefill batch: compute, or the host load-back it waits for when that is longer."""
        model = self.model
        t = model.prefill_s(new_tokens, attn_pairs)
        if self.spec is not None:
            t += model.draft_prefill_s(new_tokens, self.spec)
        return self.noisy(max(t, model.load_back_s(load_tokens)) + self.exposed_s)

    def decode_s(self, batch: int, kv_tokens: int, cuda_graph: bool) -> float:
        """One decode step (a draft-and-verify iteration under speculative decoding)."""
        if self.spec is None and not self.exposed_s:
            return self.noisy(self.model.decode_s(batch, kv_tokens, cuda_graph))
        if self.spec is not None:
            t = self.model.spec_decode_s(batch, kv_tokens, cuda_graph, self.spec)
        else:
            t = self.model.decode_s(batch, kv_tokens, cuda_graph)
        return self.noisy(t + self.exposed_s)

    def noisy(self, seconds: float) -> float:
        """Apply the run-level factor and a per-step jitter, plus host-write time."""
        model = self.model
        if self.cache is not None:
            background, blocking = self.cache.take_io()
            seconds += model.load_back_s(blocking)
            seconds += model.load_back_s(background) * (1 - model.hicache_write_overlap)
        sigma = self.step_sigma
        jitter = 1.0 + self.rng.gauss(0.0, sigma) if sigma else 1.0
        return seconds * self.run_factor * max(0.5, jitter)
