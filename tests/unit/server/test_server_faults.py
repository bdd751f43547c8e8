"""Server fault paths on a scripted host and a fake clock (no processes, no waiting)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tuner.config.target import Timeouts
from tuner.errors import CommandTimeout, HostUnreachable, InfraError
from tuner.hosts import CommandResult
from tuner.server.lifecycle import Server

T = Timeouts(ready_s=10, stop_s=3, port_free_s=2, gpu_free_s=4, poll_s=0.5, http_s=1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class ScriptedHost:
    """A host whose groups die (or not) as the test says; records the signals it got."""

    name = "fake"
    address = "127.0.0.1"

    def __init__(
        self,
        *,
        dies_on: str | None = "TERM",
        leader: str = "bash -c ( python -m x ); echo",
        gpu_pids: Sequence[str] = (),
        drops: Exception | None = None,
    ) -> None:
        self.dies_on, self.leader, self.gpu_pids = dies_on, leader, list(gpu_pids)
        self.alive = True
        self.signals: list[str] = []
        self.drops = drops  # raised by the next signal, as a dropped connection would

    def signal_group(self, pgid: int, signal: str) -> bool:
        if self.drops is not None:
            exc, self.drops = self.drops, None
            raise exc
        self.signals.append(signal)
        if signal == self.dies_on or (signal == "KILL" and self.dies_on == "TERM"):
            self.alive = False
        return True

    def group_alive(self, pgid: int) -> bool:
        return self.alive

    def group_pids(self, pgid: int) -> list[int]:
        return [pgid, pgid + 1] if self.alive else []

    def cmdline(self, pid: int) -> str | None:
        return self.leader if self.alive else None

    def which(self, command: str) -> str | None:
        return "/usr/bin/nvidia-smi"

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        if "--query-gpu=name,memory.total" in argv:
            return CommandResult(0, "NVIDIA H100 80GB HBM3, 81559\n", "")
        return CommandResult(0, "".join(f"{p}\n" for p in self.gpu_pids), "")


def server(host: ScriptedHost) -> tuple[Server, FakeClock]:
    clock = FakeClock()
    s = Server(host, T, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    s.adopt(100, "python -m x", "/tmp/log", 30000)
    return s, clock


def test_stop_terms_then_waits_for_gpu_release() -> None:
    host = ScriptedHost()
    s, _ = server(host)
    s.stop()
    assert host.signals == ["TERM", "CONT"]  # CONT: a stopped group gets TERM only then
    assert s.pgid is None


def test_stop_escalates_to_kill_after_stop_s() -> None:
    host = ScriptedHost(dies_on="KILL")
    s, clock = server(host)
    s.stop()
    assert host.signals == ["TERM", "CONT", "KILL"]
    assert clock.now >= T.stop_s


def test_a_group_that_survives_kill_is_an_infra_error() -> None:
    host = ScriptedHost(dies_on=None)
    s, _ = server(host)
    with pytest.raises(InfraError, match="survived SIGKILL"):
        s.stop()


def test_reused_pid_is_left_alone() -> None:
    host = ScriptedHost(leader="postgres: writer")
    s, _ = server(host)
    s.stop()
    assert host.signals == []


def test_gpu_memory_still_held_is_an_infra_error() -> None:
    host = ScriptedHost(gpu_pids=["101"])  # a child of the stopped server still holds memory
    s, clock = server(host)
    with pytest.raises(InfraError, match=r"GPU memory .* not released after 4 s"):
        s.stop()
    assert clock.now >= T.gpu_free_s
    assert s.gpus()[0].memory_total_mib == 81559


def test_other_tenants_on_the_gpu_do_not_block() -> None:
    host = ScriptedHost(gpu_pids=["4242"])
    s, _ = server(host)
    s.stop()
    assert host.signals == ["TERM", "CONT"]


@pytest.mark.parametrize(
    "drop", [HostUnreachable("ssh: connection dropped"), CommandTimeout("ssh: deadline")]
)
def test_a_stop_whose_connection_drops_keeps_the_record(drop: InfraError) -> None:
    host = ScriptedHost(drops=drop)
    s, _ = server(host)
    with pytest.raises(type(drop)):
        s.stop()
    assert s.pgid == 100 and host.alive  # still known: the next stop finds it
    s.stop()
    assert s.pgid is None and not host.alive


def test_a_group_that_survives_kill_keeps_its_record() -> None:
    host = ScriptedHost(dies_on=None)
    s, _ = server(host)
    with pytest.raises(InfraError):
        s.stop()
    assert s.pgid == 100


def test_strays_need_a_marker() -> None:
    s, _ = server(ScriptedHost())
    assert s.stop_strays() == []  # without a marker there is nothing to look for
