"""Before a restart: reject what certainly cannot start, with a reason. Pure.

Knowledge grows during a study: the first successful start calibrates the KV pool (tokens at an
mfs), and every CUDA-graph capture failure marks the mfs above which the same memory flags fail.
Only certain failures are rejected; anything doubtful is left to measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tuner import capacity as cap

#: flags that change how much GPU memory is left besides the KV pool: a CUDA-graph failure only
#: predicts another when all of these are equal
MEMORY_FLAGS = (
    "tensor-parallel-size", "tp-size", "data-parallel-size", "dp-size", "pipeline-parallel-size",
    "cuda-graph-max-bs", "cuda-graph-bs", "disable-cuda-graph", "chunked-prefill-size",
    "max-prefill-tokens", "max-running-requests", "kv-cache-dtype", "page-size", "context-length",
    "quantization", "enable-dp-attention", "max-total-tokens", "model-path",
)  # fmt: skip


@dataclass(frozen=True)
class Hardware:
    """What the pre-check knows of the host (any part may be unknown)."""

    bytes_per_token: int | None = None
    gpu_mem_mib: float | None = None
    host_ram_gb: float | None = None


@dataclass(frozen=True)
class Knowledge:
    """What earlier trials taught: one pool calibration, and CUDA-graph failures by memory key."""

    calibration: tuple[int, float] | None = None  # (max_total_num_tokens, mfs) seen on a real start
    graph_failures: tuple[tuple[tuple, float, int], ...] = field(default_factory=tuple)

    def with_start(self, tokens: int, mfs: float) -> Knowledge:
        return self if self.calibration else replace(self, calibration=(tokens, mfs))

    def with_graph_failure(self, flags: Mapping[str, Any], trial: int) -> Knowledge:
        entry = (memory_key(flags), float(flags.get("mem-fraction-static", 0) or 0), trial)
        return replace(self, graph_failures=(*self.graph_failures, entry))


@dataclass(frozen=True)
class Verdict:
    feasible: bool
    reason: str = ""
    kind: str = ""  # failure class, as the server would have reported it


def memory_key(flags: Mapping[str, Any]) -> tuple:
    return tuple((k, str(flags.get(k))) for k in MEMORY_FLAGS)


def _parallel(flags: Mapping[str, Any]) -> tuple[int, int]:
    tp = int(flags.get("tensor-parallel-size") or flags.get("tp-size") or 1)
    dp = int(flags.get("data-parallel-size") or flags.get("dp-size") or 1)
    return tp, dp


def projected_tokens(flags: Mapping[str, Any], hw: Hardware, know: Knowledge) -> int | None:
    """Pool size at this mfs from the calibration, or None when it cannot be known yet."""
    mfs = flags.get("mem-fraction-static")
    if mfs is None or know.calibration is None or not hw.gpu_mem_mib or not hw.bytes_per_token:
        return None
    tokens, at_mfs = know.calibration
    free0 = hw.gpu_mem_mib * cap.MIB
    fixed = cap.calibrate_fixed_bytes(tokens, at_mfs, free0, hw.bytes_per_token)
    return cap.pool_tokens(float(mfs), free0, fixed, hw.bytes_per_token)


def precheck(flags: Mapping[str, Any], hw: Hardware, know: Knowledge) -> Verdict:
    """Judge the full flag set (fixed + trial's) before spending a restart on it."""
    mfs = flags.get("mem-fraction-static")
    if mfs is not None:
        key = memory_key(flags)
        for failed_key, failed_mfs, trial in know.graph_failures:
            if failed_key == key and float(mfs) >= failed_mfs:
                return Verdict(
                    False,
                    f"mem-fraction-static {float(mfs):g} >= {failed_mfs:g}, which failed CUDA-graph "
                    f"capture with the same memory flags (trial {trial})",
                    "oom_cuda_graph",
                )
    tokens = projected_tokens(flags, hw, know)
    if tokens is not None and tokens <= 0:
        return Verdict(
            False, f"mem-fraction-static {float(mfs):g} leaves no KV pool (projected {tokens} tokens)",
            "not_enough_memory",
        )  # fmt: skip
    size = flags.get("hicache-size")
    if size and hw.bytes_per_token:
        tp, dp = _parallel(flags)
        host = None if hw.host_ram_gb is None else hw.host_ram_gb * cap.GB
        v = cap.hicache_verdict(float(size), hw.bytes_per_token, tokens or 0, host, tp, dp)
        if not v.feasible:
            kind = "host_memory" if "host RAM" in v.reason or "exceeds" in v.reason else "crashed"
            return Verdict(False, f"hicache-size {size}: {v.reason}", kind)
    return Verdict(True)
