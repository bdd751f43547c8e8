"""SGLang's start-up, simulated: defaults and post-init, the GPU memory model, failure verdicts,
log lines. Pure.

The flags are resolved as SGLang's ServerArgs resolves them (serverargs.py: GPU defaults, then
the post-init rules of `tuner.sglang.postinit`, whose refusals end the launch with exit 1), the
memory is planned per GPU rank (memplan.py: weights, KV pool, CUDA graphs, DP attention and a
speculative draft), and the start-up script prints SGLang's lines until it is ready or fails:
too little memory for the weights or the pool, a CUDA-graph capture (or a draft) that does not
fit, HiCache's host pool (not larger than the device pool, or beyond host RAM), late, after
graph capture. The tuner's pre-check calls `plan_memory` / `hicache_failure` with the same
profile numbers.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from tuner.capacity import calculus as capacity
from tuner.capacity.calculus import GB
from tuner.sim import loglines
from tuner.sim.memplan import MemoryPlan, SpecShape, plan_memory
from tuner.sim.nodes import nodes_refusal
from tuner.sim.profile import Profile
from tuner.sim.serverargs import Defaults, Levers, played_version, resolve_server_args

__all__ = [
    "Defaults",
    "Levers",
    "MemoryPlan",
    "Script",
    "SpecShape",
    "build_script",
    "engine_startup_time",
    "plan_memory",
    "played_version",
]

EXIT_CHILD_FAILED = 137  # SGLang's parent SIGKILLs its tree when a child dies: 128 + 9
EXIT_MAIN_EXCEPTION = 1  # an exception in the main process (argument checks, uvicorn bind)
EXIT_USAGE = 2  # argparse's code: the simulator refuses a value it cannot play the same way

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

#: shares of the profile's start-up time (`startup_s`, virtual seconds) its phases take: the
#: `elapsed=` of the log lines and 0.5.23's `startup_time` in /server_info are these numbers
LOAD_WEIGHT_SHARE = 0.55  # the weights take most of a start-up
KV_ALLOCATION_SHARE = 0.05  # the pool: between `Load weight end` (0.6) and `Memory pool end` (0.65)
GRAPH_SHARE = 0.2  # the target's CUDA graphs
#: ASSUMPTION: the scheduler's own set-up around those (process, model config, attention
#: backends), and the launch's before the schedulers start (processes, tokenizer), are small
SCHEDULER_OVERHEAD_SHARE = 0.1
ENGINE_OVERHEAD_SHARE = 0.05
#: 0.5.23's phases of CUDA-graph capture, in its order (model_executor/graph_memory_usage.py:5-12)
GRAPH_PHASES = (
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
)


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
    #: DP attention and speculative decoding as resolved (serverargs.Levers)
    levers: Levers = field(default_factory=Levers)
    #: ServerArgs' post-init warnings, printed before anything else
    warnings: tuple[LogLine, ...] = ()


def engine_startup_time(ns: argparse.Namespace, profile: Profile, script: Script) -> dict:
    """0.5.23's `startup_time` of a started server, in virtual seconds of the profile's start-up.

    Shape: build_engine_startup_time (observability/startup_time.py:62-68) over each scheduler's
    build_scheduler_startup_time (:11-27, managers/scheduler.py:745-758): weights (target plus
    draft), KV pool, the scheduler's whole init, the capture time of each graph phase (a target
    under speculation captures `target_verify`, not `decode`: cuda_graph_setup.py:703-710), then
    `tokenizer_e2e`, launch until the schedulers are ready (entrypoints/engine.py:1100-1112).
    DP attention's groups start alike, so the maximum over them is any one's.
    """
    total = float(profile.startup_s)
    plan = script.plan
    spec = script.levers.spec
    load = total * LOAD_WEIGHT_SHARE
    graphs = dict.fromkeys(GRAPH_PHASES, 0.0)  # the simulator captures no prefill graphs
    if plan is not None and spec is not None and plan.weights_gib > 0:
        # ASSUMPTION: the draft's weights load at the target's speed
        load += total * LOAD_WEIGHT_SHARE * plan.draft_weights_gib / plan.weights_gib
    if not ns.disable_cuda_graph:
        target = total * GRAPH_SHARE
        graphs["target_verify" if spec is not None else "decode"] = target
        if spec is not None and profile.speculative is not None:
            # ASSUMPTION: a capture's time grows with the layers its forward runs
            cfg = profile.model_config.get("text_config", profile.model_config)
            share = profile.speculative.layers / max(int(cfg.get("num_hidden_layers", 1)), 1)
            graphs["draft_decode"] = graphs["draft_extend"] = target * share
    kv = total * KV_ALLOCATION_SHARE
    scheduler = load + kv + sum(graphs.values()) + total * SCHEDULER_OVERHEAD_SHARE
    return {
        "load_weight": load,
        "kv_cache_allocation": kv,
        "scheduler_e2e": scheduler,
        "cuda_graph": graphs,
        "tokenizer_e2e": scheduler + total * ENGINE_OVERHEAD_SHARE,
    }


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
    d, lev = resolve_server_args(ns, profile)
    main_lines = tuple(LogLine(w, False) for w in lev.warnings)
    if lev.refusal is not None:  # ServerArgs' post-init raised in the main process
        fail = Failure(0.0, (LogLine(lev.refusal.line, False),), lev.refusal.exit_code)
        return Script((), fail, None, None, d, levers=lev, warnings=main_lines)
    if lev.unsimulated is not None:
        fail = Failure(0.0, (LogLine(lev.unsimulated, False),), EXIT_USAGE)
        return Script((), fail, None, None, d, levers=lev, warnings=main_lines)
    if (nodes := nodes_refusal(ns)) is not None:  # ServerArgs.check_server_args (nodes.py)
        fail = Failure(0.0, (LogLine(nodes[0], False),), nodes[1])
        return Script((), fail, None, None, d, levers=lev, warnings=main_lines)
    if ns.enable_hierarchical_cache and ns.disable_radix_cache:
        fail = Failure(0.0, (LogLine(RADIX_HICACHE_MESSAGE, False),), EXIT_MAIN_EXCEPTION)
        return Script((), fail, None, None, d, levers=lev, warnings=main_lines)
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
        dp_groups=lev.dp_groups,
        spec=lev.spec,
        version=played_version(ns),
    )
    phases: list[Phase] = []
    failure = (
        _load_model(ns, profile, plan, phases)
        or _capture_graphs(ns, profile, plan, phases, d.cuda_graph_max_bs, lev.spec)
        or _load_draft(ns, profile, plan, phases, lev.spec)
    )
    if failure is not None:
        return Script(tuple(phases), failure, plan, None, d, levers=lev, warnings=main_lines)
    hc: HiCachePlan | None = None
    if ns.enable_hierarchical_cache:
        par = capacity.Parallel(ns.tp_size, ns.dp_size, ns.pp_size, lev.dp_groups > 1)
        hc = hicache_plan(
            profile,
            plan,
            hicache_size_gb=ns.hicache_size,
            hicache_ratio=ns.hicache_ratio,
            # one host pool per GPU rank: of every replica, or of the DP attention groups' GPUs;
            # each node's ranks share that node's RAM (nodes.py: tp / nnodes per node)
            ranks=max(par.ranks // ns.nnodes, 1),
            page_size=ns.page_size,
        )
        if hc.error:
            fail = _scheduler_crash(0.9, (hc.error,))
            return Script(tuple(phases), fail, plan, hc, d, levers=lev, warnings=main_lines)
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
    return Script(tuple(phases), None, plan, hc, d, levers=lev, warnings=main_lines)


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
    elapsed = profile.startup_s * LOAD_WEIGHT_SHARE
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
    ns: argparse.Namespace,
    profile: Profile,
    plan: MemoryPlan,
    phases: list[Phase],
    max_bs: int,
    spec: SpecShape | None,
) -> Failure | None:
    """CUDA graph capture: its log lines, or the out-of-memory failure of too high an mfs."""
    total = profile.gpu_mem_mib / 1024
    after_pool = plan.avail_after_kv_gib - plan.req_to_token_gib
    version = played_version(ns)
    per_req = spec.num_draft_tokens if spec is not None else 1
    if not ns.disable_cuda_graph:
        phases.append(_phase(0.7, loglines.graph_begin(version, after_pool, per_req)))
    if plan.verdict == "graph_oom" and plan.avail_after_target_graphs_gib < 0:
        return _scheduler_crash(0.85, _graph_failure(version, plan.graph_gib, after_pool, total))
    if not ns.disable_cuda_graph:
        elapsed = profile.startup_s * GRAPH_SHARE
        line = loglines.graph_end(
            version,
            plan.graph_bs or max_bs,
            elapsed,
            plan.graph_gib,
            plan.avail_after_target_graphs_gib,
        )
        phases.append(_phase(0.85, line))
    return None


def _graph_failure(version: str, graph_gib: float, free_gib: float, total: float) -> tuple:
    tried = max(graph_gib - free_gib, 0.01) + graph_gib / 4
    return (
        "Exception: Capture cuda graph failed: CUDA out of memory. "
        f"Tried to allocate {tried:.2f} GiB. GPU 0 has a total capacity of {total:.2f} GiB "
        f"of which {max(free_gib, 0) * 1024:.2f} MiB is free.",
        *loglines.graph_advice(version, GRAPH_ADVICE),
    )


def _load_draft(
    ns: argparse.Namespace,
    profile: Profile,
    plan: MemoryPlan,
    phases: list[Phase],
    spec: SpecShape | None,
) -> Failure | None:
    """The speculative draft after the target's graphs: its weights, (0.5.6.post2) its own KV
    pool, its CUDA graphs; the torch OOM or capture failure when they do not fit."""
    if spec is None:
        return None
    total = profile.gpu_mem_mib / 1024
    version = played_version(ns)
    free = plan.avail_after_target_graphs_gib
    if free - plan.draft_weights_gib < 0:
        return _scheduler_crash(0.86, (_cuda_oom(plan.draft_weights_gib, total, free),))
    free -= plan.draft_weights_gib
    if plan.draft_tokens:
        if free - plan.draft_kv_gib < 0:
            return _scheduler_crash(0.87, (_cuda_oom(plan.draft_kv_gib, total, free),))
        free -= plan.draft_kv_gib
        dtype = loglines.KV_TORCH_DTYPE.get(ns.kv_cache_dtype, profile.model_dtype())
        mla = plan.kv_kind == "mla"
        line = loglines.kv_allocated(version, dtype, plan.draft_tokens, mla, plan.draft_kv_gib)
        phases.append(_phase(0.87, line))
    if plan.verdict == "graph_oom":
        return _scheduler_crash(0.88, _graph_failure(version, plan.draft_graph_gib, free, total))
    return None


def bind_error_line(host: str, port: int) -> str:
    """Uvicorn's message when the port is taken (the HTTP server starts after the model loads)."""
    return f"ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): address already in use"
