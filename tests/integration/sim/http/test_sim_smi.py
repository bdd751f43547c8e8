"""The simulated nvidia-smi against a real simulator process: what a GPU host's nvidia-smi shows
of a serving SGLang (its memory plan, the largest prefill's activations until a flush, its pid)
and nothing once it is gone, whether it drained or was killed."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.helpers.played import post
from tests.helpers.simproc import SimProc, sim_server
from tuner.sim.flags import parse_flags
from tuner.sim.gpustate import state_path
from tuner.sim.profile import load_profile
from tuner.sim.startup import build_script

pytestmark = pytest.mark.slow

PROFILE = "llama-3.1-8b-h100"
MFS = "0.85"


def smi(port: int, *query: str) -> list[str]:
    cmd = [sys.executable, "-m", "tuner.sim.smi", "--sim-profile", PROFILE, "--sim-port", str(port)]
    out = subprocess.run(
        [*cmd, *query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.splitlines()


def used(port: int) -> float:
    (row,) = smi(port, "--query-gpu=memory.used,memory.total")
    return float(row.split(",")[0])


def pids(port: int) -> list[int]:
    return [int(x) for x in smi(port, "--query-compute-apps=pid")]


def placed_mib() -> float:
    """What start-up placed on the GPU (the memory plan), before any prefill's activations."""
    ns = parse_flags(["--model-path", "m", "--sim-profile", PROFILE, "--mem-fraction-static", MFS])
    profile = load_profile(PROFILE)
    plan = build_script(ns, profile).plan
    assert plan is not None
    return profile.gpu_mem_mib - plan.available_gpu_mem_gib * 1024


def test_smi_reads_the_plan_the_largest_prefill_and_a_flush() -> None:
    with sim_server("--sim-profile", PROFILE, "--mem-fraction-static", MFS) as sim:
        assert pids(sim.port) == [sim.popen.pid]
        after_warmup = used(sim.port)
        assert placed_mib() < after_warmup < placed_mib() + 1024  # the warm-up's small prefill
        status, _ = post(
            sim,
            "/generate",
            {"input_ids": list(range(8000)), "sampling_params": {"max_new_tokens": 1}},
        )
        assert status == 200
        big = used(sim.port)
        # activations grow with the batch's new tokens (the profile: 0.25 MiB a token)
        assert big - after_warmup >= 0.25 * 6000
        assert post(sim, "/flush_cache", {})[0] == 200
        assert used(sim.port) == pytest.approx(placed_mib(), abs=1)  # PyTorch's cache emptied
        sim.signal(signal.SIGTERM)
        assert sim.wait(30) == 0
        assert pids(sim.port) == [] and used(sim.port) == 0
        assert not state_path(sim.port).exists()


def test_a_killed_simulator_holds_nothing() -> None:
    proc = SimProc.start(["--sim-profile", PROFILE])
    try:
        proc.wait_ready()
        assert pids(proc.port) == [proc.popen.pid]
        proc.signal(signal.SIGKILL)
        proc.wait(30)
        assert state_path(proc.port).exists()  # nobody removed it: its pid is gone
        assert pids(proc.port) == [] and used(proc.port) == 0
        with sim_server("--sim-profile", PROFILE):  # the next simulator sweeps it
            assert not state_path(proc.port).exists()
    finally:
        proc.kill()
        state_path(proc.port).unlink(missing_ok=True)
