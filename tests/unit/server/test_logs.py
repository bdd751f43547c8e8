"""HostLogs: which server files on the host are removed, and when (pure logic, a fake host)."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.errors import HostUnreachable
from tuner.server.logs import HostLogs


class Host:
    name = "fake"

    def __init__(self, fail: bool = False) -> None:
        self.removed: list[str] = []
        self.fail = fail

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> None:
        assert list(argv[:3]) == ["rm", "-f", "--"]
        if self.fail:
            raise HostUnreachable("fake: down")
        self.removed += argv[3:]


def test_a_gone_server_s_files_stay_until_the_sweep_then_all_three_go() -> None:
    host = Host()
    logs = HostLogs(host, keep=False)  # type: ignore[arg-type]
    logs.gone("/tmp/a.log")
    assert logs.last == "/tmp/a.log" and host.removed == []  # still to be fetched
    logs.gone("/tmp/b.log")
    logs.sweep()
    assert host.removed == [
        "/tmp/a.log",
        "/tmp/a.log.pid",
        "/tmp/a.log.exit",
        "/tmp/b.log",
        "/tmp/b.log.pid",
        "/tmp/b.log.exit",
    ]
    assert logs.last is None  # nothing left to fetch
    logs.sweep()
    assert len(host.removed) == 6  # each file once


def test_logs_in_a_workdir_are_kept_and_an_unknown_log_is_never_a_path() -> None:
    host = Host()
    kept = HostLogs(host, keep=True)  # type: ignore[arg-type]
    kept.gone("/var/tmp/tuner/a.log")
    assert kept.last == "/var/tmp/tuner/a.log"
    kept.sweep()
    assert host.removed == [] and kept.last is None
    adopted = HostLogs(host, keep=False)  # type: ignore[arg-type]
    adopted.gone("")  # a server adopted from an earlier run: "", not ".pid" in the cwd
    adopted.sweep()
    assert host.removed == [] and adopted.last is None


def test_a_host_that_fails_the_removal_costs_a_warning_not_the_study(caplog) -> None:
    logs = HostLogs(Host(fail=True), keep=False)  # type: ignore[arg-type]
    logs.gone("/tmp/a.log")
    logs.sweep()
    assert "cannot remove /tmp/a.log" in caplog.text


def test_a_long_studys_files_are_removed_in_short_commands() -> None:
    from tuner.server.logs import RM_BATCH

    calls: list[int] = []

    class Counting(Host):
        def run(self, argv: Sequence[str], *, timeout: float | None = None) -> None:
            calls.append(len(argv) - 3)
            super().run(argv, timeout=timeout)

    host = Counting()
    logs = HostLogs(host, keep=False)  # type: ignore[arg-type]
    for n in range(250):
        logs.gone(f"/tmp/t{n}.log", also=(".sh", ".secrets.yaml"))  # 5 files each
    logs.sweep()
    assert (
        len(host.removed) == 1250 and max(calls) <= RM_BATCH and len(calls) == -(-1250 // RM_BATCH)
    )
    assert "/tmp/t7.log.sh" in host.removed and "/tmp/t7.log.secrets.yaml" in host.removed
