"""The capacity reading of the study's own space: `tuner capacity`'s analysis (no second
formula) at each end of the mfs range and for each HiCache size the space can ask, from the
study's `hardware:` facts. Pure but for reading the model config."""

from __future__ import annotations

from typing import Any

from tuner.capacity.analysis import CapacityInputs, analyze
from tuner.capacity.draftreading import DraftInputs
from tuner.capacity.models import load_model_config
from tuner.capacity.speculation import mtp_layers, speculation_of
from tuner.check.lines import CheckLine, fail, ok, skip, warn
from tuner.check.spacefacts import largest, largest_parallel, values_of
from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError, TunerError
from tuner.search.mode import inner_mode, trial_time_problem
from tuner.sglang.defaults import default_mem_fraction_static
from tuner.sglang.flags import effective_flags, normalize_flags


def _draft(cfg: StudyConfig, model_config: dict[str, Any]) -> DraftInputs | None:
    """The study's fixed speculative draft when the reading can size it: the model's own MTP
    head (`num_nextn_predict_layers`); a separate draft's config is on the host, not here."""
    server = effective_flags(cfg.server)
    spec = speculation_of(server)
    if spec is None or not spec.has_draft or not spec.own_mtp(server.get("model-path")):
        return None
    if mtp_layers(model_config) is None:
        return None
    return DraftInputs(
        algorithm=spec.algorithm,
        num_steps=spec.steps,
        eagle_topk=spec.topk,
        num_draft_tokens=spec.draft_tokens,
    )


def capacity_inputs(cfg: StudyConfig, model_config: dict[str, Any]) -> CapacityInputs:
    """`tuner capacity`'s inputs for this study: its TP/DP (DP attention where every trial has
    it), KV dtype, page size, the ends of its mfs range (SGLang's default when not searched),
    its non-zero HiCache sizes, a fixed --max-running-requests and an MTP draft."""
    hw = cfg.hardware
    assert hw.gpu_mem_mib is not None
    par = largest_parallel(cfg)
    tp, dp = par.tp, par.dp
    kv = str(normalize_flags(cfg.server).get("kv-cache-dtype", "auto"))
    _, mfs = values_of(cfg, "mem-fraction-static")
    _, sizes = values_of(cfg, "hicache-size")
    where, running = values_of(cfg, "max-running-requests")
    return CapacityInputs(
        model_config=model_config,
        tp=tp,
        dp=dp,
        dp_attention=par.dp_attention,
        max_running_requests=int(running[0]) if where and where.startswith("server.") else None,
        draft=_draft(cfg, model_config),
        kv_dtype={"bfloat16": "bf16"}.get(kv, kv),
        page_size=int(largest(cfg, "page-size", 1)),
        gpu_mem_mib=hw.gpu_mem_mib,
        weights_gib=hw.weights_gib,
        mfs=tuple(mfs) or (default_mem_fraction_static(hw.gpu_mem_mib, tp),),
        hicache_sizes_gb=tuple(int(s) for s in sizes if s > 0),
        host_ram_gb=hw.host_ram_gb,
    )


def capacity(cfg: StudyConfig) -> CheckLine:
    """Bytes per token, the pool at each end of the mfs range, HiCache per size; a warning
    for an end the pre-check will reject (no pool, no headroom, HiCache that cannot start)."""
    hw = cfg.hardware
    if not hw.model_config_path or not hw.gpu_mem_mib:
        return skip("capacity", "no hardware facts (hardware.model_config and gpu_mem_mib)")
    try:
        report = analyze(capacity_inputs(cfg, load_model_config(hw.model_config_path)))
    except TunerError as exc:
        return fail("capacity", f"{cfg.source}: hardware.model_config: {exc}", ConfigError)
    parts = [f"{report['bytes_per_token']:,} B/token/rank ({report['parallel']['describe']})"]
    warnings = []
    if report["projection"]:
        pools = ", ".join(
            f"mfs {r['mfs']:g}: {r['max_total_num_tokens']:,} tokens" for r in report["projection"]
        )
        parts.append(pools)
        warnings += [
            f"mfs {r['mfs']:g}: {r['warning']}" for r in report["projection"] if "warning" in r
        ]
    else:
        parts.append("pool per mfs needs hardware.weights_gib")
    for h in report["hicache"]:
        size = f"hicache-size {h['hicache_size_gb_per_rank']:g}"
        if h["feasible"]:
            parts.append(f"{size}: {h['host_total_gb']:,.0f} GB host RAM")
        else:
            warnings.append(f"{size}: {h['reason']}")
    text = "; ".join(parts)
    if warnings:
        return warn("capacity", f"{text}; the pre-check rejects: " + "; ".join(warnings))
    return ok("capacity", text)


def trial_time(cfg: StudyConfig) -> CheckLine:
    """Does budget.trial_timeout hold the inner search's load runs?"""
    if not inner_mode(cfg):
        return skip("trial time", "concurrency is not searched on each server (no inner search)")
    if (problem := trial_time_problem(cfg)) is not None:
        return warn("trial time", problem)
    window = cfg.workload.duration_s
    each = "" if window is None else f" of a {window:g} s window"
    return ok(
        "trial time",
        f"budget.trial_timeout {float(cfg.budget.trial_timeout):g} s holds the inner search's "
        f"{cfg.budget.inner_runs} load runs{each} and a start",
    )
