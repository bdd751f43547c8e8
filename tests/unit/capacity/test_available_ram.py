"""The pre-check judges HiCache sizes by the host RAM available when the study starts."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from tuner.api import Events, judge_by_available_ram
from tuner.capacity import calculus as cap
from tuner.capacity.precheck import (
    HOST_RAM_MARGIN,
    Hardware,
    Knowledge,
    parse_meminfo,
    precheck,
    with_available_ram,
)
from tuner.errors import HostUnreachable
from tuner.hosts.base import CommandResult
from tuner.hosts.local import LocalHost
from tuner.server.target import Launch
from tuner.sim.virtual.study import launch_meminfo

GIB = 1024**3
SIM = Launch(("python", "-m", "tuner.sim", "--sim-profile", "x"), {})
REAL = Launch(("python3", "-m", "sglang.launch_server"), {})


def test_available_lowers_the_study_files_figure() -> None:
    hw = Hardware(bytes_per_token=70_272, host_ram_gb=449.0)
    got = with_available_ram(hw, total=449 * cap.GB, available=200 * cap.GB)
    assert got.host_ram_gb == 200 - HOST_RAM_MARGIN * 449
    # more available than the study file says: the file's figure stands
    said = Hardware(host_ram_gb=400.0)
    assert with_available_ram(said, 449 * cap.GB, 449 * cap.GB) == said
    # none stated: what is available is all that is known
    assert with_available_ram(Hardware(), 100 * cap.GB, 80 * cap.GB).host_ram_gb == 75.0


def test_a_size_that_fits_the_total_but_not_what_is_free_is_rejected() -> None:
    flags = {"model-path": "m", "tp-size": 8, "hicache-size": 40}  # 320 GB in all
    hw = Hardware(host_ram_gb=449.0)
    assert precheck(flags, hw, Knowledge()).feasible
    busy = with_available_ram(hw, total=449 * cap.GB, available=250 * cap.GB)
    verdict = precheck(flags, busy, Knowledge())
    assert not verdict.feasible and verdict.kind == "host_memory", verdict


@dataclass
class _Host:
    """A host whose /proc/meminfo says what the test needs (or that cannot be reached)."""

    meminfo: str | None

    def run(self, argv, *, timeout=None) -> CommandResult:
        assert list(argv) == ["cat", "/proc/meminfo"] and timeout
        if self.meminfo is None:
            raise HostUnreachable("connection refused")
        return CommandResult(0, self.meminfo, "")


def _seams(host, launch: Launch, host_ram_gb: float | None = 449.0, meminfo=None):
    runner = SimpleNamespace(hardware=Hardware(host_ram_gb=host_ram_gb))
    return SimpleNamespace(host=host, launch=launch, runner=runner, release=None, meminfo=meminfo)


def test_tune_reads_the_targets_meminfo_and_says_so() -> None:
    said: list[str] = []
    meminfo = f"MemTotal: {449 * 10**9 // 1024} kB\nMemAvailable: {300 * 10**9 // 1024} kB\n"
    seams = _seams(_Host(meminfo), REAL)
    judge_by_available_ram(seams, Events(on_message=said.append))
    assert abs(seams.runner.hardware.host_ram_gb - (300 - 0.05 * 449)) < 0.01
    assert len(said) == 1 and "300.0 GB of 449.0 GB available" in said[0], said


def test_the_simulators_host_is_its_profiles_not_this_machine() -> None:
    """Kimi's profile plays a host of 449 GB where other tenants hold 25: 424 GB available, less
    5% of the total, judges HiCache; 54 GB a rank for TP 8 (432 GB) is then rejected before a
    restart, as the simulated start fails ("Not enough host memory available")."""
    said: list[str] = []
    kimi = Launch(("python", "-m", "tuner.sim", "--sim-profile", "kimi-k2.5-tp8"), {})
    # the virtual seams' (sim/virtual/study.py): this machine's meminfo is never read
    seams = _seams(_Host(None), kimi, meminfo=lambda: launch_meminfo(kimi.template))
    judge_by_available_ram(seams, Events(on_message=said.append))
    assert seams.runner.hardware.host_ram_gb == pytest.approx(424 - 0.05 * 449)
    assert said == [
        "simulated host RAM: 424.0 GB of 449.0 GB available now; HiCache sizes are judged by "
        "401.6 GB (hardware.host_ram_gb 449)"
    ]
    flags = {"model-path": "m", "tp-size": 8}
    verdict = precheck({**flags, "hicache-size": 54}, seams.runner.hardware, Knowledge())
    assert not verdict.feasible and verdict.kind == "host_memory", verdict
    assert precheck({**flags, "hicache-size": 48}, seams.runner.hardware, Knowledge()).feasible


def test_not_for_an_unreadable_host_or_profile() -> None:
    for seams in (
        _seams(_Host("MemTotal: 1 kB\nMemAvailable: 1 kB\n"), SIM),  # the HTTP simulator's
        _seams(_Host(None), SIM, meminfo=lambda: launch_meminfo(SIM.template)),  # no profile "x"
        _seams(_Host(None), REAL),
    ):
        judge_by_available_ram(seams, Events())
        assert seams.runner.hardware.host_ram_gb == 449.0
    garbled = _seams(_Host("nothing useful"), REAL)
    judge_by_available_ram(garbled, Events())
    assert garbled.runner.hardware.host_ram_gb == 449.0


def test_this_machines_meminfo_through_a_real_local_host() -> None:
    host = LocalHost()
    try:
        info = parse_meminfo(host.run(["cat", "/proc/meminfo"], timeout=30).stdout)
        seams = _seams(host, REAL, host_ram_gb=10**6)  # more than any machine here has
        judge_by_available_ram(seams, Events())
    finally:
        host.close()
    usable = seams.runner.hardware.host_ram_gb
    assert 0 < usable < info["MemTotal"] / cap.GB
    assert usable <= info["MemTotal"] / GIB * 1.1  # bytes, not kB: a unit slip is 1024x off
