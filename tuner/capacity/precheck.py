"""Before a restart: reject what certainly cannot start, with a reason. Pure.

Knowledge grows during a study: the first successful start calibrates the KV pool (tokens at an
mfs), every CUDA-graph capture failure marks the mfs above which the same memory flags fail, a
"Not enough memory" start the mfs at or below which they fail, and a death under load (a prefill
out of memory) at mfs m and concurrency c that higher m with the same flags, or with a larger
chunked-prefill-size, dies at c or more (less headroom, prefills no smaller). Only certain
failures are rejected; anything doubtful is left to measurement.

Bytes per token are the trial's own (`cell_bounds`): the model's config under the trial's
attention TP (DP attention searched or not) and KV dtype, and a speculative draft's share,
which SGLang 0.5.23 adds to the cell and 0.5.6.post2 keeps in a pool of its own: the pool's
projection takes the bound that cannot reject a start either version makes. A pool seen on a
start calibrates only trials of the same layout (`POOL_FLAGS`: the weights per GPU and the
cell are the same there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.capacity import calculus as cap
from tuner.capacity.layout import cell_bounds, launch_problem, parallel_of, pool_key
from tuner.capacity.speculation import speculation_of, v056_slots_bound
from tuner.sglang.flags import effective_flags

__all__ = ["launch_problem", "parallel_of"]  # their home is capacity.layout; callers use both

#: host RAM kept back beyond SGLang's own 10 GiB reserve, for the server's other processes
#: (tokenizer, detokenizer, the Python heap) which the reserve does not cover
HOST_RAM_MARGIN = 0.05

#: flags that change how much GPU memory is left besides the KV pool: a CUDA-graph failure only
#: predicts another when all of these are equal
#: (canonical names: flags are read through SGLang's aliases, so `tp: 8` is TP 8)
MEMORY_FLAGS = (
    "tensor-parallel-size",
    "data-parallel-size",
    "pipeline-parallel-size",
    "cuda-graph-max-bs",
    "cuda-graph-bs",
    "disable-cuda-graph",
    "chunked-prefill-size",
    "max-prefill-tokens",
    "max-running-requests",
    "kv-cache-dtype",
    "page-size",
    "context-length",
    "quantization",
    "enable-dp-attention",
    "attn-dp-size",
    "enable-dp-lm-head",
    "max-total-tokens",
    "model-path",
    "speculative-algorithm",
    "speculative-draft-model-path",
    "speculative-num-steps",
    "speculative-eagle-topk",
    "speculative-num-draft-tokens",
)


@dataclass(frozen=True)
class Hardware:
    """What the pre-check knows of the host (any part may be unknown)."""

    #: the KV cell of the study's fixed `server:` flags (`model_config` gives each trial its own)
    bytes_per_token: int | None = None
    gpu_mem_mib: float | None = None
    host_ram_gb: float | None = None
    #: weights and everything else outside the KV pool (GiB per GPU), until a start calibrates it
    weights_gib: float | None = None
    #: the model's config.json (`hardware.model_config`): each trial's cell from its own flags
    model_config: Mapping[str, Any] | None = None
    #: the study's fixed flags, under a trial's (a partial flag set still gets its TP)
    server: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Knowledge:
    """What earlier trials taught: one pool calibration, and CUDA-graph failures by memory key."""

    calibration: tuple[int, float] | None = None  # (max_total_num_tokens, mfs) seen on a real start
    #: (pool key, max_total_num_tokens, mfs): the first start of each layout (`POOL_FLAGS`)
    pools: tuple[tuple[tuple, int, float], ...] = field(default_factory=tuple)
    graph_failures: tuple[tuple[tuple, float, int], ...] = field(default_factory=tuple)
    #: (memory key, mfs, trial): "Not enough memory" there, so at any lower mfs too
    floors: tuple[tuple[tuple, float, int], ...] = field(default_factory=tuple)
    #: (memory key, mfs, concurrency, trial): died under load there
    deaths: tuple[tuple[tuple, float, int, int], ...] = field(default_factory=tuple)
    #: (GPU ranks, hicache-size, trial): the host could not pin that much per rank, nor more
    host_failures: tuple[tuple[int, float, int], ...] = field(default_factory=tuple)

    def with_start(
        self, tokens: int, mfs: float, flags: Mapping[str, Any] | None = None
    ) -> Knowledge:
        """A start's pool: the first calibrates (`calibration`); with its flags, the first of
        its layout calibrates that layout's trials (`pools`)."""
        know = self if self.calibration else replace(self, calibration=(tokens, mfs))
        if flags is None:
            return know
        key = pool_key(flags)
        if any(k == key for k, _, _ in know.pools):
            return know
        return replace(know, pools=(*know.pools, (key, tokens, mfs)))

    def calibration_for(self, flags: Mapping[str, Any]) -> tuple[int, float] | None:
        """The start that calibrates a trial with these flags: its layout's first; none when
        only other layouts started (their weights per GPU or cell differ); the first start
        when no start's flags are known."""
        if not self.pools:
            return self.calibration
        key = pool_key(flags)
        return next(((t, m) for k, t, m in self.pools if k == key), None)

    def _with(self, name: str, entry: tuple) -> Knowledge:
        """`entry` added to the field `name`; each entry names its trial, so the same trial
        learned twice (live, then recalled from the study: `trial.learning.recalled`) is one entry."""
        known = getattr(self, name)
        return self if entry in known else replace(self, **{name: (*known, entry)})

    def with_graph_failure(self, flags: Mapping[str, Any], trial: int) -> Knowledge:
        return self._with("graph_failures", (memory_key(flags), _mfs(flags), trial))

    def with_floor(self, flags: Mapping[str, Any], trial: int) -> Knowledge:
        return self._with("floors", (memory_key(flags), _mfs(flags), trial))

    def with_death(self, flags: Mapping[str, Any], concurrency: int, trial: int) -> Knowledge:
        return self._with("deaths", (memory_key(flags), _mfs(flags), int(concurrency), trial))

    def with_host_failure(self, flags: Mapping[str, Any], trial: int) -> Knowledge:
        size = effective_flags(flags).get("hicache-size")
        if not size or isinstance(size, bool):
            return self
        return self._with("host_failures", (parallel_of(flags).ranks, float(size), trial))

    def death_cap(self, flags: Mapping[str, Any]) -> int | None:
        """The lowest concurrency at which a server no sturdier than this one died under load
        (`dies_no_later`), or None."""
        key, mfs = memory_key(flags), _mfs(flags)
        caps = [c for k, m, c, _ in self.deaths if dies_no_later(k, m, key, mfs)]
        return min(caps) if caps else None


def dies_no_later(died_key: tuple, died_mfs: float, key: tuple, mfs: float) -> bool:
    """Does a death under load with memory flags `died_key` at `died_mfs` say that a server with
    `key` at `mfs` dies at that concurrency or less? Yes when it has no more headroom (mfs no
    lower) for prefills no smaller: every other memory flag equal, and a chunked-prefill-size
    no smaller (the activations a prefill batch needs grow with it; the memory left after start
    does not depend on it). -1 (no chunking) and SGLang's default are compared only as equal."""
    if mfs < died_mfs:
        return False
    if key == died_key:
        return True
    died, this = dict(died_key), dict(key)
    name = "chunked-prefill-size"
    if {k: v for k, v in died.items() if k != name} != {k: v for k, v in this.items() if k != name}:
        return False
    try:
        died_chunk, chunk = int(died[name]), int(this[name])
    except (TypeError, ValueError):  # "None": SGLang picks the size by GPU, unknown here
        return False
    return 0 < died_chunk <= chunk


def _mfs(flags: Mapping[str, Any]) -> float:
    return float(effective_flags(flags).get("mem-fraction-static") or 0)


@dataclass(frozen=True)
class Verdict:
    feasible: bool
    reason: str = ""
    kind: str = ""  # failure class, as the server would have reported it


def memory_key(flags: Mapping[str, Any]) -> tuple:
    """The memory flags' values: what must be equal for one failure to predict another."""
    launched = effective_flags(flags)
    return tuple((k, str(launched.get(k))) for k in MEMORY_FLAGS)


def projected_tokens(flags: Mapping[str, Any], hw: Hardware, know: Knowledge) -> int | None:
    """Pool size at this mfs by the trial's target cell, or None when it cannot be known yet.

    The fixed part (weights and the rest) comes from a real start of the same layout when one
    was seen (`Knowledge.calibration_for`), else from `hardware.weights_gib`, a lower bound:
    the real pool can only be smaller.
    """
    mfs = flags.get("mem-fraction-static")
    cells = cell_bounds(flags, hw.model_config, hw.server, hw.bytes_per_token)
    if mfs is None or not hw.gpu_mem_mib or cells is None:
        return None
    return _pool_at(float(mfs), cells[0], hw, know.calibration_for(flags))


def _pool_at(
    mfs: float, cell: int | None, hw: Hardware, calibration: tuple[int, float] | None
) -> int | None:
    """The pool at `mfs` if SGLang divides by `cell` (None: a cell without bound, so the
    calibrated pool does not move with mfs), from the calibration or the weights."""
    assert hw.gpu_mem_mib
    free0 = hw.gpu_mem_mib * cap.MIB
    if calibration is not None:
        tokens, at_mfs = calibration
        if cell is None:
            return tokens
        fixed = cap.calibrate_fixed_bytes(tokens, at_mfs, free0, cell)
    elif hw.weights_gib is not None and cell is not None:
        fixed = int(hw.weights_gib * cap.GIB)
    else:
        return None
    return cap.pool_tokens(mfs, free0, fixed, cell)


def pool_moved(
    flags: Mapping[str, Any], tokens: int, at_mfs: float, to_mfs: float, hw: Hardware
) -> int | None:
    """The pool a start with these flags that reported `tokens` at `at_mfs` would report at
    `to_mfs` on the same GPU: its fixed part calibrated from that start, its cell from the
    flags (the smaller bound: the pool that grows most with mfs); None when the GPU's memory or
    the cell is unknown."""
    cells = cell_bounds(flags, hw.model_config, hw.server, hw.bytes_per_token)
    if not hw.gpu_mem_mib or cells is None:
        return None
    return _pool_at(to_mfs, cells[0], hw, (tokens, at_mfs))


def pool_range(flags: Mapping[str, Any], hw: Hardware, know: Knowledge) -> tuple[int, int] | None:
    """(floor, ceiling) of the pool this trial's start reports, whichever cell its SGLang
    divides by (`cell_bounds`); None when unknown. Without a start of its layout the floor is
    0 (weights alone bound the pool from above only) and the ceiling allows for the slots
    0.5.6.post2 adds under speculation; a start's own pool already holds them."""
    mfs = flags.get("mem-fraction-static")
    cells = cell_bounds(flags, hw.model_config, hw.server, hw.bytes_per_token)
    if mfs is None or not hw.gpu_mem_mib or cells is None:
        return None
    calibration = know.calibration_for(flags)
    low, high = (_pool_at(float(mfs), c, hw, calibration) for c in cells)
    if low is None:
        return None
    if calibration is None:
        spec = speculation_of(effective_flags(flags))
        slots = v056_slots_bound(flags, spec) if spec is not None and spec.has_draft else 0
        return 0, low + slots
    assert high is not None
    return min(low, high), max(low, high)


#: what the calibration cannot see: the CUDA context (0.4-1 GiB) sits in the GPU memory the
#: study states but not in what SGLang finds free, so a projection drifts by delta-mfs x this
CONTEXT_SLACK_BYTES = cap.GIB


def device_floor(
    mfs: float, tokens: int | None, bytes_per_token: int, calibration: tuple[int, float] | None
) -> int:
    """A pool the server will surely have at `mfs`, for the rule "host pool larger than the
    device pool": a rejection on an over-estimate would be a false cliff. Only a real start
    (the calibration) gives one, less the drift of the CUDA context; weights alone give an upper
    bound (nothing else counted), so no floor (0)."""
    if tokens is None or calibration is None:
        return 0
    drift = abs(mfs - calibration[1]) * CONTEXT_SLACK_BYTES / bytes_per_token
    return max(0, int(tokens - drift))


def precheck(
    flags: Mapping[str, Any], hw: Hardware, know: Knowledge, concurrency: int | None = None
) -> Verdict:
    """Judge the full flag set (fixed + trial's) before spending a restart on it; `concurrency`:
    the least the trial will load it with (None: unknown, deaths under load are not judged)."""
    # what the server is launched with: `mem-frac` is --mem-fraction-static, and HiCache is on
    # exactly when the launch turns it on (hicache-size decides, fixed or searched)
    flags = effective_flags(flags)
    if (problem := launch_problem(flags)) is not None:
        return Verdict(False, problem, "bad_flag")
    mfs = flags.get("mem-fraction-static")
    if mfs is not None and (learned := _learned(flags, float(mfs), know, concurrency)):
        return learned
    pool = pool_range(flags, hw, know)
    if pool is not None and pool[1] <= 0:
        return Verdict(
            False,
            f"mem-fraction-static {float(mfs):g} leaves no KV pool (projected {pool[1]} tokens)",
            "not_enough_memory",
        )
    size = flags.get("hicache-size")
    if not size:
        return Verdict(True)
    ranks = parallel_of(flags).ranks
    for failed_ranks, failed, trial in know.host_failures:
        if failed_ranks == ranks and float(size) >= failed:
            return Verdict(
                False,
                f"hicache-size {size} >= {failed:g}, which the host could not pin for "
                f"{ranks} rank(s) (trial {trial}: not enough host memory available)",
                "host_memory",
            )
    host = None if hw.host_ram_gb is None else hw.host_ram_gb * cap.GB
    cells = cell_bounds(flags, hw.model_config, hw.server, hw.bytes_per_token)
    if cells is not None:
        # the host pool mirrors the target's KV, so its tokens are counted at the target's cell
        floor = pool[0] if pool is not None else None
        device = device_floor(float(mfs or 0), floor, cells[0], know.calibration_for(flags))
        v = cap.hicache_verdict(float(size), cells[0], device, host, ranks)
        if not v.feasible:
            kind = "host_memory" if "host RAM" in v.reason or "exceeds" in v.reason else "crashed"
            return Verdict(False, f"hicache-size {size}: {v.reason}", kind)
    elif host is not None and (problem := hicache_ram_problem(float(size), host, ranks)):
        # without the model's bytes per token only the host-RAM half of the rule is known
        return Verdict(False, f"hicache-size {size}: {problem}", "host_memory")
    return Verdict(True)


def _learned(
    flags: Mapping[str, Any], mfs: float, know: Knowledge, concurrency: int | None
) -> Verdict | None:
    """What earlier failures with the same memory flags say of this mfs, or None."""
    key = memory_key(flags)
    for failed_key, failed_mfs, trial in know.graph_failures:
        if failed_key == key and mfs >= failed_mfs:
            return Verdict(
                False,
                f"mem-fraction-static {mfs:g} >= {failed_mfs:g}, which failed CUDA-graph "
                f"capture with the same memory flags (trial {trial})",
                "oom_cuda_graph",
            )
    for failed_key, failed_mfs, trial in know.floors:
        if failed_key == key and mfs <= failed_mfs:
            return Verdict(
                False,
                f"mem-fraction-static {mfs:g} <= {failed_mfs:g}, which had not enough memory "
                f"for the KV pool with the same memory flags (trial {trial})",
                "not_enough_memory",
            )
    for failed_key, failed_mfs, died_at, trial in know.deaths:
        if not (concurrency and concurrency >= died_at):
            continue
        if dies_no_later(failed_key, failed_mfs, key, mfs):
            same = "the same memory flags" if failed_key == key else _smaller_chunk(failed_key)
            return Verdict(
                False,
                f"mem-fraction-static {mfs:g} >= {failed_mfs:g} at concurrency {concurrency} >= "
                f"{died_at}: the server died under load there with {same} and "
                f"workload (trial {trial})",
                "oom_runtime",
            )
    return None


def _smaller_chunk(key: tuple) -> str:
    chunk = dict(key)["chunked-prefill-size"]
    return f"chunked-prefill-size {chunk} (smaller) and the same other memory flags"


def hicache_ram_problem(size_gb: float, host_ram_bytes: float, ranks: int) -> str | None:
    """Why `--hicache-size size_gb` cannot fit in host RAM for `ranks` GPU ranks
    (`Parallel.ranks`); None if it fits.

    Every rank allocates the full size (sglang-reference section 3), so the limit is per rank.
    """
    limit = cap.max_hicache_gb_per_rank(host_ram_bytes, ranks)
    if size_gb <= limit:
        return None
    return (
        f"{ranks} ranks x {size_gb:g} GB = {ranks * size_gb:,.0f} GB of pinned host RAM; the "
        f"host has {host_ram_bytes / cap.GB:.0f} GB (largest that fits: {limit} GB per rank)"
    )


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> field -> bytes (its kB are KiB)."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def with_available_ram(hw: Hardware, total: int, available: int) -> Hardware:
    """The host RAM HiCache sizes are judged by: MemAvailable now (bytes) less HOST_RAM_MARGIN
    of MemTotal, as `tuner check` computes it; never more than hardware.host_ram_gb says.
    What other tenants (or a page cache that will not shrink) hold is not the server's."""
    usable = max(0.0, (available - HOST_RAM_MARGIN * total) / cap.GB)
    if hw.host_ram_gb is not None and hw.host_ram_gb <= usable:
        return hw
    return replace(hw, host_ram_gb=usable)
