"""Study files and the `tuner` entry point for end-to-end tests (real subprocesses, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers.net import free_port

REPO = Path(__file__).resolve().parents[2]


def study_file(tmp: Path, name: str = "e2e", n_trials: int = 5, **over: object) -> Path:
    """A copy of the demo, made small: short runs, a free port, its own name."""
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["study"] = name
    data["target"]["port"] = free_port()
    data["target"]["launch"] = [
        "{python}",
        "-m",
        "tuner.sim",
        "--sim-profile",
        "llama-3.1-8b-h100",
        "--sim-startup-seconds",
        "0.3",
    ]
    # the server's cwd and its log, pid and exit files: the test's own dir, not the host's /tmp
    data["target"]["workdir"] = str(tmp)
    data["workload"].update(input_len=256, output_len=48, duration_s=2.5, warmup_requests=1)
    data["objective"]["slo"]["p99_ttft_ms"] = 2000
    data["budget"].update(n_trials=n_trials, confirm_top=1, confirm_repeats=1)
    data["baseline"] = {"mem-fraction-static": 0.98, "concurrency": 16}  # certain CUDA-graph OOM
    # these tests follow one load run per trial (phases, kills, probes): concurrency sampled
    data["space"]["concurrency"]["search"] = "joint"
    # up to 64 streams, not 256: a study's load client sharing a busy 2-core machine with
    # another test keeps up (at ~120 streams its event loop lagged past the 250 ms that flags a
    # run as not trusted, and three such trials in a row halt a study)
    data["space"]["concurrency"].update(low=8, high=64)
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[section] = value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tuner(*args: str, timeout: float = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m tuner ARGS` (this checkout's tuner, from any `cwd`)."""
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def study_trials(study: Path, storage: str) -> list[dict]:
    """`tuner status STUDY --storage URL --json`'s trials (the study as every worker sees it)."""
    out = tuner("status", str(study), "--storage", storage, "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["trials"]
