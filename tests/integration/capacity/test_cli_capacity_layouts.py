"""`tuner capacity` with DP attention and a speculative draft, through the real console entry
point: the seed case (Kimi-K2.5, TP 8, 97,887 MiB GPUs, 449 GB of host RAM) read as it ran and
with `--dp-attention --dp 8` and an EAGLE-3 draft of one layer (0.5 GiB per GPU assumed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.studies import tuner

SEED = [
    *("--model-config", "kimi-k2.5", "--tp", "8", "--gpu-mem-mib", "97887"),
    *("--observed-tokens", "116171", "--observed-mfs", "0.85", "--mfs", "0.90", "--mfs", "0.95"),
    *("--hicache-size", "40", "--hicache-size", "300", "--host-ram-gb", "449"),
    *("--avg-len", "4000", "--avg-len", "2000"),
]
DP8 = ["--dp", "8", "--dp-attention"]
EAGLE3 = [
    *("--draft-layers", "1", "--draft-weights-gib", "0.5"),
    *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
]


def reading(*args: str) -> dict:
    out = tuner("capacity", *SEED, *args, "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_dp_attention_counts_gpus_ranks_and_groups() -> None:
    r = reading(*DP8)
    assert (r["gpus"], r["parallel"]["ranks"], r["parallel"]["attn_tp"]) == (8, 8, 1)
    hicache = {h["hicache_size_gb_per_rank"]: h for h in r["hicache"]}
    assert hicache[40]["feasible"] and hicache[40]["host_total_gb"] == 320
    assert not hicache[300]["feasible"]
    assert r["hicache_max_gb_per_rank"] == 54
    observed = {p["mfs"]: p for p in r["projection"]}[0.85]
    assert observed["max_total_num_tokens"] == 116_171  # the pool of a DP-attention server
    assert [a["requests_total"] for a in observed["admissible"]] == [8 * 29, 8 * 58]
    plain = reading(*DP8, "--plain-basis")  # the pool was a plain TP server's
    assert {p["mfs"]: p["max_total_num_tokens"] for p in plain["projection"]}[0.85] == 0
    assert (
        plain["dp_attention_weights"]["added"]
        and plain["sglang_defaults"]["mem_fraction_static"] == 0.66
    )


def test_a_draft_in_the_reading() -> None:
    r = reading(*EAGLE3, "--plain-basis")
    s = r["speculative"]
    assert r["bytes_per_token"] == 71_424 and s["draft_bytes_per_token"] == 1_152
    assert (s["num_steps"], s["eagle_topk"], s["num_draft_tokens"]) == (3, 1, 4)
    assert s["max_running_requests_flag"] == 48 and s["max_running_requests_reset"]
    assert s["extra_slots_per_request"] == 8 and s["sglang_0_5_6"]["extra_pool_tokens"] == 436
    assert s["cuda_graphs"]["max_bs"] == 48 and s["cuda_graphs"]["max_tokens"] == 192
    assert all(p["max_running_requests"] == 48 for p in r["projection"])
    assert all("sglang_0_5_6" in p for p in r["projection"])
    both = reading(*DP8, *EAGLE3, "--plain-basis")
    row = {p["mfs"]: p for p in both["projection"]}[0.95]
    assert (row["max_running_requests"], row["max_running_requests_total"]) == (6, 48)


def test_the_tables_show_groups_and_the_draft() -> None:
    out = tuner("capacity", *SEED, *DP8, *EAGLE3, "--plain-basis", timeout=60)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for fragment in (
        "with DP attention (8 groups)",
        "6/48",
        "Speculative decoding",
        "70,272 + 1,152",
        "resets it to 48",
        "2,048 MiB",
        "0.5.6.post2's pool",
    ):
        assert fragment in text, fragment


def test_a_draft_config_gives_its_layers(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 7168,
                "num_hidden_layers": 1,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "torch_dtype": "bfloat16",
            }
        )
    )
    r = reading("--draft-model-config", str(draft), "--plain-basis")
    s = r["speculative"]
    assert s["draft_layers"] == 1 and "config" in s["draft_layers_from"]
    # 0.5.6.post2's own draft pool: 8 KV heads // TP 8 x 128 x 1 layer x 2 x 2 B
    assert s["sglang_0_5_6"]["draft_pool_bytes_per_token"] == 512


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dp", "3", "--dp-attention"], "divide"),
        (["--speculative-num-steps", "3"], "need a draft"),
        (["--plain-basis"], "--dp-attention or a draft"),
        ([*DP8, "--speculative-algorithm", "STANDALONE"], "STANDALONE"),
        (["--draft-layers", "1", "--speculative-eagle-topk", "2"], "--speculative-num-steps"),
        (["--draft-layers", "0"], "--draft-layers"),
        (["--dp-attention-extra-gib", "2"], "add --dp-attention"),
        (["--speculative-algorithm", "NEXTN"], "num_nextn_predict_layers"),
    ],
)
def test_layout_mistakes_are_one_line_exit_2(args: list[str], fragment: str) -> None:
    out = tuner("capacity", *SEED, *args, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr
