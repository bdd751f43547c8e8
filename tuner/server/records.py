"""What a server restart returns, and what a death looks like: frozen records (no I/O).

`server.lifecycle.Server` produces them (and re-exports them); the runner and the study read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi names it."""

    name: str
    memory_total_mib: int


#: a trial's server-info keys for `GpuMemory` (search/ceiling.py reads them)
GPU_USED = "gpu_used_mib"
GPU_TOTAL = "gpu_total_mib"


@dataclass(frozen=True)
class GpuMemory:
    """The GPU memory a running server holds: the most any of the host's GPUs has in use and
    the least any has in all (nvidia-smi's memory.used and memory.total, MiB). PyTorch's caching
    allocator keeps what a forward pass once needed until `torch.cuda.empty_cache()` (SGLang
    calls it on /flush_cache), so read after a load run this is the run's peak, activations
    included."""

    used_mib: float
    total_mib: float

    def facts(self) -> dict[str, float]:
        """What a trial records of it (beside `StartResult.facts`)."""
        return {GPU_USED: self.used_mib, GPU_TOTAL: self.total_mib}


@dataclass(frozen=True)
class Timings:
    """Where a restart's time went (seconds); overhead_s is everything but the server's start-up."""

    stop_s: float = 0.0
    prepare_s: float = 0.0
    launch_s: float = 0.0
    start_to_ready_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.start_to_ready_s


@dataclass(frozen=True)
class StartResult:
    """The outcome of one restart."""

    ok: bool
    failure: str | None
    reason: str
    evidence: tuple[str, ...] = ()
    pgid: int | None = None
    exit_code: int | None = None
    log_path: str = ""
    max_total_num_tokens: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    version: str | None = None
    server_pid: int | None = None
    gpus: tuple[GpuInfo, ...] = ()
    timings: Timings = field(default_factory=Timings)

    def facts(self) -> dict[str, Any]:
        """What a trial records of this start: the server's resolved values, where the time
        went, the GPU, and for a failure the log lines that show why (None values dropped)."""
        info: dict[str, Any] = {
            "max_total_num_tokens": self.max_total_num_tokens,
            "mem_fraction_static": self.mem_fraction_static,
            "max_running_requests": self.max_running_requests,
            "version": self.version,
            "restart_s": round(self.timings.total_s, 3),
            "overhead_s": round(self.timings.overhead_s, 3),
        }
        if self.gpus:
            gpu = self.gpus[0]
            info["gpu"] = f"{len(self.gpus)} x {gpu.name} ({gpu.memory_total_mib} MiB)"
        if not self.ok:
            info["evidence"] = list(self.evidence[-8:])
        return {k: v for k, v in info.items() if v is not None}


@dataclass(frozen=True)
class ServerDeath:
    """A server that was running and is gone: why, and the log lines that say so."""

    failure: str
    reason: str
    evidence: tuple[str, ...]
    exit_code: int | None
