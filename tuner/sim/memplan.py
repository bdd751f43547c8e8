"""One GPU's memory through SGLang's start-up, and the first failure it meets. Pure.

The memory model (all per GPU rank, GiB):

    free0      = gpu_mem - cuda_context                         (what SGLang measures at init)
    weights    = the profile's, plus DP attention's replicated attention weights
    KV pool    = capacity.pool_tokens(mfs, free0, weights + other, bytes/token)
    headroom   = free0 - weights - other - KV  (= free0 x (1 - mfs) unless --max-total-tokens)
    after the req_to_token table, the CUDA graphs and (speculative decoding) the draft's
    weights, KV and graphs: available_gpu_mem (the scheduler's log)

Verdicts, in the order SGLang would hit them:
  * weights + other > free0: torch OOM while loading weights;
  * KV tokens <= 0: `RuntimeError: Not enough memory...`;
  * headroom - req_to_token < graph(graph batch): `Capture cuda graph failed: CUDA out of memory`
    (the "cliff" of too-high mfs); with a draft, its weights, pool and graphs come after the
    target's graphs and fail the same way (`draft_oom`: a torch OOM, or `graph_oom` when only
    the draft's graphs do not fit);
  * available_gpu_mem < activation(one full prefill batch): start-up succeeds, but a prefill batch
    with more than `oom_prefill_tokens` new tokens dies under load ("the band below the cliff").

DP attention (`dp_groups` > 1, attention TP = tp / dp_groups): KV bytes per token at the
attention TP (`capacity.kv_layout`; MLA's latent is per GPU anyway), the attention weights
split over the attention TP group instead of all tp GPUs (`DPAttentionCosts.extra_weights_gib`),
and graph buffers for the gathered batch (`DPAttentionCosts.graph_mib`). Each group's pool is
one GPU's pool; `max_running_requests` is per group (flag // groups).

Speculative decoding (`spec`), the rule of the version played:
  * 0.5.23: the target's cell grows by the draft layers' share (`capacity.with_draft`,
    sglang/srt/model_executor/pool_configurator.py:258-310);
  * 0.5.6.post2: the target's pool grows by `max_num_reqs x (steps x topk + draft tokens) + 100`
    tokens of headroom and the draft gets a pool of that many tokens of its own, after the
    target's (model_executor/model_runner.py:1692-1714, the draft worker's cell from
    `num_nextn_predict_layers`, :1370-1375);
  * CUDA graphs are captured for batch x draft tokens, up to the request pool's size
    (model_executor/cuda_graph_runner.py:193-208; 48 requests by default under speculation);
  * the request table holds `context + 4 + draft tokens` per request (model_runner.py:1746-1749).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.capacity import calculus as capacity
from tuner.capacity.calculus import GIB
from tuner.sglang.postinit import is_new
from tuner.sim.profile import Profile


@dataclass(frozen=True)
class SpecShape:
    """A resolved speculative configuration (after SGLang's post-init)."""

    algorithm: str
    num_steps: int
    topk: int
    num_draft_tokens: int

    @property
    def decode_alloc_tokens(self) -> int:
        """KV slots one request may take in one decode step (page size 1): the draft steps'
        topk x steps, or the verify's draft tokens (0.5.23 utils/common.py:4424-4448)."""
        return max(self.num_steps * self.topk, self.num_draft_tokens)


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's GPU memory after start-up, and the verdict."""

    verdict: str  # ok | band | weights_oom | not_enough_memory | kv_oom | graph_oom | draft_oom
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
    dp_groups: int = 1  # DP attention groups (each with a pool like this one)
    graph_bs: int = 0  # the largest batch CUDA graphs are captured for
    draft_weights_gib: float = 0.0
    draft_tokens: int = 0  # 0.5.6.post2: the draft's own pool
    draft_kv_gib: float = 0.0
    draft_graph_gib: float = 0.0
    dp_extra_weights_gib: float = 0.0  # of weights_gib: DP attention's replicated attention

    @property
    def avail_after_weights_gib(self) -> float:
        """`avail mem` in the `Load weight end` line."""
        return self.free0_gib - self.weights_gib

    @property
    def avail_after_kv_gib(self) -> float:
        """`avail mem` after the KV pool (and the buffers before it) are allocated."""
        return self.free0_gib - self.weights_gib - self.other_gib - self.kv_gib

    @property
    def avail_after_target_graphs_gib(self) -> float:
        """Free memory once the target's CUDA graphs are captured (before the draft)."""
        return self.avail_after_kv_gib - self.req_to_token_gib - self.graph_gib


def smi_used_mib(profile: Profile, plan: MemoryPlan, peak_prefill_tokens: int) -> float:
    """What nvidia-smi's memory.used reads on the server's busiest GPU: everything start-up
    placed (all but what the plan leaves available: context, weights, pool, graphs, a draft)
    and the activations of the largest prefill batch since start or the last flush, which
    PyTorch's caching allocator keeps reserved until `/flush_cache` empties it."""
    used = profile.gpu_mem_mib - plan.available_gpu_mem_gib * 1024
    if peak_prefill_tokens > 0:
        used += profile.graph_memory.activation_mib(peak_prefill_tokens)
    return used


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
    dp_groups: int = 1,
    spec: SpecShape | None = None,
    version: str = "0.5.6.post2",
) -> MemoryPlan:
    """The memory model of the module docstring, for one set of (resolved) flags."""
    ctx = context_len or profile.context_len()
    par = capacity.Parallel(tp=tp, dp=dp_groups, dp_attention=dp_groups > 1)
    layout = capacity.kv_layout(profile.model_config, par.attn_tp, kv_cache_dtype)
    target_bpt = bpt = layout.bytes_per_token
    draft = profile.speculative if spec is not None else None
    if draft is not None and is_new(version):
        bpt = capacity.with_draft(bpt, layout.num_layers, draft.layers)
    free0 = profile.free_at_init_mib / 1024
    dp_extra = 0.0
    if par.dp_attention and profile.dp_attention is not None:
        dp_extra = profile.dp_attention.extra_weights_gib(tp, par.attn_tp)
    weights = profile.weights_gib(tp) + dp_extra
    other = profile.other_gib
    tokens = capacity.pool_tokens(mfs, free0 * GIB, (weights + other) * GIB, bpt)
    req_pool = max_running_requests or min(max(int(max(tokens, 0) / ctx * 512), 2048), 4096)
    draft_tokens = 0
    if draft is not None and not is_new(version):
        draft_tokens = (
            tokens + req_pool * (spec.num_steps * spec.topk + spec.num_draft_tokens) + 100
        )
        tokens = draft_tokens
    tokens = _cap_and_page(tokens, max_total_tokens, page_size)
    kv = max(tokens, 0) * bpt / GIB
    extra_ctx = 4 + (spec.num_draft_tokens if spec is not None else 0)
    req_to_token = req_pool * (ctx + extra_ctx) * 4 / GIB
    gm = profile.graph_memory
    graph_bs = cuda_graph_max_bs
    levers = spec is not None or par.dp_attention
    if levers:  # capture sizes stop at the request pool (not applied without either lever)
        graph_bs = min(graph_bs, req_pool)
    graph = 0.0
    if not disable_cuda_graph:
        per_req = spec.num_draft_tokens if spec is not None else 1
        graph = gm.graph_mib(graph_bs * per_req) / 1024
        if par.dp_attention and profile.dp_attention is not None:
            graph += profile.dp_attention.graph_mib(graph_bs, dp_groups) / 1024
    draft_w = draft_kv = draft_graph = 0.0
    if draft is not None:
        draft_w = draft.weights_gib_per_gpu * profile.tp / max(tp, 1)
        if draft_tokens:
            draft_tokens = _cap_and_page(draft_tokens, max_total_tokens, page_size)
            cell = draft.kv_bytes_per_token or int(target_bpt * draft.layers / layout.num_layers)
            draft_kv = max(draft_tokens, 0) * cell / GIB
        if not disable_cuda_graph:
            steps, topk, ndt = spec.num_steps, spec.topk, spec.num_draft_tokens
            draft_graph = draft.graph_mib(graph_bs, steps, topk, ndt) / 1024
    batch = (
        min(chunked_prefill_size, max_prefill_tokens)
        if chunked_prefill_size > 0
        else max_prefill_tokens
    )
    activation = gm.activation_mib(batch) / 1024
    after_graphs = free0 - weights - other - kv - req_to_token - graph
    available = after_graphs - draft_w - draft_kv - draft_graph
    verdict = _verdict(free0, weights, other, tokens, kv, req_to_token, after_graphs, activation)
    if verdict in ("ok", "band") and available < 0:
        verdict = "graph_oom" if after_graphs - draft_w - draft_kv >= 0 else "draft_oom"
    elif verdict == "ok" and available < activation:
        verdict = "band"
    oom_tokens: int | None = None
    if verdict == "band":
        spare_mib = available * 1024 - gm.activation_base_mib
        per_token = gm.activation_mib_per_token or 1.0
        oom_tokens = max(1, math.floor(spare_mib / per_token))
    # DP without DP attention: replicas, each with the whole flag (tp_worker.py:292-300)
    running = capacity.max_running_requests(
        max(tokens, 0), ctx, max_running_requests, attn_dp=par.attn_dp
    )
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
        dp_groups=par.attn_dp,
        graph_bs=0 if disable_cuda_graph else graph_bs,
        draft_weights_gib=draft_w,
        draft_tokens=draft_tokens,
        draft_kv_gib=draft_kv,
        draft_graph_gib=draft_graph,
        dp_extra_weights_gib=dp_extra,
    )


def _cap_and_page(tokens: int, max_total_tokens: int | None, page_size: int) -> int:
    """`--max-total-tokens` may only lower the pool, which is then whole pages."""
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    if tokens > 0 and page_size > 1:
        tokens = tokens // page_size * page_size
    return tokens


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
