"""The simulated nvidia-smi (sim/smi.py) and the state it reads (sim/gpustate.py): nvidia-smi's
CSV for the queries the tuner asks, a serving simulator's file, a dead or zombie one ignored."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tuner.server.gpus import gpu_memory_of
from tuner.server.target import Launch
from tuner.sim import smi
from tuner.sim.flags import parse_flags
from tuner.sim.gpustate import (
    GpuState,
    read_state,
    remove_state,
    state_path,
    sweep_stale,
    write_state,
)
from tuner.sim.http.gpumeter import GpuMeter
from tuner.sim.memplan import smi_used_mib
from tuner.sim.profile import load_profile
from tuner.sim.startup import build_script

H100 = load_profile("llama-3.1-8b-h100")
KIMI = load_profile("kimi-k2.5-tp8")


@pytest.fixture(autouse=True)
def own_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's simulators publish into its own temp dir (gpustate's directory lives there)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_gpu_rows_in_nvidia_smis_csv_forms() -> None:
    state = GpuState(pid=123, gpus=1, used_mib=72005.6)
    q = "--query-gpu=name,memory.used,memory.total"
    assert smi.answer([q, "--format=csv,noheader,nounits"], H100, state) == [
        "NVIDIA H100 80GB HBM3, 72006, 81559"
    ]
    assert smi.answer([q, "--format=csv"], H100, state) == [
        "name, memory.used [MiB], memory.total [MiB]",
        "NVIDIA H100 80GB HBM3, 72006 MiB, 81559 MiB",
    ]
    # what server/gpus.py makes of it: the reading the edge probe's ceiling is computed from
    rows = smi.answer(
        ["--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"], H100, state
    )
    assert gpu_memory_of("\n".join(rows)).used_mib == 72006.0  # type: ignore[union-attr]


def test_a_tp8_host_lists_eight_gpus_and_nothing_used_without_a_server() -> None:
    q = ["--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits"]
    idle = smi.answer(q, KIMI, None)
    assert len(idle) == 8 and all(r.endswith(f", 0, {KIMI.gpu_mem_mib:.0f}") for r in idle)
    busy = smi.answer(q, KIMI, GpuState(pid=7, gpus=8, used_mib=90000.0))
    assert busy[7] == f"7, 90000, {KIMI.gpu_mem_mib - 90000:.0f}"


def test_compute_apps_list_the_server_per_gpu_and_nothing_once_it_is_gone() -> None:
    q = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    assert smi.answer(q, KIMI, GpuState(pid=4242, gpus=2, used_mib=500.0)) == [
        "4242, 500",
        "4242, 500",
    ]
    assert smi.answer(q, KIMI, None) == []


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--query-gpu=memory.bogus", "--format=csv"], 'Field "memory.bogus" is not a valid'),
        (["--query-compute-apps=name", "--format=csv"], 'Field "name" is not a valid'),
        (["--format=csv"], "Invalid combination"),
        (["--query-gpu=name", "--query-compute-apps=pid"], "Invalid combination"),
        (["--query-gpu=name", "--format=xml"], "not a valid format"),
        (["--query-gpu=name", "-L"], "Invalid combination"),
    ],
)
def test_queries_nvidia_smi_refuses_are_refused(argv: list[str], why: str) -> None:
    with pytest.raises(smi.UsageError, match=why):
        smi.answer(argv, H100, None)


def test_the_command_line_one_line_and_exit_2_on_mistakes(capsys: pytest.CaptureFixture) -> None:
    assert smi.main(["--query-gpu=name", "--format=csv"]) == 2  # no --sim-port
    assert smi.main(["--sim-port", "1", "--sim-profile", "no-such", "--query-gpu=name"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no-such" in err[1]
    assert smi.main(["--sim-port", "1", "--query-gpu=name", "--format=csv,noheader"]) == 0
    assert capsys.readouterr().out == "NVIDIA H100 80GB HBM3\n"  # the default profile's GPU


def test_state_round_trip_and_only_its_own_process_removes_it() -> None:
    write_state(30123, GpuState(os.getpid(), 1, 1000.0))
    assert read_state(30123) == GpuState(os.getpid(), 1, 1000.0)
    remove_state(30123, os.getpid() + 1)  # another process (a newer server on the port)
    assert read_state(30123) is not None
    remove_state(30123, os.getpid())
    assert read_state(30123) is None and not state_path(30123).exists()


def test_a_dead_or_zombie_simulators_state_is_ignored() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        _wait_exit(child.pid)  # exited, not reaped: a zombie holds no GPU memory
        write_state(30124, GpuState(child.pid, 1, 1000.0))
        assert read_state(30124) is None
        assert read_state(30124, alive_only=False) is not None
    finally:
        child.wait()
    assert read_state(30124) is None  # reaped: gone
    write_state(30125, GpuState(os.getpid(), 1, 1000.0))  # a live one stays
    assert sweep_stale() == 1
    assert not state_path(30124).exists() and state_path(30125).exists()
    state_path(30124).write_text("{not json")
    assert read_state(30124) is None


def test_a_simulator_launch_reads_its_own_smi_and_a_real_one_nvidia_smi() -> None:
    sim = Launch(("/venv/bin/python", "-m", "tuner.sim", "--sim-profile", "kimi-k2.5-tp8"), {})
    assert sim.nvidia_smi(30001) == (
        "/venv/bin/python",
        "-m",
        "tuner.sim.smi",
        "--sim-profile",
        "kimi-k2.5-tp8",
        "--sim-port",
        "30001",
    )
    default = Launch(("python3", "-m", "tuner.sim"), {})
    assert default.nvidia_smi(5) == ("python3", "-m", "tuner.sim.smi", "--sim-port", "5")
    real = Launch(("python", "-m", "sglang.launch_server"), {})
    assert real.nvidia_smi(30000) == ("nvidia-smi",)


def _wait_exit(pid: int) -> None:
    """Until `pid` is a zombie (it exited; nobody reaped it yet)."""
    for _ in range(500):
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError(f"{pid} did not exit")


def test_the_meter_writes_when_the_peak_moves_and_retries_a_failed_write(tmp_path: Path) -> None:
    ns = parse_flags(["--model-path", "m", "--sim-profile", "llama-3.1-8b-h100"])
    plan = build_script(ns, H100).plan
    assert plan is not None
    meter = GpuMeter(30126, H100, plan, 1)
    meter.note(0)
    placed = read_state(30126)
    assert placed is not None and placed.used_mib == round(smi_used_mib(H100, plan, 0), 1)
    blocked = state_path(30126).parent
    meter.close()
    blocked.rmdir()
    blocked.write_text("a file where the directory goes")  # every write fails now
    meter.note(4000)
    blocked.unlink()
    meter.note(4000)  # the same peak: written now, not skipped as already published
    got = read_state(30126)
    assert got is not None and got.used_mib == round(smi_used_mib(H100, plan, 4000), 1)
    assert got.used_mib > placed.used_mib
    meter.close()
    assert read_state(30126, alive_only=False) is None
