"""The host's GPUs as nvidia-smi reports them: which, and how much memory they hold now.

Both run on the server's host (a `Host`), where the lifecycle found nvidia-smi.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.hosts.base import Host
from tuner.server.records import GpuInfo, GpuMemory

CSV = "--format=csv,noheader,nounits"
#: nvidia-smi answers in a second or two; past this the host is in trouble (CommandTimeout)
SMI_TIMEOUT_S = 30.0


def gpu_list(host: Host, nvidia_smi: Sequence[str]) -> tuple[GpuInfo, ...]:
    """Each GPU's model and memory (empty when nvidia-smi fails). `nvidia_smi` is its command
    (nvidia-smi, or the simulator's: server/target.py `Launch.nvidia_smi`)."""
    res = host.run([*nvidia_smi, "--query-gpu=name,memory.total", CSV])
    rows = [ln.rpartition(",") for ln in res.stdout.splitlines()] if res.ok else []
    return tuple(GpuInfo(n.strip(), int(float(m))) for n, _, m in rows if n.strip())


def memory_in_use(host: Host, nvidia_smi: Sequence[str]) -> GpuMemory | None:
    """The memory the host's GPUs hold now (None when nvidia-smi fails). Every GPU of the host
    counts: another job's memory only makes the mfs ceiling read from it (search/ceiling.py)
    lower, never higher."""
    query = [*nvidia_smi, "--query-gpu=memory.used,memory.total", CSV]
    res = host.run(query, timeout=SMI_TIMEOUT_S)
    return gpu_memory_of(res.stdout) if res.ok else None


def gpu_memory_of(csv: str) -> GpuMemory | None:
    """`nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits` ->
    GpuMemory, or None when no row reads as two numbers ("[N/A]" on some GPUs)."""
    rows = []
    for line in csv.splitlines():
        used, _, total = line.partition(",")
        try:
            rows.append((float(used), float(total)))
        except ValueError:
            continue
    if not rows:
        return None
    return GpuMemory(max(u for u, _ in rows), min(t for _, t in rows))
