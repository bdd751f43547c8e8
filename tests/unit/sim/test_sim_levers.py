"""DP attention and speculative decoding at start-up: the memory plan, the resolved flags, the
profile's `speculative:` and `dp_attention:` sections, the engine's speculative parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.capacity import calculus as capacity
from tuner.errors import InputFileError
from tuner.sim.bootstrap import engine_params
from tuner.sim.flags import parse_flags
from tuner.sim.profile import PROFILES_DIR, load_profile
from tuner.sim.startup import build_script

OLD, NEW = "0.5.6.post2", "0.5.23"
KIMI = load_profile("kimi-k2.5-tp8")
EAGLE3 = (
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "d",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)
DP8 = ("--enable-dp-attention", "--dp-size", "8")


def kimi(*flags: str, version: str = OLD):
    base = ["--model-path", "m", "--sim-profile", "kimi-k2.5-tp8", "--tp-size", "8"]
    ns = parse_flags([*base, "--sim-sglang-version", version, *flags])
    return ns, build_script(ns, KIMI)


def starts(script) -> bool:
    return script.failure is None


def cliff(*flags: str) -> float:
    """The highest mem-fraction-static (step 0.00125 from 0.80) Kimi starts with these flags."""
    best = 0.0
    for i in range(161):
        mfs = round(0.80 + i * 0.00125, 5)
        _, s = kimi("--mem-fraction-static", str(mfs), *flags)
        if starts(s):
            best = mfs
    return best


# --- DP attention ---------------------------------------------------------------------------


def test_dp8_replicates_the_attention_weights_so_mfs_085_cannot_start():
    """Under DP 8 each GPU holds all attention weights (deepseek_v2.py:1267-1364: q_b, kv_b,
    o_proj split over the attention TP group of 1): 9.77 x 7/8 = 8.55 GiB more than at TP 8,
    more than the 7.6 GiB the pool had at mfs 0.85."""
    _, base = kimi("--mem-fraction-static", "0.85")
    _, dp = kimi("--mem-fraction-static", "0.85", *DP8)
    assert base.plan.max_total_num_tokens == 116_171
    assert dp.plan.dp_extra_weights_gib == pytest.approx(9.77 * 7 / 8)
    assert dp.plan.weights_gib == pytest.approx(base.plan.weights_gib + 9.77 * 7 / 8)
    assert dp.plan.verdict == "not_enough_memory"
    assert "RuntimeError: Not enough memory" in dp.failure.lines[-3].text


def test_dp8_pool_is_one_gpus_pool_per_group():
    """Each group's pool is sized like one GPU's: MLA's latent per token is the same at any
    attention TP (kv_layout at attn_tp 1); the flag's running requests split among groups."""
    ns, s = kimi("--mem-fraction-static", "0.92", "--cuda-graph-max-bs", "64", *DP8)
    plan = s.plan
    assert starts(s) and plan.dp_groups == 8
    assert plan.bytes_per_token == capacity.kv_layout(KIMI.model_config, 1).bytes_per_token
    extra = 9.77 * 7 / 8
    expected = capacity.pool_tokens(
        0.92, KIMI.free_at_init_mib * 2**20, (70.2 + extra + KIMI.other_gib) * 2**30, 70_272
    )
    assert plan.max_total_num_tokens == expected
    _, capped = kimi(
        "--mem-fraction-static",
        "0.92",
        "--cuda-graph-max-bs",
        "64",
        *DP8,
        "--max-running-requests",
        "256",
    )
    assert capped.plan.max_running_requests == 256 // 8
    params = engine_params(ns, s, KIMI)
    assert (params.dp_groups, params.attn_tp) == (8, 1)
    assert (
        params.chunked_prefill_size == 1024
        and params.schedule_conservativeness == pytest.approx(0.3)
    )


def test_dp_attention_graph_buffers_move_the_cliff_down():
    """DP attention's graphs hold the gathered batch of every group (cuda_graph_runner.py:581):
    at graph batch 512 and 8 groups that does not fit below mfs 0.9 where TP 8 alone did."""
    _, s = kimi("--mem-fraction-static", "0.92", *DP8)
    assert s.plan.verdict == "graph_oom"
    assert "Capture cuda graph failed" in " ".join(line.text for line in s.failure.lines)
    assert cliff(*DP8, "--cuda-graph-max-bs", "32") > cliff(*DP8, "--cuda-graph-max-bs", "96")


def test_hicache_counts_the_gpus_not_groups_times_gpus():
    _, s = kimi(
        "--mem-fraction-static", "0.92", "--cuda-graph-max-bs", "64", *DP8,
        "--enable-hierarchical-cache", "--hicache-size", "40",
    )  # fmt: skip
    assert starts(s)  # 8 x 40 GB fits the 424 GB available; 64 ranks would not


# --- speculative decoding -------------------------------------------------------------------


@pytest.mark.parametrize("version", [OLD, NEW])
def test_speculation_resolves_as_sglang_does(version):
    ns, s = kimi("--mem-fraction-static", "0.85", *EAGLE3, version=version)
    assert starts(s)
    assert s.levers.spec.num_draft_tokens == 4 and ns.max_running_requests == 48
    assert s.plan.max_running_requests == 48
    assert any("reset to 48" in w.text for w in s.warnings)


def test_draft_kv_per_version():
    """0.5.6.post2: the target's pool grows by max_num_reqs x (steps x topk + draft tokens) +
    100 (model_runner.py:1700-1713) and the draft gets that many tokens of its own; 0.5.23:
    one pool whose cell grows by the draft layer's share (pool_configurator.py:258-310)."""
    _, old = kimi("--mem-fraction-static", "0.85", *EAGLE3)
    assert old.plan.max_total_num_tokens == 116_171 + 48 * (3 * 1 + 4) + 100
    assert old.plan.draft_tokens == old.plan.max_total_num_tokens
    assert old.plan.draft_kv_gib == pytest.approx(old.plan.draft_tokens * 1152 / 2**30)
    _, new = kimi("--mem-fraction-static", "0.85", *EAGLE3, version=NEW)
    assert new.plan.bytes_per_token == capacity.with_draft(70_272, 61, 1) == 70_272 + 1152
    assert new.plan.draft_tokens == 0 and new.plan.max_total_num_tokens < 116_171
    # the request table holds context + 4 + draft tokens a request (model_runner.py:1746-1749)
    assert old.plan.req_to_token_gib == pytest.approx(48 * (262_144 + 8) * 4 / 2**30)


def test_more_draft_tokens_or_a_draft_move_the_graph_cliff_down():
    """Verify graphs are captured for batch x draft tokens; the draft's weights, pool and graphs
    come out of the same headroom. Same graph batch and running cap throughout."""
    same = ("--cuda-graph-max-bs", "256", "--max-running-requests", "256")
    plain = cliff(*same)
    chain = cliff(*same, *EAGLE3)
    tree = cliff(
        *same, *EAGLE3[:4], "--speculative-num-steps", "4",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
    )  # fmt: skip
    assert plain > chain > tree


def test_speculation_caps_graphs_at_its_48_requests():
    """Graphs are captured up to the request pool's size (cuda_graph_runner.py:193-208): with
    the 48-request default the verify graphs are smaller than TP 8's 512-batch graphs."""
    _, base = kimi("--mem-fraction-static", "0.85")
    _, spec = kimi("--mem-fraction-static", "0.85", *EAGLE3)
    assert spec.plan.graph_bs == 48 and base.plan.graph_bs == 512
    assert spec.plan.graph_gib < base.plan.graph_gib


@pytest.mark.parametrize(
    ("version", "extra", "reserve"),
    [
        (OLD, (), 4 + 1 * 3),  # managers/scheduler.py:805-815: draft tokens + topk x steps
        (NEW, (), 2 * 4),  # mem_cache/allocation_sizing.py:64-70: spec v2 keeps 2 x alloc len
        (NEW, ("--disable-overlap-schedule",), 4),  # pool_configurator.py:936-941 (spec v1)
    ],
)
def test_decode_reserve_per_version(version, extra, reserve):
    ns, s = kimi("--mem-fraction-static", "0.85", *EAGLE3, *extra, version=version)
    params = engine_params(ns, s, KIMI)
    assert params.spec.decode_reserve == reserve
    assert params.overlap is (version == NEW and not extra)
    assert params.spec.accept == (0.75, 0.68, 0.62)  # the profile's chat kind


def test_acceptance_kind_and_tree_chain():
    ns, s = kimi("--mem-fraction-static", "0.85", *EAGLE3, "--sim-acceptance", "code")
    assert engine_params(ns, s, KIMI).spec.accept == (0.88, 0.82, 0.76)
    draft = KIMI.speculative
    # depth min(steps, draft tokens - 1); k = min(topk, nodes // depth) candidates a level
    assert draft.chain("chat", 5, 2, 4) == pytest.approx((0.75, 0.68, 0.62))
    assert draft.chain("chat", 3, 2, 8) == pytest.approx((1 - 0.25**2, 1 - 0.32**2, 1 - 0.38**2))
    assert draft.chain("chat", 5, 4, 8) == pytest.approx((0.75, 0.68, 0.62, 0.62, 0.62))
    _, bad = kimi("--mem-fraction-static", "0.85", *EAGLE3, "--sim-acceptance", "poetry")
    assert bad.failure.exit_code == 2 and "--sim-acceptance poetry" in bad.failure.lines[0].text


def test_default_mfs_reserves_for_the_levers():
    """Without --mem-fraction-static the default reserves for DP attention's graphs and the
    draft (server_args.py:861-882; tuner/sglang/postinit.py)."""
    _, base = kimi()
    _, spec = kimi(*EAGLE3)
    assert base.defaults.mem_fraction_static == 0.848
    assert spec.defaults.mem_fraction_static == round((97887 - 14848 - 2048) / 97887, 3)


# --- profiles -------------------------------------------------------------------------------


def test_deepseek_profile_plays_mtp_as_its_own_draft():
    p = load_profile("deepseek-v3-tp8")
    base = ["--model-path", "deepseek-ai/DeepSeek-V3", "--sim-profile", "deepseek-v3-tp8"]
    ns = parse_flags([*base, "--tp-size", "8", "--speculative-algorithm", "NEXTN"])
    s = build_script(ns, p)
    assert starts(s)
    assert ns.speculative_algorithm == "EAGLE"
    assert ns.speculative_draft_model_path == "deepseek-ai/DeepSeek-V3"
    assert (ns.speculative_num_steps, ns.speculative_eagle_topk) == (3, 1)
    assert s.plan.draft_kv_gib == pytest.approx(s.plan.draft_tokens * 1152 / 2**30)
    # SGLang's default mfs on an H200 at TP 8 (sglang-reference.md: 0.897), less the draft's 2 GiB
    assert s.defaults.mem_fraction_static == round((143771 - 14848 - 2048) / 143771, 3)


def _profile_with(tmp: Path, section: str, value) -> Path:
    raw = yaml.safe_load((PROFILES_DIR / "kimi-k2.5-tp8.yaml").read_text())
    raw["model_config"] = "kimi-k2.5"
    raw[section] = value
    path = tmp / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("section", "patch", "message"),
    [
        ("speculative", {"algorithms": ["MEDUSA"]}, "speculative.algorithms"),
        ("speculative", {"acceptance": {"chat": [1.5]}}, "probabilities must be in 0..1"),
        ("speculative", {"default_kind": "poetry"}, "default_kind"),
        ("speculative", {"bogus": 1}, "speculative.bogus"),
        ("dp_attention", {"bogus": 1}, "dp_attention.bogus"),
    ],
)
def test_profile_sections_are_checked(tmp_path, section, patch, message):
    raw = yaml.safe_load((PROFILES_DIR / "kimi-k2.5-tp8.yaml").read_text())
    path = _profile_with(tmp_path, section, {**raw[section], **patch})
    with pytest.raises(InputFileError, match=message):
        load_profile(str(path))
