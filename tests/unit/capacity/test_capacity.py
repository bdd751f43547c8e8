"""The KV-cache calculus against the numbers SGLang's source gives (sglang-reference.md 1-3)."""

from __future__ import annotations

import pytest

from tuner.capacity import calculus as cap
from tuner.capacity.analysis import CapacityInputs, analyze
from tuner.capacity.models import load_model_config
from tuner.errors import ModelConfigError
from tuner.sglang.defaults import default_mem_fraction_static

KIMI_GPU_MIB = 97887


@pytest.mark.parametrize(
    ("model", "tp", "expected"),
    [
        ("llama-3.1-8b", 1, 131_072),
        ("llama-3.1-70b", 1, 327_680),
        ("llama-3.1-70b", 8, 40_960),
        ("llama-3.1-70b", 16, 40_960),  # 8 KV heads at TP 16: replicated, never below one per rank
        ("qwen2.5-7b", 1, 57_344),
        ("deepseek-v3", 1, 70_272),
        ("deepseek-v3", 8, 70_272),  # MLA: not divided by TP
        ("kimi-k2.5", 8, 70_272),  # fields nested under text_config
    ],
)
def test_bytes_per_token(model: str, tp: int, expected: int) -> None:
    assert cap.kv_layout(load_model_config(model), tp).bytes_per_token == expected


def test_kv_dtype_fp8_halves_bytes() -> None:
    cfg = load_model_config("llama-3.1-8b")
    assert cap.kv_layout(cfg, 1, "fp8_e4m3").bytes_per_token == 65_536
    assert cap.kv_layout(cfg, 1, "bf16").bytes_per_token == 131_072


def test_head_dim_field_wins_over_hidden_over_heads() -> None:
    cfg = {
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 1024,
        "head_dim": 256,
    }
    assert cap.kv_layout(cfg, 1).bytes_per_token == 2 * 256 * 2 * 2 * 2


def test_missing_field_is_named() -> None:
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        cap.kv_layout({"hidden_size": 10}, 1)


LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"num_hidden_layers": 10**30}, "num_hidden_layers"),
        ({"torch_dtype": ["bfloat16"]}, "torch_dtype"),
    ],
)
def test_garbage_model_fields_are_named(patch: dict, field: str) -> None:
    """Found by fuzzing: these printed a pool from nonsense (or a traceback, for the list)."""
    with pytest.raises(ModelConfigError, match=field):
        cap.kv_layout({**LLAMA_8B, **patch}, 1)


def test_null_kv_heads_and_head_dim_take_hfs_defaults() -> None:
    plain = cap.kv_layout(LLAMA_8B, 1).bytes_per_token
    nulls = {**LLAMA_8B, "num_key_value_heads": None, "head_dim": None}
    assert cap.kv_layout(nulls, 1).bytes_per_token == plain * 4  # kv heads = 32 heads


@pytest.mark.parametrize(
    ("gpu_mib", "tp", "expected"),
    [(81_559, 1, 0.835), (81_559, 8, 0.818), (143_771, 1, 0.907), (143_771, 8, 0.897)],
)
def test_default_mem_fraction_static(gpu_mib: int, tp: int, expected: float) -> None:
    assert default_mem_fraction_static(gpu_mib, tp) == expected


def test_pool_formula_and_page_rounding() -> None:
    free = 80 * cap.GIB
    tokens = cap.pool_tokens(0.8, free, 16 * cap.GIB, 131_072)
    assert tokens == int((0.8 * free - 16 * cap.GIB) // 131_072)
    assert cap.pool_tokens(0.8, free, 16 * cap.GIB, 131_072, page_size=64) % 64 == 0
    assert cap.pool_tokens(0.8, free, 16 * cap.GIB, 131_072, max_total_tokens=1000) == 1000
    assert cap.pool_tokens(0.1, free, 16 * cap.GIB, 131_072) <= 0  # "Not enough memory"


def test_calibration_is_affine_not_proportional() -> None:
    free = KIMI_GPU_MIB * cap.MIB
    fixed = cap.calibrate_fixed_bytes(116_171, 0.85, free, 70_272)
    assert cap.pool_tokens(0.85, free, fixed, 70_272) == 116_171
    at95 = cap.pool_tokens(0.95, free, fixed, 70_272)
    # +0.10 x free GPU memory / bytes per token, about +146k: far more than the 12% of a linear guess
    assert at95 - 116_171 == pytest.approx(0.10 * free / 70_272, abs=2)
    assert 255_000 < at95 < 265_000


def _kimi(**kw) -> dict:
    inputs = dict(
        model_config=load_model_config("kimi-k2.5"),
        tp=8,
        gpu_mem_mib=KIMI_GPU_MIB,
        observed_tokens=116_171,
        observed_mfs=0.85,
        observed_kv_gb=14.8,
        mfs=(0.95,),
        hicache_sizes_gb=(300,),
        host_ram_gb=449,
        avg_lens=(4000, 2000),
        naive=True,
    )
    inputs.update(kw)
    return analyze(CapacityInputs(**inputs))


def test_motivating_case_naive_numbers() -> None:
    naive = _kimi()["naive"]
    assert naive["bytes_per_token"] == 136_793
    assert naive["extra_tokens"] == 294_352
    assert naive["total_tokens"] == 410_523
    assert {r["avg_len"]: r["requests"] for r in naive["concurrent_requests"]} == {
        4000: 103,
        2000: 205,
    }
    (linear,) = naive["mfs_linear_tokens"]
    assert linear["tokens"] == 129_838 and linear["gain_pct"] == 11.8


def test_motivating_case_corrected_numbers() -> None:
    r = _kimi()
    assert r["bytes_per_token"] == 70_272
    assert r["observed"]["kv_gb"] == pytest.approx(8.16, abs=0.01)
    (h,) = r["hicache"]
    assert h["host_total_gb"] == 2400 and not h["feasible"]
    assert "2,400 GB" in h["reason"] and "449" in h["reason"]
    assert h["running_tokens"] == 116_171  # HiCache leaves the running limit unchanged
    p95 = next(p for p in r["projection"] if p["mfs"] == 0.95)
    assert (
        140_000 < p95["delta_tokens"] < 150_000 and 255_000 < p95["max_total_num_tokens"] < 265_000
    )
    assert "warning" in p95  # under 5 GiB left for CUDA graphs: only a measurement can tell
    assert r["hicache_max_gb_per_rank"] == 54


def test_hicache_rules() -> None:
    v = cap.hicache_verdict(1, 70_272, 116_171, 449 * cap.GB, ranks=8)
    assert not v.feasible and "not larger than the device pool" in v.reason
    v = cap.hicache_verdict(50, 70_272, 116_171, 449 * cap.GB, ranks=8)
    assert v.feasible and v.host_total_gb == 400
    v = cap.hicache_verdict(500, 70_272, 116_171, 449 * cap.GB, ranks=1)
    assert not v.feasible and "per rank exceeds" in v.reason
    assert cap.hicache_verdict(0, 70_272, 116_171, None).feasible


def test_admission_capped_by_running_limit() -> None:
    assert cap.admissible_requests(116_171, 4000, 2048) == 29
    assert cap.admissible_requests(1_000_000, 10, 64) == 64
    assert cap.max_running_requests(100_000, 131_072, 48) == 48
