"""DP attention in the calculus and the pre-check, against SGLang's own rules:

- attention TP = TP / DP (0.5.6.post2 `layers/dp_attention.py:231`, `attn_tp_size = tp_size //
  dp_size`), and GQA's KV heads per rank are split over it (`model_executor/model_runner.py:1414`,
  `get_num_kv_heads(get_attention_tp_size())`); MLA's latent is per rank anyway;
- `--max-running-requests` is split among the attention DP groups only
  (`managers/tp_worker.py:292-300`, `// (dp_size if enable_dp_attention else 1)`);
- the server runs on T GPUs, not T x D, so HiCache's host pools are T, not T x D.
"""

from __future__ import annotations

from tuner.capacity import calculus as cap
from tuner.capacity.models import load_model_config
from tuner.capacity.precheck import Hardware, Knowledge, parallel_of, precheck

KIMI_BPT = 70_272  # MLA latent per token per GPU (README's seed table)


def test_the_split_of_gpus() -> None:
    replicas = cap.Parallel(tp=8, dp=8)
    attention = cap.Parallel(tp=8, dp=8, dp_attention=True)
    assert (replicas.gpus, replicas.attn_tp, replicas.attn_dp) == (64, 8, 1)
    assert (attention.gpus, attention.attn_tp, attention.attn_dp) == (8, 1, 8)
    assert attention.ranks == 8 and replicas.ranks == 64
    assert cap.Parallel(tp=8, dp=3, dp_attention=True).problem() is not None
    assert cap.Parallel(tp=8, dp=4, dp_attention=True).problem() is None
    assert attention.describe() == "TP 8 x PP 1 with DP attention (8 groups)"


def test_gqa_heads_follow_the_attention_tp_mla_does_not_move() -> None:
    llama70 = load_model_config("llama-3.1-70b")  # 8 KV heads
    kimi = load_model_config("kimi-k2.5")
    tp8 = cap.kv_layout(llama70, cap.Parallel(tp=8).attn_tp).bytes_per_token
    dp4 = cap.kv_layout(llama70, cap.Parallel(tp=8, dp=4, dp_attention=True).attn_tp)
    assert dp4.bytes_per_token == 4 * tp8  # 8 heads over attention TP 2: 4 per rank, not 1
    mla = {
        cap.kv_layout(kimi, par.attn_tp).bytes_per_token
        for par in (cap.Parallel(tp=8), cap.Parallel(tp=8, dp=8, dp_attention=True))
    }
    assert mla == {KIMI_BPT}


def test_running_requests_flag_is_split_among_attention_groups_only() -> None:
    assert cap.max_running_requests(1_000_000, 8192, 512, attn_dp=8) == 64
    assert cap.max_running_requests(1_000_000, 8192, 512) == 512  # replicas: each the whole flag


def test_the_seed_case_hicache_is_feasible_under_dp_attention() -> None:
    # Kimi-K2.5 on 8 GPUs, 449 GB of host RAM: 40 GB a rank is 320 GB (feasible); without DP
    # attention `--dp-size 8` would mean 64 GPUs and 2,560 GB
    hw = Hardware(bytes_per_token=KIMI_BPT, gpu_mem_mib=97_887, host_ram_gb=449, weights_gib=70)
    flags = {
        "tp": 8,
        "dp": 8,
        "enable-dp-attention": True,
        "mem-fraction-static": 0.85,
        "hicache-size": 40,
    }
    assert parallel_of(flags).ranks == 8
    assert precheck(flags, hw, Knowledge()).feasible
    too_big = precheck({**flags, "hicache-size": 60}, hw, Knowledge())
    assert not too_big.feasible and "8 ranks x 60 GB" in too_big.reason
    replicas = precheck({**flags, "enable-dp-attention": False}, hw, Knowledge())
    assert not replicas.feasible and "64 ranks" in replicas.reason


def test_a_drafts_kv_grows_the_cell_by_its_share_of_layers() -> None:
    # 0.5.23 pool_configurator.py:310-313: Kimi's 61 layers plus an EAGLE-3 draft of 1
    assert cap.with_draft(KIMI_BPT, 61, 1) == KIMI_BPT + int(KIMI_BPT / 61)
    assert cap.with_draft(KIMI_BPT, 61, 0) == KIMI_BPT
