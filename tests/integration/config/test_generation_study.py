"""The seed's own job (search_spaces/kimi-k2.5-tp8-generation.yaml) rehearsed on the simulator.

Only `target` (and the draft's path, to the one the simulator's Kimi profile carries) changes;
the study runs in virtual time through the tuner's whole loop. What it exports, and the launch
config of every lever combination the file can propose, must pass both SGLang versions' parsers
(`--config` merged as each merges it, switches on the command line as best.yaml's header says)
and their post-init without a refusal.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tests.helpers.studies import REPO, tuner
from tuner.config.load import parse_study
from tuner.report.export import best_flags, render_yaml
from tuner.sglang.flags import KNOWN_VERSIONS
from tuner.sglang.postinit import Resolved, resolve
from tuner.sim.flags import parse_flags

FILE = REPO / "search_spaces" / "kimi-k2.5-tp8-generation.yaml"
DRAFT = "AQ-MedAI/Kimi-K25-eagle3"  # the simulator's Kimi profile's draft


def _virtual(tmp_path: Path) -> Path:
    data = yaml.safe_load(FILE.read_text())
    data["target"] = {
        "host": "local",
        "launch": ["{python}", "-m", "tuner.sim", "--sim-profile", "kimi-k2.5-tp8"],
        "port": 30000,
    }
    data["server"]["speculative-draft-model-path"] = DRAFT
    data["workload"]["duration_s"] = 60  # the flow, not the numbers: a shorter window
    study = tmp_path / FILE.name
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    return study


def _accepted(export: dict, version: str, tmp_path: Path) -> Resolved:
    """best.yaml rendered for `version`, launched as its header says through that version's
    parser and post-init: what it resolves to (fails on a parse error or a refusal)."""
    text = render_yaml({**export, "server": {**export["server"], "version": version}})
    use = next(line for line in text.splitlines() if "use: python -m sglang.launch_server" in line)
    cli = shlex.split(use.split("--config best.yaml", 1)[1])
    path = tmp_path / f"best-{version}.yaml"
    path.write_text(text)
    ns = parse_flags([*cli, "--config", str(path), "--sim-sglang-version", version])
    resolved = resolve(vars(ns), version)
    assert resolved.error is None, (version, resolved.error)
    return resolved


def test_the_generation_study_runs_and_exports_what_both_versions_accept(tmp_path: Path) -> None:
    study = _virtual(tmp_path)
    runs = tmp_path / "runs"
    common = [str(study), "--runs-dir", str(runs)]
    out = tuner("tune", *common, "--virtual", "--n-trials", "4", "--no-progress", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    exported = tuner("export", *common, "--format", "json", timeout=600)
    assert exported.returncode == 0, exported.stderr[-2000:]
    best = json.loads(exported.stdout)
    assert best["metrics"]["window_output_throughput"] > 0
    written = yaml.safe_load((runs / "kimi-k2.5-tp8-generation" / "best.yaml").read_text())
    assert written["model-path"] == "moonshotai/Kimi-K2.5"
    for version in KNOWN_VERSIONS:
        assert _accepted(best, version, tmp_path).flags["tp_size"] == 8


SHAPES = {
    "DP attention 8, EAGLE-3 tree": {
        "enable-dp-attention": True,
        "data-parallel-size": 8,
        "speculative-algorithm": "EAGLE3",
        "speculative-num-steps": 3,
        "speculative-eagle-topk": 2,
        "speculative-num-draft-tokens": 8,
    },
    "EAGLE-3 chain": {
        "enable-dp-attention": False,
        "speculative-algorithm": "EAGLE3",
        "speculative-num-steps": 2,
        "speculative-eagle-topk": 1,
    },
    "neither": {"enable-dp-attention": False, "speculative-algorithm": "none"},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_lever_shape_the_file_proposes_is_a_launch_both_versions_accept(
    tmp_path: Path, shape: str
) -> None:
    cfg = parse_study(yaml.safe_load(_virtual(tmp_path).read_text()), FILE.name)
    params = {
        "mem-fraction-static": 0.93,
        "hicache-size": 40,
        "cuda-graph-max-bs": 64,
        **SHAPES[shape],
        "concurrency": 256,
    }
    export = {
        "study": cfg.study,
        "trial": 0,
        "flags": best_flags(cfg, params),
        "client": {"concurrency": 256},
        "objective": cfg.objective.metric,
        "value": 1.0,
        "confirmation": {},
        "metrics": {},
        "server": {},
        "exported_at": "now",
    }
    spec = SHAPES[shape]["speculative-algorithm"] != "none"
    # "none" is the tuner's word for off: no speculative flag (not even the draft) is launched
    assert any(k.startswith("speculative") for k in export["flags"]) == spec
    for version in KNOWN_VERSIONS:
        resolved = _accepted(export, version, tmp_path)
        flags = resolved.flags
        assert (flags["speculative_algorithm"] is not None) == spec, version
        assert flags["hicache_size"] == 40 and flags["enable_hierarchical_cache"], version
        if SHAPES[shape].get("enable-dp-attention"):
            assert resolved.attn_dp_size == 8, version
