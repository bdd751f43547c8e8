"""`tuner check` on DP-attention and speculative studies: the far ends of the split (0.5.23's
`--attn-dp-size` too), the capacity reading with DP attention and an MTP draft, the draft model
paths the study can ask for."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.helpers.studies import REPO
from tuner.capacity.calculus import Parallel
from tuner.check.reading import capacity, capacity_inputs
from tuner.check.spacefacts import draft_paths, largest_parallel
from tuner.config.load import parse_study

MTP_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "num_nextn_predict_layers": 1,
    "torch_dtype": "bfloat16",
}


def demo(**server: object) -> dict:
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["server"].update(server)
    return data


def test_attn_dp_size_is_dp_attention() -> None:
    cfg = parse_study(demo(tp=8, **{"attn-dp-size": 8}))
    assert largest_parallel(cfg) == Parallel(tp=8, dp=8, dp_attention=True)
    assert largest_parallel(cfg).ranks == 8


def test_draft_paths_fixed_or_searched() -> None:
    cfg = parse_study(
        demo(**{"speculative-algorithm": "EAGLE3", "speculative-draft-model": "/m/draft"})
    )
    assert draft_paths(cfg) == ("server.speculative-draft-model", ["/m/draft"])
    data = demo(**{"speculative-algorithm": "EAGLE3"})
    data["space"]["speculative-draft-model-path"] = {"choices": ["/m/a", "org/b"]}
    assert draft_paths(parse_study(data)) == (
        "space.speculative-draft-model-path",
        ["/m/a", "org/b"],
    )
    assert draft_paths(parse_study(demo())) == (None, [])


def test_the_reading_counts_dp_attention_and_an_mtp_draft(tmp_path: Path) -> None:
    model = tmp_path / "config.json"
    model.write_text(json.dumps(MTP_CONFIG))
    data = demo(tp=8, dp=8, **{"enable-dp-attention": True, "speculative-algorithm": "NEXTN"})
    data["hardware"].update(model_config=str(model), weights_gib=60, gpu_mem_mib=143_771)
    data["server"]["model-path"] = "/models/dsv3"
    cfg = parse_study(data)
    inputs = capacity_inputs(cfg, MTP_CONFIG)
    assert inputs.dp_attention and inputs.dp == 8 and inputs.draft is not None
    line = capacity(cfg)
    assert "with DP attention (8 groups)" in line.detail
    assert "71,424 B/token/rank" in line.detail  # 70,272 + the MTP layer's 1,152 (0.5.23)
