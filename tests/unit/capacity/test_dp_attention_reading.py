"""`tuner capacity`'s reading under DP attention, against SGLang's source (paths under
`python/sglang/` of 0.5.6.post2 and 0.5.23):

- attention TP = TP / DP (0.5.6.post2 `srt/layers/dp_attention.py:231`; 0.5.23
  `srt/runtime_context.py:73-76`); GQA's KV heads per rank follow it (0.5.6.post2
  `srt/model_executor/model_runner.py:1414`; 0.5.23 `srt/model_executor/pool_configurator.py:
  356, 488`), MLA's latent does not;
- each attention DP group schedules its own requests: the flag split among the groups
  (0.5.6.post2 `srt/managers/tp_worker.py:292-300`; 0.5.23 `srt/mem_cache/
  kv_cache_configurator.py:3126-3129`);
- the sharded attention projections are split over attention TP only (0.5.6.post2
  `srt/models/deepseek_v2.py:1267-1366`, `tp_size=attn_tp_size`), so each GPU holds more
  weights;
- SGLang's default mfs keeps back `cuda_graph_max_bs x dp x 3` MiB more (and `x 1.5` above a
  max batch of 300): 0.5.6.post2 `srt/server_args.py:861-869`, 0.5.23 `srt/arg_groups/
  memory_hook.py:371-378`; the chunked prefill is divided by dp (0.5.6.post2
  `server_args.py:1571`).
"""

from __future__ import annotations

from tuner.capacity import calculus as cap
from tuner.capacity import dpattention
from tuner.capacity.analysis import CapacityInputs, analyze
from tuner.capacity.models import load_model_config
from tuner.sglang.defaults import default_chunked_prefill_and_graph_bs, default_mem_fraction_static

KIMI = load_model_config("kimi-k2.5")
GPU_MIB = 97_887
SEED = dict(
    model_config=KIMI,
    tp=8,
    gpu_mem_mib=GPU_MIB,
    observed_tokens=116_171,
    observed_mfs=0.85,
    mfs=(0.90, 0.95),
    hicache_sizes_gb=(40, 60),
    host_ram_gb=449,
    avg_lens=(4000,),
)


def test_mla_keeps_its_cell_and_each_group_its_requests() -> None:
    plain = analyze(CapacityInputs(**SEED))
    dp = analyze(CapacityInputs(**{**SEED, "dp": 8, "dp_attention": True}))
    assert plain["bytes_per_token"] == dp["bytes_per_token"] == 70_272
    assert dp["parallel"] == {
        "describe": "TP 8 x PP 1 with DP attention (8 groups)",
        "ranks": 8,
        "attn_tp": 1,
        "attn_dp": 8,
        "groups": 8,
    }
    assert dp["gpus"] == 8
    # observed on a DP-attention server: its pool per GPU is its group's; 8 groups hold 8x
    (row,) = [p for p in dp["projection"] if p["mfs"] == 0.95]
    fits = row["admissible"][0]
    assert (
        fits["requests_total"] == 8 * fits["requests"] == 8 * (row["max_total_num_tokens"] // 4000)
    )


def test_gqa_cell_follows_the_attention_tp() -> None:
    llama = load_model_config("llama-3.1-70b")  # 8 KV heads
    tp8 = analyze(CapacityInputs(model_config=llama, tp=8))
    dp4 = analyze(CapacityInputs(model_config=llama, tp=8, dp=4, dp_attention=True))
    assert tp8["bytes_per_token"] == 40_960  # sglang-reference.md section 2
    assert dp4["bytes_per_token"] == 4 * 40_960  # 8 heads over attention TP 2: 4 a rank


def test_the_attention_weights_each_gpu_holds_more() -> None:
    # Kimi-K2.5: q_b 1536 x 64 x (128 + 64), kv_b 512 x 64 x (128 + 128), o 64 x 128 x 7168 a
    # layer, 61 layers, bf16, held whole (attention TP 1) instead of an eighth
    per_layer = 1536 * 64 * 192 + 512 * 64 * 256 + 64 * 128 * 7168
    expected = per_layer * 61 * (1 - 1 / 8) * 2
    text = {k: v for k, v in KIMI["text_config"].items() if k != "vocab_size"}
    bare = {**KIMI, "text_config": text}  # a config without its vocabulary: no embedding
    got = dpattention.replicated_weight_bytes(bare, cap.Parallel(8, 8, 1, True))
    assert got is not None and got[0] == expected
    assert dpattention.replicated_weight_bytes(KIMI, cap.Parallel(8, 8)) is None  # replicas
    assert KIMI["text_config"]["vocab_size"] == 163_840  # the shipped config has it
    more = dpattention.replicated_weight_bytes(KIMI, cap.Parallel(8, 8, 1, True))
    assert more is not None and more[0] == expected + 163_840 * 7168 * (1 - 1 / 8) * 2
    fp8 = {**KIMI, "quantization_config": {"quant_method": "fp8"}}
    assert dpattention.weight_dtype_bytes(fp8) == 1


def test_a_plain_servers_pool_read_for_dp_attention() -> None:
    """The seed's pool was a plain TP 8 server's: under DP attention each GPU also holds the
    attention weights whole, so the same mfs leaves less for the KV pool."""
    r = analyze(CapacityInputs(**{**SEED, "dp": 8, "dp_attention": True, "plain_basis": True}))
    estimate = dpattention.replicated_weight_bytes(KIMI, cap.Parallel(8, 8, 1, True))
    assert estimate is not None
    extra = estimate[0]
    assert r["dp_attention_weights"]["extra_gib_per_gpu"] == round(extra / cap.GIB, 2)
    free = GPU_MIB * cap.MIB
    fixed = cap.calibrate_fixed_bytes(116_171, 0.85, free, 70_272)
    tokens = {p["mfs"]: p["max_total_num_tokens"] for p in r["projection"]}
    assert tokens[0.85] == 0 and "Not enough memory" in r["projection"][0]["warning"]
    assert tokens[0.95] == cap.pool_tokens(0.95, free, fixed + extra, 70_272)
    given = analyze(
        CapacityInputs(
            **{**SEED, "dp": 8, "dp_attention": True, "plain_basis": True},
            dp_attention_extra_gib=2.0,
        )
    )
    assert given["dp_attention_weights"]["extra_gib_per_gpu"] == 2.0
    assert {p["mfs"]: p["max_total_num_tokens"] for p in given["projection"]}[0.85] > 0


def test_the_seed_hicache_under_dp_attention() -> None:
    """Kimi on 8 GPUs, 449 GB of host RAM: 40 GB a rank is 8 x 40 = 320 GB (feasible), 60 is
    480 GB (no: 449 GB less SGLang's 10 GiB holds 54 a rank); as replicas it was 64 ranks."""
    r = analyze(CapacityInputs(**{**SEED, "dp": 8, "dp_attention": True}))
    by_size = {h["hicache_size_gb_per_rank"]: h for h in r["hicache"]}
    assert by_size[40]["feasible"] and by_size[40]["host_total_gb"] == 320
    assert not by_size[60]["feasible"] and "8 ranks x 60 GB" in by_size[60]["reason"]
    assert r["hicache_max_gb_per_rank"] == 54
    replicas = analyze(CapacityInputs(**{**SEED, "dp": 8}))
    assert replicas["gpus"] == 64 and not replicas["hicache"][0]["feasible"]


def test_sglangs_default_reserve_under_dp_attention() -> None:
    chunk, bs = default_chunked_prefill_and_graph_bs(GPU_MIB, 8)
    assert (chunk, bs) == (8192, 512)
    plain = dpattention.default_reserve(GPU_MIB, cap.Parallel(8), chunk, bs)
    assert plain["mem_fraction_static"] == default_mem_fraction_static(GPU_MIB, 8)
    dp = dpattention.default_reserve(GPU_MIB, cap.Parallel(8, 8, 1, True), chunk, bs)
    assert dp["dp_attention"] == 512 * 8 * 3 + 512 * 8 * 1.5 == 18_432
    assert dp["mem_fraction_static"] == round((GPU_MIB - 14_848 - 18_432) / GPU_MIB, 3) == 0.66
    r = analyze(CapacityInputs(**{**SEED, "dp": 8, "dp_attention": True}))
    assert r["sglang_defaults"]["mem_fraction_static"] == 0.66
    assert r["sglang_defaults"]["chunked_prefill_size_per_group"] == 1024
