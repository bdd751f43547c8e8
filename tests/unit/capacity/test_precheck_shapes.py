"""The pre-check on DP-attention and speculative trials: each trial's own KV cell, a start
calibrating only its own layout, SGLang's refusals, and nothing feasible rejected. Sources are
under `python/sglang/` of 0.5.6.post2 and 0.5.23."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.studies import study_dict
from tuner.capacity import calculus as cap
from tuner.capacity.layout import cell_bounds, launch_problem, reserve_mib
from tuner.capacity.models import hardware_of, load_model_config
from tuner.capacity.precheck import Hardware, Knowledge, pool_moved, pool_range, precheck
from tuner.config.load import parse_study
from tuner.errors import ConfigError

KIMI = load_model_config("kimi-k2.5")
LLAMA70 = load_model_config("llama-3.1-70b")
#: DeepSeek-V3 with its MTP head (the real config.json's `num_nextn_predict_layers: 1`)
DSV3 = {**load_model_config("deepseek-v3"), "num_nextn_predict_layers": 1}
PLAIN = {"model-path": "m", "tensor-parallel-size": 8}
DP8 = {**PLAIN, "data-parallel-size": 8, "enable-dp-attention": True}
EAGLE = {
    "speculative-algorithm": "EAGLE3",
    "speculative-draft-model-path": "/models/draft",
    "speculative-num-steps": 3,
    "speculative-eagle-topk": 1,
    "speculative-num-draft-tokens": 4,
}


def hw(config: Any = KIMI, **kw: Any) -> Hardware:
    base: dict[str, Any] = dict(
        bytes_per_token=70_272, gpu_mem_mib=97_887, host_ram_gb=449, model_config=config
    )
    return Hardware(**{**base, **kw})


def test_each_trial_gets_its_own_cell() -> None:
    # GQA: the KV heads follow the trial's attention TP (0.5.6.post2 model_runner.py:1414)
    llama = hw(LLAMA70, bytes_per_token=40_960)
    assert cell_bounds(PLAIN, llama.model_config, {}, llama.bytes_per_token) == (40_960, 40_960)
    dp4 = {**PLAIN, "data-parallel-size": 4, "enable-dp-attention": True}
    assert cell_bounds(dp4, llama.model_config, {}, None) == (163_840, 163_840)
    # 0.5.23's --attn-dp-size is the same split (arg_groups/parallel_hook.py:39-61)
    attn = {**PLAIN, "attn-dp-size": 4}
    assert cell_bounds(attn, llama.model_config, {}, None) == (163_840, 163_840)
    # a partial flag set (the report's projection) is read over the study's fixed flags
    assert cell_bounds({"mem-fraction-static": 0.9}, LLAMA70, PLAIN, None) == (40_960, 40_960)
    # the model's own MTP head: 0.5.23 adds int(cell x 1 / 61) (pool_configurator.py:310-314),
    # 0.5.6.post2 keeps the target's cell: both bound the pool
    mtp = {**PLAIN, "speculative-algorithm": "NEXTN"}
    assert cell_bounds(mtp, DSV3, {}, None) == (70_272, 70_272 + 1_152)
    # a separate draft whose config is the host's: its share is unknown (no upper bound)
    assert cell_bounds({**PLAIN, **EAGLE}, KIMI, {}, None) == (70_272, None)


def test_a_start_calibrates_only_its_own_layout() -> None:
    """A plain TP 8 start of Kimi (116,171 tokens at 0.85) says nothing of a DP-attention
    server's pool: each GPU there holds the attention weights whole (deepseek_v2.py:
    1267-1366), so its pool is smaller. Judged by the plain start, 8 GB of HiCache a rank
    (113,843 host tokens) would look 'not larger than the device pool' and be rejected."""
    plain = {**PLAIN, "mem-fraction-static": 0.85}
    know = Knowledge().with_start(116_171, 0.85, plain)
    dp = {**DP8, "mem-fraction-static": 0.85, "hicache-size": 8}
    assert not precheck({**plain, "hicache-size": 8}, hw(), know).feasible  # same layout
    assert precheck(dp, hw(), know).feasible
    assert know.calibration_for(dp) is None and know.calibration_for(plain) == (116_171, 0.85)
    # once a DP-attention server started, it calibrates its own layout
    learned = know.with_start(60_000, 0.90, {**DP8, "mem-fraction-static": 0.90})
    assert learned.calibration_for(dp) == (60_000, 0.90)
    small = {**dp, "mem-fraction-static": 0.90, "hicache-size": 4}  # 56,922 host tokens
    assert not precheck(small, hw(), learned).feasible
    assert precheck({**small, "hicache-size": 8}, hw(), learned).feasible
    # without any start's flags (an older record), the first start still calibrates all
    legacy = Knowledge().with_start(116_171, 0.85)
    assert legacy.calibration_for(dp) == (116_171, 0.85)


def test_no_pool_is_judged_by_the_bound_either_version_allows() -> None:
    """A speculative server's pool at a lower mfs: 0.5.6.post2 shrinks it by delta-mfs x free
    / the target's cell, 0.5.23 by the same over a cell with the draft's share. With a
    separate draft of unknown size the shrink is unknown: a start never looks empty."""
    spec = {**PLAIN, **EAGLE, "mem-fraction-static": 0.85}
    know = Knowledge().with_start(70_500, 0.85, spec)
    at80 = {**spec, "mem-fraction-static": 0.80}
    plain_know = Knowledge().with_start(70_500, 0.85, {**PLAIN, "mem-fraction-static": 0.85})
    # the same pool without a draft does empty at 0.80 (0.05 x 95.6 GiB / 70,272 B: ~73,000)
    assert not precheck({**PLAIN, "mem-fraction-static": 0.80}, hw(), plain_know).feasible
    free = 97_887 * cap.MIB
    fixed = cap.calibrate_fixed_bytes(70_500, 0.85, free, 70_272)
    assert pool_range(at80, hw(), know) == (cap.pool_tokens(0.80, free, fixed, 70_272), 70_500)
    assert precheck(at80, hw(), know).feasible


def test_weights_bound_the_pool_and_0_5_6_post2_adds_slots() -> None:
    """From weights alone the pool is bounded from above; under speculation 0.5.6.post2 adds
    `max_num_reqs x (steps x topk + draft tokens) + 100` slots beyond it (model_runner.py:
    1700-1709) and starts with them, so only a ceiling below zero with them is certain."""
    free = 97_887 * cap.MIB
    weights = (0.80 * free + 300 * 70_272) / cap.GIB  # leaves -300 tokens' worth at mfs 0.80
    h = hw(weights_gib=weights)
    plain = {**PLAIN, "mem-fraction-static": 0.80}
    assert not precheck(plain, h, Knowledge()).feasible
    spec = {**plain, **EAGLE}
    low, high = pool_range(spec, h, Knowledge()) or (0, 0)
    assert low == 0 and high == -300 + 48 * (3 * 1 + 4) + 100
    assert precheck(spec, h, Knowledge()).feasible


def test_feasible_dp_attention_and_speculative_shapes_are_accepted() -> None:
    h = hw(weights_gib=70)
    for flags in (
        {**DP8, "mem-fraction-static": 0.9, "hicache-size": 40},
        {**PLAIN, "attn-dp-size": 8, "mem-fraction-static": 0.9, "hicache-size": 40},
        {**DP8, **EAGLE, "mem-fraction-static": 0.9},
        {**PLAIN, "speculative-algorithm": "NEXTN", "mem-fraction-static": 0.9},
        {**PLAIN, "data-parallel-size": 1, "enable-dp-attention": True, "mem-fraction-static": 0.9},
    ):
        assert precheck(flags, h, Knowledge()).feasible, flags
    # HiCache per GPU rank: 8 ranks under DP attention, 0.5.23's spelling too
    v = precheck(
        {**PLAIN, "attn-dp-size": 8, "mem-fraction-static": 0.9, "hicache-size": 60}, h, Knowledge()
    )
    assert not v.feasible and "8 ranks x 60 GB" in v.reason


def test_what_sglang_refuses_before_loading() -> None:
    # 0.5.6.post2 server_args.py:1570 / 0.5.23 arg_groups/parallel_hook.py:326
    bad = {**PLAIN, "data-parallel-size": 3, "enable-dp-attention": True}
    assert "divide" in (launch_problem(bad) or "")
    v = precheck({**bad, "mem-fraction-static": 0.9}, hw(), Knowledge())
    assert not v.feasible and v.kind == "bad_flag"
    # 0.5.23 parallel_hook.py:287-292: replicas beside attention DP
    assert launch_problem({**PLAIN, "attn-dp-size": 8, "data-parallel-size": 2})
    # 0.5.6.post2 server_args.py:1733-1737 / 0.5.23 speculative_hook.py:1078-1084
    standalone = {**DP8, "speculative-algorithm": "STANDALONE"}
    assert "STANDALONE" in (launch_problem(standalone) or "")
    # 0.5.6.post2 server_args.py:1789-1793 / 0.5.23 speculative_hook.py:1159-1163
    assert launch_problem({**PLAIN, "speculative-algorithm": "EAGLE3", "speculative-eagle-topk": 1})
    assert launch_problem({**PLAIN, "speculative-algorithm": "EAGLE3", "speculative-num-steps": 3})
    # dp 1 turns DP attention off (0.5.6.post2 server_args.py:1564-1566): nothing to refuse
    assert launch_problem({**PLAIN, "enable-dp-attention": True}) is None
    assert launch_problem({**DP8, **EAGLE}) is None


def test_hardware_keeps_the_model_config(tmp_path: Any) -> None:
    cfg = parse_study(
        study_dict(
            server={"model-path": "m", "tp": 8},
            space={"concurrency": {"low": 1, "high": 8}},
            hardware={"model_config": "llama-3.1-70b", "gpu_mem_mib": 81_559},
        )
    )
    h = hardware_of(cfg)
    assert h.bytes_per_token == 40_960 and h.model_config is not None
    assert h.server["tensor-parallel-size"] == 8
    dp4 = {"data-parallel-size": 4, "enable-dp-attention": True}
    assert cell_bounds(dp4, h.model_config, h.server, h.bytes_per_token) == (163_840, 163_840)


def test_a_fixed_layout_sglang_refuses_refuses_the_study_file() -> None:
    """`config.validate`: a fixed DP attention whose dp does not divide tp cannot start in any
    trial (SGLang's assertion): the file is refused before the night; a searched dp is each
    trial's to be rejected by the pre-check."""

    def study(server: dict, space: dict | None = None) -> Any:
        space = {**(space or {}), "concurrency": {"low": 1, "high": 8}}
        return parse_study(study_dict(server={"model-path": "m", **server}, space=space), "s.yaml")

    with pytest.raises(ConfigError, match=r"server\.dp: DP attention needs dp \(3\)"):
        study({"tp": 8, "dp": 3, "enable-dp-attention": True})
    with pytest.raises(ConfigError, match=r"server\.speculative-algorithm"):
        study({"speculative-algorithm": "EAGLE3", "speculative-eagle-topk": 1})
    with pytest.raises(ConfigError, match="attn-dp-size"):
        study({"tp": 8, "attn-dp-size": 8, "dp": 2})
    study({"tp": 8, "dp": 8, "enable-dp-attention": True})
    study({"tp": 8, "enable-dp-attention": True}, {"dp": {"choices": [3, 4, 8]}})
    study({"speculative-algorithm": "EAGLE3"}, {"speculative-num-steps": {"low": 1, "high": 4}})


def test_a_start_moved_along_mfs_grows_by_the_gpu_over_the_cell() -> None:
    """`pool_moved`: fixed = mfs x free - tokens x cell from the start (calculus.py), then
    floor((mfs' x free - fixed) / cell): Kimi DP attention 8 at 0.89 (43,675 tokens) at 0.95."""
    free = 97_887 * cap.MIB
    dp = {**DP8, "mem-fraction-static": 0.89}
    got = pool_moved(dp, 43_675, 0.89, 0.95, hw())
    fixed = cap.calibrate_fixed_bytes(43_675, 0.89, free, 70_272)
    assert got == cap.pool_tokens(0.95, free, fixed, 70_272)
    assert 43_675 + 87_000 < got < 43_675 + 88_000  # 0.06 x 95.6 GiB / 70,272 B
    assert pool_moved(dp, 43_675, 0.89, 0.89, hw()) == 43_675
    # GQA under attention TP 2: the cell is 4x the plain TP 8 one, the growth a quarter
    llama = hw(LLAMA70, bytes_per_token=40_960)
    dp4 = {**PLAIN, "data-parallel-size": 4, "enable-dp-attention": True}
    grown = pool_moved(dp4, 10_000, 0.85, 0.95, llama) - 10_000
    plain = pool_moved(PLAIN, 10_000, 0.85, 0.95, llama) - 10_000
    assert abs(plain / grown - 4) < 0.01
    # no GPU memory: nothing projects
    assert pool_moved(dp, 43_675, 0.89, 0.95, hw(gpu_mem_mib=None)) is None


def test_sglangs_reserve_by_layout_flags() -> None:
    """`reserve_mib`: 0.5.6.post2's default-mfs reserve (server_args.py:848-890) for a trial's
    flags: graphs cost 2 MiB per batch, under DP attention 3 more per batch and group; a draft
    2,048 MiB; the chunk and graph batch default by GPU where the flags leave them out."""
    g256 = reserve_mib({**PLAIN, "cuda-graph-max-bs": 256}, 97_887)
    g64 = reserve_mib({**PLAIN, "cuda-graph-max-bs": 64}, 97_887)
    assert g256 - g64 == 192 * 2
    dp4 = {**PLAIN, "data-parallel-size": 4, "enable-dp-attention": True}
    dp4_256 = reserve_mib({**dp4, "cuda-graph-max-bs": 256}, 97_887)
    assert dp4_256 - reserve_mib({**dp4, "cuda-graph-max-bs": 64}, 97_887) == 192 * (2 + 3 * 4)
    assert reserve_mib({**DP8, "cuda-graph-max-bs": 256}, 97_887) - dp4_256 == 256 * 3 * 4
    spec = reserve_mib({**PLAIN, **EAGLE, "cuda-graph-max-bs": 256}, 97_887)
    assert spec - g256 == 2_048
    # SGLang's own picks for this GPU (8,192 and 512) where the flags are silent
    silent = reserve_mib(PLAIN, 97_887)
    assert silent == 512 + 8_192 * 1.5 + 512 * 2 + 1_024
