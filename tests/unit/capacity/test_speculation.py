"""Speculative decoding in the calculus, fact by fact against SGLang's own source. Paths are
under `python/sglang/` of each release (0.5.6.post2 and 0.5.23, as extracted from their wheels).
"""

from __future__ import annotations

import pytest

from tuner.capacity import calculus as cap
from tuner.capacity import speculation as spec
from tuner.capacity.analysis import CapacityInputs, analyze
from tuner.capacity.draftreading import DraftInputs
from tuner.capacity.models import load_model_config

KIMI = load_model_config("kimi-k2.5")
KIMI_BPT = 70_272
GPU_MIB = 97_887


def _kimi(**kw: object) -> dict:
    base: dict = dict(
        model_config=KIMI,
        tp=8,
        gpu_mem_mib=GPU_MIB,
        observed_tokens=116_171,
        observed_mfs=0.85,
        mfs=(0.90, 0.95),
        avg_lens=(4000,),
    )
    base.update(kw)
    return analyze(CapacityInputs(**base))


def test_the_drafts_cell_share_is_0_5_23s() -> None:
    # 0.5.23 srt/model_executor/pool_configurator.py:310-314:
    #   draft_kv_size = int(self._cell_size * draft_num_layers / int(num_layers))
    r = _kimi(draft=DraftInputs(layers=1), plain_basis=True)
    assert r["bytes_per_token"] == KIMI_BPT + int(KIMI_BPT * 1 / 61) == 71_424
    assert r["speculative"]["draft_bytes_per_token"] == 1_152
    assert r["speculative"]["target_bytes_per_token"] == KIMI_BPT


def test_draft_layers_from_its_config_or_the_models_mtp_head() -> None:
    # 0.5.23 srt/model_executor/model_runner_components/spec_aux_hidden_state.py:152-160: the
    # draft's num_nextn_predict_layers when present, else max(num_hidden_layers, ...);
    # 0.5.6.post2 srt/model_executor/model_runner.py:1370-1375 (the draft worker's pool)
    assert (
        spec.draft_layers_of({"num_hidden_layers": 1, "architectures": ["LlamaForCausalLMEagle3"]})
        == 1
    )
    assert spec.draft_layers_of({"num_hidden_layers": 61, "num_nextn_predict_layers": 1}) == 1
    assert (
        spec.mtp_layers(
            {**KIMI, "text_config": {**KIMI["text_config"], "num_nextn_predict_layers": 1}}
        )
        == 1
    )
    assert spec.mtp_layers(KIMI) is None  # the shipped excerpt has no MTP field
    mtp = {**load_model_config("deepseek-v3"), "num_nextn_predict_layers": 1}
    r = analyze(CapacityInputs(model_config=mtp, tp=8, draft=DraftInputs(algorithm="NEXTN")))
    assert r["speculative"]["draft_layers"] == 1
    assert "num_nextn_predict_layers" in r["speculative"]["draft_layers_from"]


def test_the_draft_weights_are_in_the_fixed_part() -> None:
    # 0.5.23 srt/managers/scheduler.py:1077-1111: the target's pool is sized after the draft
    # worker loaded (its preloaded weights counted); kv_cache_configurator.py:3038-3057:
    # rest = available - (1 - mfs) x pre-load memory, "draft weights are now counted"
    r = _kimi(draft=DraftInputs(layers=1, weights_gib=0.5), plain_basis=True)
    free = GPU_MIB * cap.MIB
    fixed = cap.calibrate_fixed_bytes(116_171, 0.85, free, KIMI_BPT) + 0.5 * cap.GIB
    expected = cap.pool_tokens(0.95, free, fixed, 71_424)
    assert [p["max_total_num_tokens"] for p in r["projection"] if p["mfs"] == 0.95] == [expected]


def test_extra_slots_per_running_request() -> None:
    # 0.5.23 srt/utils/common.py:4424-4448 spec_decode_alloc_len_per_request, and
    # srt/mem_cache/allocation_sizing.py:64-70: 2 x per decode step
    assert spec.decode_alloc_len(1, 3, 1, 4) == 4
    assert spec.decode_alloc_len(1, 5, 4, 8) == 20
    assert spec.decode_alloc_len(16, 3, 2, 4) == 32 * 2  # ceil_align(3 + 16, 16) x top-k 2
    assert spec.decode_alloc_len(16, 3, 1, 4) == 16
    assert spec.extra_slots_per_request(1, 3, 1, 4) == 8
    # 0.5.6.post2 srt/model_executor/model_runner.py:1700-1709 draft_runner_cache_size:
    # max_num_reqs x (steps x topk + draft tokens) + 100 on top of the profiled pool
    assert spec.v056_extra_tokens(48, 3, 1, 4) == 48 * 7 + 100 == 436
    r = _kimi(draft=DraftInputs(layers=1, num_steps=3, eagle_topk=1), plain_basis=True)
    assert r["speculative"]["extra_slots_per_request"] == 8
    assert r["speculative"]["sglang_0_5_6"]["extra_pool_tokens"] == 436
    (row,) = [p for p in r["projection"] if p["mfs"] == 0.85]
    # requests of 4,000 tokens hold 4,008 slots each while they decode
    assert row["admissible"][0]["requests"] == min(row["max_total_num_tokens"] // 4008, 48)


def test_0_5_6_post2_sizes_the_target_alone_and_pays_from_the_headroom() -> None:
    r = _kimi(
        draft=DraftInputs(layers=1, weights_gib=0.5, num_steps=3, eagle_topk=1), plain_basis=True
    )
    (row,) = [p for p in r["projection"] if p["mfs"] == 0.85]
    old = row["sglang_0_5_6"]
    assert old["max_total_num_tokens"] == 116_171 + 436  # the observed target pool plus the slots
    used = 0.5 * cap.GIB + 436 * KIMI_BPT + old["max_total_num_tokens"] * 1_152
    assert old["headroom_gib"] == round((0.15 * GPU_MIB * cap.MIB - used) / cap.GIB, 2)


@pytest.mark.parametrize(
    ("arch", "version", "expected"),
    [
        # 0.5.6.post2 srt/server_args.py:4649-4680; 0.5.23 arg_groups/speculative_hook.py:1430-1461
        ("DeepseekV3ForCausalLM", "0.5.6.post2", (3, 1, 4)),
        ("LlamaForCausalLM", "0.5.23", (5, 4, 8)),
        ("KimiK25ForConditionalGeneration", "0.5.6.post2", (5, 4, 8)),
        ("KimiK25ForConditionalGeneration", "0.5.23", (3, 1, 4)),
    ],
)
def test_sglangs_own_choice_of_steps(arch: str, version: str, expected: tuple) -> None:
    assert spec.resolve_params("EAGLE3", arch, version)[:3] == expected


def test_steps_as_sglang_resolves_them() -> None:
    # top-k 1: draft tokens = steps + 1 (0.5.6.post2 server_args.py:1810-1817; 0.5.23
    # speculative_hook.py:1255-1267); top-k or draft tokens without steps: an assertion
    # (0.5.6.post2 server_args.py:1789-1793; 0.5.23 speculative_hook.py:1159-1163)
    assert spec.resolve_params("EAGLE3", "", "0.5.23", 3, 1, 9)[:3] == (3, 1, 4)
    assert spec.resolve_params("EAGLE3", "", "0.5.23", 5, 4, 8)[:3] == (5, 4, 8)
    with pytest.raises(ValueError, match="need"):
        spec.resolve_params("EAGLE3", "", "0.5.23", None, 4, None)
    assert spec.architecture(KIMI) == "KimiK25ForConditionalGeneration"  # the top level's


def test_max_running_requests_is_reset_to_48_under_speculation() -> None:
    # 0.5.6.post2 srt/server_args.py:1739-1743 and 0.5.23 arg_groups/speculative_hook.py:
    # 1086-1094: unset -> 48; split among attention DP groups (0.5.6.post2
    # managers/tp_worker.py:292-300; 0.5.23 mem_cache/kv_cache_configurator.py:3126-3129)
    assert spec.running_requests_flag(None, True) == (48, True)
    assert spec.running_requests_flag(None, False) == (None, False)
    assert spec.running_requests_flag(64, True) == (64, False)
    r = _kimi(draft=DraftInputs(layers=1), plain_basis=True)
    assert r["speculative"]["max_running_requests_flag"] == 48
    assert {p["max_running_requests"] for p in r["projection"]} == {48}
    dp = _kimi(draft=DraftInputs(layers=1), plain_basis=True, dp=8, dp_attention=True, mfs=(0.95,))
    (row,) = [p for p in dp["projection"] if p["mfs"] == 0.95]
    assert (row["max_running_requests"], row["max_running_requests_total"]) == (6, 48)
    without = _kimi(max_running_requests=None)
    assert without["projection"][0]["max_running_requests"] == 2048  # tokens // 2, the pool


def test_a_given_flag_is_the_request_pool() -> None:
    # 0.5.6.post2 model_runner.py:1650-1660: req_to_token_pool = the flag when given, so a
    # flag above 4096 is not cut to the default pool
    assert cap.max_running_requests(10**6, 8192, 5000) == 5000
    assert cap.max_running_requests(10**6, 8192, 5000, attn_dp=8) == 625


def test_what_cuda_graphs_are_captured_for_and_what_sglang_reserves() -> None:
    # 0.5.6.post2 server_args.py:914-922 (0.5.23 arg_groups/cuda_graph_hook.py:516-531): the
    # speculative batch sizes, capped at the request pool (cuda_graph_runner.py:193-208); each
    # verify graph runs bs x draft tokens (cuda_graph_runner.py:277-300)
    assert spec.capture_batch_sizes(48) == [
        *range(1, 9),
        *range(10, 33, 2),
        40,
        44,
        48,
    ]
    assert spec.capture_batch_sizes(300)[-4:] == [256, 272, 288, 300]  # max_bs itself too
    # 0.5.6.post2 server_args.py:874-880: +2 GiB for an EAGLE draft, +6 GiB STANDALONE;
    # 0.5.23 arg_groups/memory_hook.py:281-325 keeps nothing back for a draft
    assert spec.default_reserve_mib("EAGLE3", "0.5.6.post2") == 2048
    assert spec.default_reserve_mib("STANDALONE", "0.5.6.post2") == 6144
    assert spec.default_reserve_mib("NGRAM", "0.5.6.post2") == 0
    assert spec.default_reserve_mib("EAGLE3", "0.5.23") == 0
    r = _kimi(draft=DraftInputs(layers=1, num_steps=3, eagle_topk=1), plain_basis=True)
    graphs = r["speculative"]["cuda_graphs"]
    assert graphs["max_bs"] == 48 and graphs["max_tokens"] == 48 * 4
    assert r["sglang_defaults"]["reserve_mib"]["speculative"] == 2048
    assert r["sglang_defaults"]["mem_fraction_static"] == round(
        (GPU_MIB - 14_848 - 2048) / GPU_MIB, 3
    )
