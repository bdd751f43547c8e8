"""The engine of a started simulated server: EngineParams from its flags and start-up plan."""

from __future__ import annotations

import argparse

from tuner.sglang.postinit import is_new
from tuner.sim.engine import DPEngine, Engine, EngineParams, SpecParams, StepTimeModel, new_engine
from tuner.sim.memplan import MemoryPlan, SpecShape
from tuner.sim.profile import Profile
from tuner.sim.startup import Script, played_version


def engine_params(
    ns: argparse.Namespace, script: Script, profile: Profile | None = None
) -> EngineParams:
    """EngineParams of a started server: capacity from the start-up plan, the rest from flags
    (`profile`: the draft's acceptance model, needed under speculative decoding)."""
    plan = script.plan
    assert plan is not None
    d = script.defaults
    lev = script.levers
    spec = None
    if lev.spec is not None:
        assert profile is not None, "speculative decoding needs the profile's draft"
        spec = spec_params(profile, plan, lev.spec, lev.acceptance_kind, played_version(ns), ns)
    return EngineParams(
        max_total_tokens=plan.max_total_num_tokens,
        max_running_requests=plan.max_running_requests,
        page_size=ns.page_size,
        chunked_prefill_size=d.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        schedule_conservativeness=ns.schedule_conservativeness,
        schedule_policy=ns.schedule_policy,
        radix_cache=not ns.disable_radix_cache,
        hicache_host_tokens=script.hicache.host_tokens if script.hicache else 0,
        hicache_write_policy=ns.hicache_write_policy,
        context_len=d.context_len,
        decode_log_interval=ns.decode_log_interval,
        oom_prefill_tokens=plan.oom_prefill_tokens,
        max_queued_requests=ns.max_queued_requests,
        seed=ns.sim_seed,
        # decode batches above the captured size run without CUDA graphs (slower)
        cuda_graph_max_bs=0 if ns.disable_cuda_graph else (plan.graph_bs or d.cuda_graph_max_bs),
        log_version=played_version(ns),
        dp_groups=lev.dp_groups,
        attn_tp=max(1, ns.tp_size // lev.dp_groups),
        load_balance_method=getattr(ns, "load_balance_method", None) or "round_robin",
        dp_extra_weights_gib=plan.dp_extra_weights_gib,
        spec=spec,
        overlap=not getattr(ns, "disable_overlap_schedule", False),
    )


def spec_params(
    profile: Profile,
    plan: MemoryPlan,
    shape: SpecShape,
    kind: str | None,
    version: str,
    ns: argparse.Namespace,
) -> SpecParams:
    """The engine's speculative decoding: the profile's acceptance chain for this shape, the
    KV slots a decode step needs free per request (the version's rule), the draft's costs."""
    draft = profile.speculative
    assert draft is not None
    steps, topk, ndt = shape.num_steps, shape.topk, shape.num_draft_tokens
    if is_new(version):
        # spec v2 keeps 2 x alloc_len reserved (mem_cache/allocation_sizing.py:64-70); spec v1
        # (no overlap) needs alloc_len (model_executor/pool_configurator.py:936-941)
        overlap = not getattr(ns, "disable_overlap_schedule", False)
        reserve = shape.decode_alloc_tokens * (2 if overlap else 1)
    else:
        # check_decode_mem x (draft tokens + topk x steps) (managers/scheduler.py:805-815)
        reserve = ndt + topk * steps
    layers = profile.model_config.get("text_config", profile.model_config).get(
        "num_hidden_layers", 1
    )
    draft_bpt = draft.kv_bytes_per_token or int(
        plan.bytes_per_token * draft.layers / max(int(layers), 1)
    )
    return SpecParams(
        num_steps=steps,
        topk=topk,
        num_draft_tokens=ndt,
        accept=draft.chain(kind or draft.default_kind, steps, topk, ndt),
        decode_reserve=reserve,
        draft_weights_gib=plan.draft_weights_gib,
        draft_bytes_per_token=draft_bpt,
        accept_rate_of_drafts=is_new(version),
    )


def build_engine(ns: argparse.Namespace, profile: Profile, script: Script) -> Engine | DPEngine:
    """The engine for a started server (the same one `run_closed_loop` builds from these params)."""
    assert script.plan is not None
    timing = StepTimeModel.from_mapping(profile.timing)
    params = engine_params(ns, script, profile)
    return new_engine(params, timing, script.plan.bytes_per_token, seed=ns.sim_seed)
