"""An salloc that has not ended is not a refusal (server/allocation.py `_wait`): one granted,
whose job squeue lists a moment later, and one that has not yet called setsid (no group of its
pid). Seen under load on the fake Slurm: a study failed with "salloc refused the allocation:
salloc: Granted job allocation 4000"."""

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

    def cmdline(self, pid: int) -> str | None:
        return None

    def read_tail(self, path: str, n: int) -> Sequence[str]:
        return ["salloc: Pending job allocation 4000", "salloc: Granted job allocation 4000"]


class SlowSalloc(LaggingSlurm):
    """salloc started but has not called setsid yet (no group of its pid), has written nothing,
    and squeue does not know the job."""

    def __init__(self, lag: int):
        super().__init__(lag)
        self.log: list[str] = []

    def cmdline(self, pid: int) -> str | None:
        return "nohup setsid salloc --no-shell" if self.squeues < self.lag else None

    def read_tail(self, path: str, n: int) -> Sequence[str]:
        return self.log


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


def test_a_salloc_before_its_setsid_still_runs() -> None:
    host = SlowSalloc(lag=3)
    job = _allocation(host).ensure()
    assert job.id == "4000" and host.squeues == 3
