"""The engine of a started simulated server: EngineParams from its flags and start-up plan."""

from __future__ import annotations

import argparse

from tuner.sim.engine import Engine, EngineParams, StepTimeModel
from tuner.sim.profile import Profile
from tuner.sim.startup import Script, played_version


def engine_params(ns: argparse.Namespace, script: Script) -> EngineParams:
    """EngineParams of a started server: capacity from the start-up plan, the rest from flags."""
    plan = script.plan
    assert plan is not None
    d = script.defaults
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
        cuda_graph_max_bs=0 if ns.disable_cuda_graph else d.cuda_graph_max_bs,
        log_version=played_version(ns),
    )


def build_engine(ns: argparse.Namespace, profile: Profile, script: Script) -> Engine:
    """The engine for a started server (the same one `run_closed_loop` builds from these params)."""
    assert script.plan is not None
    timing = StepTimeModel.from_mapping(profile.timing)
    return Engine(engine_params(ns, script), timing, script.plan.bytes_per_token, seed=ns.sim_seed)
