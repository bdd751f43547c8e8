"""The demo study finds a configuration within 10% of the brute-force optimum.

The study runs the tuner's whole loop on the demo file as shipped (only the port and runs dir
changed) in virtual time (`tuner tune --virtual`: the same loop with the server and load seams on
the simulator's engine; test_virtual_study.py proves those seams agree with the HTTP path, and
test_study_e2e.py runs the demo over HTTP). The optimum is the best feasible cell of a grid over
the demo's whole search space, scored in the engine's virtual time, and the study's winner is
scored the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.net import free_port
from tests.helpers.studies import REPO, tuner
from tuner.api import study_requests
from tuner.config.load import load_study
from tuner.sim.engine import SimRequest
from tuner.sim.virtual.trial import virtual_trial


def grid(low: float, high: float, n: int) -> list[int]:
    """About n integers spread evenly on a log scale from low to high (both included)."""
    return sorted({round(low * (high / low) ** (i / (n - 1))) for i in range(n)})


@pytest.mark.slow
def test_demo_best_within_10pct_of_brute_force(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["target"]["port"] = free_port()
    study = tmp_path / "demo-sim.yaml"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    runs = tmp_path / "runs"
    out = tuner(
        "tune", str(study), "--runs-dir", str(runs), "--no-progress", "--virtual", timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # the demo's 6 s windows finish under two requests per stream: said once, with a length
    assert out.stderr.count("workload.duration_s 6 s is short") == 1, out.stderr[-3000:]
    exported = tuner("export", str(study), "--runs-dir", str(runs), "--format", "json", timeout=60)
    best = json.loads(exported.stdout)

    cfg = load_study(study)
    profile = cfg.target.launch[cfg.target.launch.index("--sim-profile") + 1]
    requests = [SimRequest(tuple(r.token_ids), r.output_len) for r in study_requests(cfg)]
    duration, slo = cfg.workload.duration_s, cfg.objective.slo.p99_ttft_ms
    mfs_space, conc_space = cfg.space["mem-fraction-static"], cfg.space["concurrency"]

    def score(mfs: float, concurrency: int) -> float:
        flags = {**cfg.server, "mem-fraction-static": round(mfs, 2)}
        v = virtual_trial(profile, flags, concurrency, requests, duration, slo)
        return v.output_throughput if v.feasible else 0.0

    steps = round((mfs_space.high - mfs_space.low) / mfs_space.step)
    optimum = max(
        score(mfs_space.low + i * mfs_space.step, c)
        for i in range(steps + 1)
        for c in grid(conc_space.low, conc_space.high, 24)
    )
    found = score(best["params"]["mem-fraction-static"], best["params"]["concurrency"])
    print(
        f"demo: best {best['params']} scores {found:,.0f} tok/s in virtual time; "
        f"brute-force optimum {optimum:,.0f}; ratio {found / optimum:.2f}"
    )
    assert optimum > 0
    assert found >= 0.9 * optimum
