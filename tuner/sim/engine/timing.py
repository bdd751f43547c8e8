"""Step times of the simulated server: a memory-bound decode, a compute-bound prefill, PCIe copies.

`StepTimeModel` is the formula; `StepCost` applies it to one engine run, with noise.

The coefficients are the `timing:` section of a simulator profile (SIM-ENGINE owns that schema);
`StepTimeModel.from_mapping(profile.timing)` parses it. Pure.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tuner.errors import ConfigError
from tuner.sim.engine.radix import RadixCache

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
        for key in ("hbm_efficiency", "kv_read_efficiency", "hicache_write_overlap"):
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


class StepCost:
    """One engine run's step times: the model with run-level noise, step jitter and host writes.

    `rng` is the engine's generator (shared with its random schedule policy, so the draw order
    is the engine's); the run-level factor is drawn here, once, clipped at 3 sigma.
    """

    def __init__(self, model: StepTimeModel, rng: random.Random, cache: RadixCache | None):
        self.model = model
        self.rng = rng
        self.cache = cache if cache is not None and cache.hicache else None
        sigma = model.noise_run_pct / 100
        self.run_factor = 1.0 + max(-3 * sigma, min(3 * sigma, rng.gauss(0.0, sigma)))
        self.step_sigma = model.noise_step_pct / 100

    def prefill_s(self, new_tokens: int, attn_pairs: float, load_tokens: int) -> float:
        """A prefill batch: compute, or the host load-back it waits for when that is longer."""
        model = self.model
        return self.noisy(
            max(model.prefill_s(new_tokens, attn_pairs), model.load_back_s(load_tokens))
        )

    def decode_s(self, batch: int, kv_tokens: int, cuda_graph: bool) -> float:
        """One decode step."""
        return self.noisy(self.model.decode_s(batch, kv_tokens, cuda_graph))

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
