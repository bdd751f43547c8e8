"""SGLang's ServerArgs post-init for DP attention and speculative decoding, per version, against
`tuner.sglang.postinit` (pure rules; no server).

Facts name `sglang/srt/...` of v0.5.6.post2 (OLD) or v0.5.23 (NEW), file:line.
"""

from __future__ import annotations

import pytest

from tests.helpers.played import NEW, OLD, VERSIONS
from tuner.sglang.postinit import (
    EXIT_MAIN_EXCEPTION,
    default_mem_fraction_static,
    refusal_messages,
    resolve,
)

KIMI = "KimiK25ForConditionalGeneration"
DSV3 = "DeepseekV3ForCausalLM"
DP8 = {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True, "chunked_prefill_size": 8192}
EAGLE3 = {
    "tp_size": 8,
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "draft",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}
RESET_48 = (
    "Max running requests is reset to 48 for speculative decoding. You can override this by "
    "explicitly setting --max-running-requests."
)


def test_dp_attention_old():
    # OLD server_args.py:1568-1574: conservativeness x 0.3, chunked prefill // dp, the warning
    r = resolve(DP8, OLD)
    assert r.error is None and r.attn_dp_size == 8
    assert r.flags["schedule_conservativeness"] == pytest.approx(0.3)
    assert r.flags["chunked_prefill_size"] == 1024
    assert r.warnings == (
        "DP attention is enabled. The chunked prefill size is adjusted to 1024 to avoid MoE "
        "kernel issues. ",
    )
    assert r.flags["dp_size"] == 8 and r.flags["enable_dp_attention"] is True


def test_dp_attention_new_is_attn_dp_size():
    # NEW arg_groups/parallel_hook.py:40-63: the deprecated flag moves dp_size to attn_dp_size;
    # :316-339: x 0.3, // attn_dp_size, the warning naming both sizes
    r = resolve({**DP8, "attn_dp_size": 1}, NEW)
    assert r.error is None and r.attn_dp_size == 8
    assert (r.flags["dp_size"], r.flags["attn_dp_size"]) == (1, 8)
    assert r.flags["enable_dp_attention"] is False  # the field; /server_info reports the width
    assert r.flags["chunked_prefill_size"] == 1024
    assert r.flags["schedule_conservativeness"] == pytest.approx(0.3)
    assert r.warnings == (
        "DP attention is enabled. chunked prefill size is adjusted from 8192 to 1024.",
    )
    # the new spelling does the same
    same = resolve({"tp_size": 8, "attn_dp_size": 8, "chunked_prefill_size": 8192}, NEW)
    assert same.flags["chunked_prefill_size"] == 1024 and same.attn_dp_size == 8


@pytest.mark.parametrize("version", VERSIONS)
def test_dp_size_one_turns_dp_attention_off(version):
    # OLD server_args.py:1564-1566; NEW parallel_hook.py:52-58 (attn_dp_size takes dp_size 1)
    r = resolve({**DP8, "dp_size": 1}, version)
    assert r.error is None and r.attn_dp_size == 1
    assert r.flags["chunked_prefill_size"] == 8192 and r.warnings == ()


@pytest.mark.parametrize("version", VERSIONS)
def test_tp_must_be_a_multiple_of_dp(version):
    # OLD server_args.py:1570, NEW parallel_hook.py:326: a bare assert (exit 1)
    r = resolve({**DP8, "tp_size": 6, "dp_size": 4}, version)
    assert r.error is not None and r.error.line == "AssertionError"
    assert r.error.exit_code == EXIT_MAIN_EXCEPTION == 1


def test_new_refusals_of_dp_sizes():
    # NEW parallel_hook.py:285-292
    r = resolve({"tp_size": 8, "attn_dp_size": 0}, NEW)
    assert r.error.line == "ValueError: --attn-dp-size must be positive (got 0)."
    r = resolve({"tp_size": 8, "attn_dp_size": 4, "dp_size": 2}, NEW)
    assert r.error.line == (
        "ValueError: --dp-size 2 with --attn-dp-size 4: data-parallel replicas combined with "
        "attention data parallelism are not supported."
    )


def test_dp_lm_head_needs_dp_attention_old():
    # OLD server_args.py:1576-1579 (after dp_size 1 cleared enable_dp_lm_head only at dp 1)
    r = resolve({"tp_size": 8, "dp_size": 2, "enable_dp_lm_head": True}, OLD)
    assert r.error.line == (
        "AssertionError: Please enable dp attention when setting enable_dp_lm_head. "
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_speculation_resets_max_running_requests_to_48(version):
    # OLD server_args.py:1739-1743; NEW arg_groups/speculative_hook.py:1086-1095
    r = resolve(EAGLE3, version, KIMI)
    assert r.error is None and r.flags["max_running_requests"] == 48
    assert RESET_48 in r.warnings
    kept = resolve({**EAGLE3, "max_running_requests": 256}, version, KIMI)
    assert kept.flags["max_running_requests"] == 256 and RESET_48 not in kept.warnings


def test_overlap_schedule_off_under_speculation_old_only():
    # OLD server_args.py:1754-1758 (SGLANG_ENABLE_SPEC_V2 unset); NEW keeps the overlap
    # scheduler (spec v2) and warns only when the user turned it off (:1097-1102)
    old = resolve(EAGLE3, OLD, KIMI)
    assert old.flags["disable_overlap_schedule"] is True
    assert (
        "Overlap scheduler is disabled because of using eagle3 or standalone speculative "
        "decoding." in old.warnings
    )
    new = resolve(EAGLE3, NEW, KIMI)
    assert new.flags["disable_overlap_schedule"] is False
    off = resolve({**EAGLE3, "disable_overlap_schedule": True}, NEW, KIMI)
    assert (
        "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative "
        "decoding." in off.warnings
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_topk_one_forces_draft_tokens_to_steps_plus_one(version):
    # OLD server_args.py:1810-1817; NEW speculative_hook.py:1255-1266
    r = resolve({**EAGLE3, "speculative_num_draft_tokens": 8}, version, KIMI)
    assert r.flags["speculative_num_draft_tokens"] == 4
    assert (
        "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
        "speculative_eagle_topk == 1" in r.warnings
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_nextn_is_eagle_and_mtp_models_draft_themselves(version):
    # OLD server_args.py:1729-1730 and :1767-1779; NEW speculative_hook.py:81-118, :1124-1157;
    # the automatic (3, 1, 4) for DeepSeek-V3 (OLD :4663-4675, NEW :1443-1458)
    r = resolve({"tp_size": 8, "speculative_algorithm": "NEXTN", "model_path": "ds"}, version, DSV3)
    assert r.error is None
    assert r.flags["speculative_algorithm"] == "EAGLE"
    assert r.flags["speculative_draft_model_path"] == "ds"
    steps = (r.flags[f"speculative_{k}"] for k in ("num_steps", "eagle_topk", "num_draft_tokens"))
    assert tuple(steps) == (3, 1, 4)
    told = resolve(
        {"speculative_algorithm": "NEXTN", "speculative_draft_model_path": "x"}, version, DSV3
    )
    assert "DeepSeek MTP does not require setting speculative_draft_model_path." in told.warnings


def test_automatic_parameters_of_other_models_differ_by_version():
    # OLD server_args.py:4678-4680 (5, 4, 8); NEW speculative_hook.py:1460-1461 (3, 1, 4)
    flags = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "d"}
    keys = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    assert tuple(resolve(flags, OLD, KIMI).flags[k] for k in keys) == (5, 4, 8)
    assert tuple(resolve(flags, NEW, KIMI).flags[k] for k in keys) == (3, 1, 4)
    # topk or draft tokens without steps: OLD :1790-1793, NEW :1160-1163 assert
    r = resolve({**flags, "speculative_eagle_topk": 2}, OLD, KIMI)
    assert r.error.line == "AssertionError"


@pytest.mark.parametrize("version", VERSIONS)
def test_standalone_and_ngram_refuse_dp_attention(version):
    # OLD server_args.py:1733-1737 and :1863-1867; NEW speculative_hook.py:1078-1084, :1365-1371
    dp = {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}
    r = resolve({**dp, "speculative_algorithm": "STANDALONE"}, version)
    assert r.error.line == (
        "ValueError: Currently standalone speculative decoding does not support dp attention."
    )
    assert r.error.exit_code == 1
    r = resolve({**dp, "speculative_algorithm": "NGRAM"}, version)
    assert r.error.line == (
        "ValueError: Currently ngram speculative decoding does not support dp attention."
    )


def test_draft_trees_on_pages_refused_per_version():
    tree = {**EAGLE3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
    paged = {**tree, "page_size": 64, "attention_backend": "flashmla"}
    # OLD server_args.py:1819-1826: only flashinfer / fa3
    old = resolve(paged, OLD, KIMI)
    assert old.error.line == (
        "ValueError: speculative_eagle_topk > 1 with page_size > 1 is unstable and produces "
        "incorrect results for paged attention backends. This combination is only supported "
        "for the 'flashinfer' backend."
    )
    assert resolve({**paged, "attention_backend": "fa3"}, OLD, KIMI).error is None
    # NEW speculative_hook.py:1268-1283: flashinfer, fa3 or triton
    new = resolve(paged, NEW, KIMI)
    assert new.error.line == (
        "ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on "
        "('flashinfer', 'fa3', 'triton'); got attention_backend='flashmla'. Use page_size == 1 "
        "or one of those backends."
    )
    assert resolve({**paged, "attention_backend": "triton"}, NEW, KIMI).error is None
    assert resolve({**paged, "attention_backend": "triton"}, OLD, KIMI).error is not None


def test_new_uppercases_and_refuses_unknown_algorithms():
    # NEW speculative_hook.py:137-144 upper-cases; spec_info.py:50-65 refuses the unknown
    r = resolve({**EAGLE3, "speculative_algorithm": "eagle3"}, NEW, KIMI)
    assert r.error is None and r.flags["speculative_algorithm"] == "EAGLE3"
    r = resolve({**EAGLE3, "speculative_algorithm": "medusa"}, NEW, KIMI)
    assert r.error.line == "ValueError: Unknown speculative algorithm name: MEDUSA"


def test_ngram_defaults_per_version():
    # OLD server_args.py:1834-1851: window 12 draft tokens, topk = bfs breadth 10; NEW
    # speculative_hook.py:1294-1330: 12 draft tokens with its warning, steps = 12 // 10
    old = resolve({"speculative_algorithm": "NGRAM"}, OLD)
    assert (old.flags["speculative_num_draft_tokens"], old.flags["speculative_eagle_topk"]) == (
        12,
        10,
    )
    assert old.flags["max_running_requests"] == 48
    new = resolve({"speculative_algorithm": "NGRAM"}, NEW)
    assert new.flags["speculative_num_steps"] == 1
    assert any("set to 12 by default for ngram" in w for w in new.warnings)


def test_default_mem_fraction_static_reserves():
    # OLD server_args.py:848-885 on Kimi's GPU (97,887 MiB), TP 8, chunked prefill 8192, graph
    # batch 512: 512 + 8192 x 1.5 + 512 x 2 + 1024 = 14,848 MiB (above the 10 GiB floor); DP
    # attention adds 512 x 8 x (3 + 1.5) MiB (graph batch over 300); an EAGLE draft 2 GiB
    base = {"tp_size": 8, "chunked_prefill_size": 8192, "cuda_graph_max_bs": 512}
    assert default_mem_fraction_static(97887, base, OLD) == round((97887 - 14848) / 97887, 3)
    dp = {**base, "dp_size": 8, "enable_dp_attention": True}
    dp_reserve = 14848 + 512 * 8 * 4.5
    assert default_mem_fraction_static(97887, dp, OLD) == round((97887 - dp_reserve) / 97887, 3)
    spec = {**base, "speculative_algorithm": "EAGLE3"}
    assert default_mem_fraction_static(97887, spec, OLD) == round((97887 - 16896) / 97887, 3)
    # NEW arg_groups/memory_hook.py:306-317, :371-378: the DP term, no draft term
    assert default_mem_fraction_static(97887, spec, NEW) == round((97887 - 14848) / 97887, 3)
    new_dp = {**base, "attn_dp_size": 8}
    assert default_mem_fraction_static(97887, new_dp, NEW) == round((97887 - dp_reserve) / 97887, 3)


def test_refusal_messages_cover_every_refusal():
    messages = refusal_messages()
    lines = [
        resolve({**DP8, "speculative_algorithm": "STANDALONE"}, OLD).error.line,
        resolve({"tp_size": 8, "attn_dp_size": 0}, NEW).error.line,
        resolve({**EAGLE3, "speculative_algorithm": "x"}, NEW).error.line,
    ]
    assert all(any(m in line for m in messages) for line in lines)
