"""salloc exits once granted, and squeue may list the job a moment later: the grant in salloc's
log is not a refusal (server/allocation.py `_wait`). Seen under load on the fake Slurm: the
study failed with "salloc refused the allocation: salloc: Granted job allocation 4000"."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.config.slurm import SlurmSection
from tuner.hosts.base import CommandResult
from tuner.server.allocation import Allocation, LaunchShell


class LaggingSlurm:
    """A host whose salloc was granted and has exited, while squeue lists the job only from its
    `lag`-th call on."""

    name = "gpu-login"

    def __init__(self, lag: int):
        self.lag, self.squeues = lag, 0

    def run_shell(self, script: str, timeout: float | None = None, stdin: bytes | None = None):
        if "salloc" in script:
            return CommandResult(0, "4321\n", "")
        assert "squeue" in script, script
        self.squeues += 1
        listed = self.squeues >= self.lag
        return CommandResult(0, "4000|RUNNING|None|node1\n" if listed else "", "")

    def group_alive(self, pgid: int) -> bool:
        return False  # salloc exits once granted

    def read_tail(self, path: str, n: int) -> Sequence[str]:
        return ["salloc: Pending job allocation 4000", "salloc: Granted job allocation 4000"]


def _allocation(host: LaggingSlurm) -> Allocation:
    section = SlurmSection(partition="gpu", gpus=8, time="12:00:00", poll_s=1)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    return Allocation(
        LaunchShell(host), section, "tuner-x", "/tmp", clock=lambda: now[0], sleep=sleep
    )  # type: ignore[arg-type]


def test_a_grant_squeue_lists_late_is_waited_for_not_refused() -> None:
    host = LaggingSlurm(lag=4)  # adopt before salloc, then two polls that list nothing
    job = _allocation(host).ensure()
    assert job.id == "4000" and job.node == "node1" and host.squeues == 4
