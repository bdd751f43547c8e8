"""SGLang's start-up, simulated: defaults, the GPU memory model, failure verdicts, log lines. Pure.

The memory model (all per GPU rank, GiB):

    free0      = gpu_mem - cuda_context                         (what SGLang measures at init)
    KV pool    = capacity.pool_tokens(mfs, free0, weights + other, bytes/token)
    headroom   = free0 - weights - other - KV  (= free0 x (1 - mfs) unless --max-total-tokens)
    after the req_to_token table and the CUDA graphs: available_gpu_mem (the scheduler's log)

Verdicts, in the order SGLang would hit them:
  * weights + other > free0: torch OOM while loading weights;
  * KV tokens <= 0: `RuntimeError: Not enough memory...`;
  * headroom - req_to_token < graph(cuda_graph_max_bs): `Capture cuda graph failed: CUDA out of memory`
    (the "cliff" of too-high mfs);
  * available_gpu_mem < activation(one full prefill batch): start-up succeeds, but a prefill batch
    with more than `oom_prefill_tokens` new tokens dies under load ("the band below the cliff");
  * HiCache: host pool not larger than the device pool (AssertionError) or larger than host RAM
    (ValueError), both late, after graph capture.
The tuner's pre-check calls `plan_memory` / `hicache_failure` with the same profile numbers.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from tuner.capacity import calculus as capacity
from tuner.capacity.calculus import GB, GIB
from tuner.sglang.defaults import default_chunked_prefill_and_graph_bs, default_mem_fraction_static
from tuner.sglang.flags import DEFAULT_VERSION
from tuner.sim import loglines
from tuner.sim.profile import Profile

EXIT_CHILD_FAILED = 137  # SGLang's parent SIGKILLs its tree when a child dies: 128 + 9
EXIT_MAIN_EXCEPTION = 1  # an exception in the main process (argument checks, uvicorn bind)

SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."
GRAPH_ADVICE = (
    "Possible solutions:",
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
    "3. disable torch compile by not using --enable-torch-compile",
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)",
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose",
)
RADIX_HICACHE_MESSAGE = (
    "ValueError: The arguments enable-hierarchical-cache and disable-radix-cache are mutually "
    "exclusive and cannot be used at the same time. Please use only one of them."
)


@dataclass(frozen=True)
class Defaults:
    """What ServerArgs.__post_init__ resolves from the GPU size when a flag is not given."""

    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    context_len: int
    served_model_name: str


def resolve_defaults(ns: argparse.Namespace, profile: Profile) -> Defaults:
    """SGLang's defaults for this GPU (sglang-reference.md section 1)."""
    d_chunk, d_bs = default_chunked_prefill_and_graph_bs(profile.gpu_mem_mib, ns.tp_size)
    chunk = ns.chunked_prefill_size if ns.chunked_prefill_size is not None else d_chunk
    if ns.cuda_graph_max_bs is not None:
        bs = ns.cuda_graph_max_bs
    elif ns.cuda_graph_bs:
        bs = max(ns.cuda_graph_bs)
    else:
        bs = d_bs
    mfs = ns.mem_fraction_static
    if mfs is None:
        mfs = default_mem_fraction_static(profile.gpu_mem_mib, ns.tp_size, ns.pp_size, chunk, bs)
    ctx = ns.context_length or profile.context_len()
    return Defaults(mfs, chunk, bs, ctx, ns.served_model_name or ns.model_path)


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's GPU memory after start-up, and the verdict."""

    verdict: str  # ok | band | weights_oom | not_enough_memory | kv_oom | graph_oom
    mfs: float
    kv_kind: str  # mla | mha
    bytes_per_token: int
    free0_gib: float
    weights_gib: float
    other_gib: float
    max_total_num_tokens: int
    kv_gib: float
    req_to_token_gib: float
    graph_gib: float
    activation_gib: float  # one full prefill batch
    available_gpu_mem_gib: float  # after graphs (may be negative on graph_oom)
    max_running_requests: int
    max_req_input_len: int
    oom_prefill_tokens: int | None  # band: a prefill batch with more new tokens dies

    @property
    def avail_after_weights_gib(self) -> float:
        """`avail mem` in the `Load weight end` line."""
        return self.free0_gib - self.weights_gib

    @property
    def avail_after_kv_gib(self) -> float:
        """`avail mem` after the KV pool (and the buffers before it) are allocated."""
        return self.free0_gib - self.weights_gib - self.other_gib - self.kv_gib


def plan_memory(
    profile: Profile,
    *,
    tp: int = 1,
    mfs: float,
    chunked_prefill_size: int,
    max_prefill_tokens: int = 16384,
    cuda_graph_max_bs: int,
    disable_cuda_graph: bool = False,
    page_size: int = 1,
    kv_cache_dtype: str = "auto",
    max_total_tokens: int | None = None,
    max_running_requests: int | None = None,
    context_len: int | None = None,
) -> MemoryPlan:
    """The memory model of the module docstring, for one set of flags."""
    ctx = context_len or profile.context_len()
    layout = capacity.kv_layout(profile.model_config, tp, kv_cache_dtype)
    bpt = layout.bytes_per_token
    free0 = profile.free_at_init_mib / 1024
    weights = profile.weights_gib(tp)
    other = profile.other_gib
    tokens = capacity.pool_tokens(
        mfs, free0 * GIB, (weights + other) * GIB, bpt, page_size, max_total_tokens
    )
    kv = max(tokens, 0) * bpt / GIB
    num_reqs = max_running_requests or min(max(int(max(tokens, 0) / ctx * 512), 2048), 4096)
    req_to_token = num_reqs * (ctx + 4) * 4 / GIB
    gm = profile.graph_memory
    graph = 0.0 if disable_cuda_graph else gm.graph_mib(cuda_graph_max_bs) / 1024
    batch = (
        min(chunked_prefill_size, max_prefill_tokens)
        if chunked_prefill_size > 0
        else max_prefill_tokens
    )
    activation = gm.activation_mib(batch) / 1024
    available = free0 - weights - other - kv - req_to_token - graph
    verdict = _verdict(free0, weights, other, tokens, kv, req_to_token, available, activation)
    oom_tokens: int | None = None
    if verdict == "band":
        spare_mib = available * 1024 - gm.activation_base_mib
        per_token = gm.activation_mib_per_token or 1.0
        oom_tokens = max(1, math.floor(spare_mib / per_token))
    # DP without DP attention: replicas, each with the whole flag (tp_worker.py:292-300)
    running = capacity.max_running_requests(max(tokens, 0), ctx, max_running_requests)
    return MemoryPlan(
        verdict=verdict,
        mfs=mfs,
        kv_kind=layout.kind,
        bytes_per_token=bpt,
        free0_gib=free0,
        weights_gib=weights,
        other_gib=other,
        max_total_num_tokens=tokens,
        kv_gib=kv,
        req_to_token_gib=req_to_token,
        graph_gib=graph,
        activation_gib=activation,
        available_gpu_mem_gib=available,
        max_running_requests=running,
        max_req_input_len=min(ctx - 1, tokens - 1) - 5,
        oom_prefill_tokens=oom_tokens,
    )


def _verdict(
    free0: float,
    weights: float,
    other: float,
    tokens: int,
    kv: float,
    req_to_token: float,
    available: float,
    activation: float,
) -> str:
    """The first failure SGLang would hit (module docstring), else `band` or `ok` (GiB)."""
    if weights + other > free0:
        return "weights_oom"
    if tokens <= 0:
        return "not_enough_memory"
    if free0 - weights - other - kv - req_to_token < 0:
        return "kv_oom"
    if available < 0:
        return "graph_oom"
    if available < activation:
        return "band"
    return "ok"


@dataclass(frozen=True)
class HiCachePlan:
    """The host pool one rank allocates; `error` is SGLang's exception line when it cannot."""

    host_tokens: int
    host_gb: float
    error: str | None


def hicache_plan(
    profile: Profile,
    plan: MemoryPlan,
    *,
    hicache_size_gb: int,
    hicache_ratio: float,
    ranks: int = 1,
    page_size: int = 1,
) -> HiCachePlan:
    """Host pool per rank (size GB, else ratio x device pool) and SGLang's checks on it.

    Ranks allocate their pinned pools one after another out of the same host RAM, so rank k
    sees `available - k x size`; the first rank that finds `size > available - 10 GiB` raises.
    That is the per-rank x ranks rule of capacity.hicache_verdict, with SGLang's message.
    """
    bpt = plan.bytes_per_token
    if hicache_size_gb > 0:
        tokens = math.ceil(hicache_size_gb * GB / bpt)
    else:
        tokens = int(plan.max_total_num_tokens * hicache_ratio)
    tokens = -(-tokens // page_size) * page_size
    host_bytes = tokens * bpt
    if tokens <= plan.max_total_num_tokens:
        msg = "AssertionError: The host memory should be larger than the device memory with the current protocol"
        return HiCachePlan(tokens, host_bytes / GB, msg)
    verdict = capacity.hicache_verdict(
        host_bytes / GB,
        bpt,
        plan.max_total_num_tokens,
        profile.host_available_gb * GB,
        ranks=ranks,
        page_size=page_size,
    )
    if verdict.feasible:
        return HiCachePlan(tokens, host_bytes / GB, None)
    for rank in range(ranks):
        free = (
            profile.host_available_gb * GB - rank * host_bytes - capacity.HICACHE_HOST_RESERVE_BYTES
        )
        if host_bytes > free:
            break
    msg = (
        f"ValueError: Not enough host memory available. Requesting {host_bytes / GB:.2f} GB but "
        f"only have {free / GB:.2f} GB free. Please reduce the size of the hierarchical cache."
    )
    return HiCachePlan(tokens, host_bytes / GB, msg)


# --- the start-up script: log lines at fractions of the simulated start-up time ----------------


@dataclass(frozen=True)
class LogLine:
    """One log line; `scheduler` lines carry SGLang's ` TP0` prefix when TP > 1."""

    text: str
    scheduler: bool = True


@dataclass(frozen=True)
class Phase:
    """Lines to print once `at` (0..1) of the start-up time has passed."""

    at: float
    lines: tuple[LogLine, ...]


@dataclass(frozen=True)
class Failure:
    """How start-up ends when it fails: at which point, what is printed, the exit code."""

    at: float
    lines: tuple[LogLine, ...]
    exit_code: int


@dataclass(frozen=True)
class Script:
    """The whole start-up: phases, then either a failure or readiness."""

    phases: tuple[Phase, ...]
    failure: Failure | None
    plan: MemoryPlan | None
    hicache: HiCachePlan | None
    defaults: Defaults
    #: when the HTTP port binds (uvicorn starts), as a fraction of start-up
    bind_at: float = 0.95


def _scheduler_crash(at: float, exc_lines: tuple[str, ...]) -> Failure:
    trace = (
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2711, in run_scheduler_process',
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
    )
    lines = (*(LogLine(t) for t in (*trace, *exc_lines)), LogLine("", False))
    return Failure(at, (*lines, LogLine(SIGQUIT_LINE, scheduler=False)), EXIT_CHILD_FAILED)


def _cuda_oom(tried_gib: float, total_gib: float, free_gib: float) -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. "
        f"GPU 0 has a total capacity of {total_gib:.2f} GiB of which {max(free_gib, 0) * 1024:.2f} MiB is free."
    )


def _phase(at: float, *texts: str) -> Phase:
    """Scheduler log lines printed once `at` of the start-up time has passed."""
    return Phase(at, tuple(LogLine(t) for t in texts))


def build_script(ns: argparse.Namespace, profile: Profile) -> Script:
    """The start-up of one command line on one profile: every line, and how it ends."""
    d = resolve_defaults(ns, profile)
    if ns.enable_hierarchical_cache and ns.disable_radix_cache:
        fail = Failure(0.0, (LogLine(RADIX_HICACHE_MESSAGE, False),), EXIT_MAIN_EXCEPTION)
        return Script((), fail, None, None, d)
    plan = plan_memory(
        profile,
        tp=ns.tp_size,
        mfs=d.mem_fraction_static,
        chunked_prefill_size=d.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        cuda_graph_max_bs=d.cuda_graph_max_bs,
        disable_cuda_graph=ns.disable_cuda_graph,
        page_size=ns.page_size,
        kv_cache_dtype=ns.kv_cache_dtype,
        max_total_tokens=ns.max_total_tokens,
        max_running_requests=ns.max_running_requests,
        context_len=d.context_len,
    )
    phases: list[Phase] = []
    failure = _load_model(ns, profile, plan, phases) or _capture_graphs(
        ns, profile, plan, phases, d.cuda_graph_max_bs
    )
    if failure is not None:
        return Script(tuple(phases), failure, plan, None, d)
    hc: HiCachePlan | None = None
    if ns.enable_hierarchical_cache:
        hc = hicache_plan(
            profile,
            plan,
            hicache_size_gb=ns.hicache_size,
            hicache_ratio=ns.hicache_ratio,
            # the simulator plays DP as replicas: one host pool per GPU of every replica
            ranks=ns.tp_size * ns.dp_size * ns.pp_size,
            page_size=ns.page_size,
        )
        if hc.error:
            return Script(tuple(phases), _scheduler_crash(0.9, (hc.error,)), plan, hc, d)
        phases.append(
            _phase(0.88, f"Allocating {hc.host_gb:.2f} GB host memory for hierarchical KV cache.")
        )
    phases.append(
        _phase(
            0.9,
            f"max_total_num_tokens={plan.max_total_num_tokens}, "
            f"chunked_prefill_size={d.chunked_prefill_size}, "
            f"max_prefill_tokens={ns.max_prefill_tokens}, "
            f"max_running_requests={plan.max_running_requests}, "
            f"context_len={d.context_len}, "
            f"available_gpu_mem={plan.available_gpu_mem_gib:.2f} GB",
        )
    )
    return Script(tuple(phases), None, plan, hc, d)


def _load_model(
    ns: argparse.Namespace, profile: Profile, plan: MemoryPlan, phases: list[Phase]
) -> Failure | None:
    """Weights, then the KV pool: their log lines, or the failure that ends start-up there."""
    total = profile.gpu_mem_mib / 1024
    version = played_version(ns)
    dtype = profile.model_dtype()
    phases.append(_phase(0.02, f"Load weight begin. avail mem={plan.free0_gib:.2f} GB"))
    if plan.verdict == "weights_oom":
        oom = _cuda_oom(plan.weights_gib / 10, total, plan.free0_gib * 0.05)
        return _scheduler_crash(0.3, (oom,))
    elapsed = profile.startup_s * 0.55  # the weights take most of a start-up
    weights_line = loglines.load_weight_end(
        version,
        elapsed,
        profile.architecture,
        dtype,
        plan.avail_after_weights_gib,
        plan.weights_gib,
    )
    phases.append(_phase(0.6, weights_line))
    if plan.verdict == "not_enough_memory":
        exc = (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: self.server_args.mem_fraction_static={plan.mfs}"
        )
        return _scheduler_crash(0.62, (exc,))
    if plan.verdict == "kv_oom":
        free = plan.avail_after_weights_gib - plan.other_gib - plan.req_to_token_gib
        return _scheduler_crash(0.62, (_cuda_oom(plan.kv_gib, total, free),))
    kv_dtype = loglines.KV_TORCH_DTYPE.get(ns.kv_cache_dtype, dtype)
    mla = plan.kv_kind == "mla"
    kv_line = loglines.kv_allocated(version, kv_dtype, plan.max_total_num_tokens, mla, plan.kv_gib)
    after_pool = plan.avail_after_kv_gib - plan.req_to_token_gib
    phases.append(_phase(0.65, kv_line, f"Memory pool end. avail mem={after_pool:.2f} GB"))
    return None


def _capture_graphs(
    ns: argparse.Namespace, profile: Profile, plan: MemoryPlan, phases: list[Phase], max_bs: int
) -> Failure | None:
    """CUDA graph capture: its log lines, or the out-of-memory failure of too high an mfs."""
    total = profile.gpu_mem_mib / 1024
    after_pool = plan.avail_after_kv_gib - plan.req_to_token_gib
    version = played_version(ns)
    if not ns.disable_cuda_graph:
        phases.append(_phase(0.7, loglines.graph_begin(version, after_pool)))
    if plan.verdict == "graph_oom":
        tried = max(plan.graph_gib - after_pool, 0.01) + plan.graph_gib / 4
        exc = (
            "Exception: Capture cuda graph failed: CUDA out of memory. "
            f"Tried to allocate {tried:.2f} GiB. GPU 0 has a total capacity of {total:.2f} GiB "
            f"of which {max(after_pool, 0) * 1024:.2f} MiB is free.",
            *loglines.graph_advice(version, GRAPH_ADVICE),
        )
        return _scheduler_crash(0.85, exc)
    if not ns.disable_cuda_graph:
        elapsed = profile.startup_s * 0.2
        line = loglines.graph_end(
            version, max_bs, elapsed, plan.graph_gib, plan.available_gpu_mem_gib
        )
        phases.append(_phase(0.85, line))
    return None


def played_version(ns: argparse.Namespace) -> str:
    """The SGLang version the simulator plays (`--sim-sglang-version`)."""
    return getattr(ns, "sim_sglang_version", None) or DEFAULT_VERSION


def bind_error_line(host: str, port: int) -> str:
    """Uvicorn's message when the port is taken (the HTTP server starts after the model loads)."""
    return f"ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): address already in use"
