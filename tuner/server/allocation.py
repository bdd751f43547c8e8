"""The Slurm allocation a study holds for the night, on the login node (`target.host`).

One allocation per study and worker, named after the worker's marker (`server.slurm.job_name`):
made once by `salloc --no-shell` (in the background, so that the wait has a deadline and
Slurm's reason while pending), found again by that name after a kill, reused while it is
RUNNING, replaced by a new request when Slurm ended it (a node failure, a preemption, its
walltime), and cancelled (`scancel JOBID`, by its id) when the study ends. An allocation still
PENDING after `target.slurm.pending_s` is the world's failure: its request is cancelled and
the error carries squeue's reason (`Resources`, `Priority`, `QOSMaxGRESPerUser`, ...).
salloc's own refusal of the request (an unknown partition or account, a GRES no node has) is
the user's: SetupError naming salloc's line.

Every command runs with the launch's environment (target.env: the PATH that finds Slurm's
commands) sourced from stdin (`LaunchShell`), every value quoted.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping

from tuner.config.slurm import SlurmSection
from tuner.errors import InfraError, SetupError
from tuner.hosts.base import GROUP_WAIT, CommandResult, Host
from tuner.server.slurm import (
    USABLE,
    WAITING,
    Job,
    job_argv,
    jobs_argv,
    parse_jobs,
    pick,
    salloc_argv,
    salloc_granted,
    salloc_refusal,
    scancel_argv,
    shell,
)

log = logging.getLogger(__name__)

#: scancel's word for a job that ended already (or that slurmctld no longer keeps)
_ENDED = re.compile(r"already completing or completed|invalid job id", re.I)
#: salloc's output, next to the study's server logs in target.workdir
SALLOC_LOG = "{workdir}/{name}.salloc.log"


class LaunchShell:
    """The host's shell with the launch environment sourced from stdin (values never in argv)."""

    def __init__(self, host: Host, env: Mapping[str, str] | None = None):
        self.host = host
        self.env = dict(env or {})

    def run(self, script: str, timeout: float | None = None) -> CommandResult:
        if not self.env:
            return self.host.run_shell(script, timeout=timeout)
        exports = "".join(
            f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(self.env.items())
        )
        return self.host.run_shell(
            f". /dev/stdin && {script}", timeout=timeout, stdin=exports.encode()
        )


class Allocation:
    """The study's allocation named `name` (`job` once known; `node` where its steps run)."""

    def __init__(
        self,
        shell_: LaunchShell,
        section: SlurmSection,
        name: str,
        workdir: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.shell = shell_
        self.host = shell_.host
        self.section = section
        self.name = name
        self.log_path = SALLOC_LOG.format(workdir=workdir.rstrip("/") or "", name=name)
        self.job: Job | None = None
        self._salloc: int | None = None  # the pid of the salloc this run started
        self._clock, self._sleep = clock, sleep

    @property
    def node(self) -> str | None:
        """The node the allocation's steps run on (None before it runs)."""
        return self.job.node if self.job is not None and self.job.state in USABLE else None

    def adopt(self) -> Job | None:
        """Find a live allocation of ours by its name (a killed run's), without asking for one."""
        self.job = pick(self._jobs(), self.job.id if self.job else None)
        return self.job

    def ensure(self, limit_s: float | None = None) -> Job:
        """The RUNNING allocation: ours if it still runs, else one of our name, else a new one
        (salloc); waits at most `limit_s` (default `pending_s`) for it to run. InfraError when
        it does not (the request cancelled, Slurm's reason said), SetupError when salloc
        refuses the request."""
        job = self.state() if self.job is not None else None
        if job is not None and job.state in USABLE and job.node:
            self.job = job
            return job
        if self.job is not None and (job is None or job.state not in USABLE | WAITING):
            log.warning(
                "%s: Slurm allocation %s ended (%s); asking for a new one",
                self.host.name,
                self.job.id,
                job.describe() if job else "gone",
            )
            self.job = None
        if job is None or job.state not in WAITING:
            job = self.adopt()
        if job is None:
            self._submit()
        return self._wait(self.section.pending_s if limit_s is None else limit_s)

    def state(self) -> Job | None:
        """Our job as squeue sees it now (any state), None when it is gone."""
        if self.job is None:
            return None
        res = self.shell.run(shell(job_argv(self.job.id)))
        if not res.ok and "invalid job id" not in (res.stderr + res.stdout).lower():
            raise InfraError(
                f"{self.host.name}: squeue failed (exit {res.exit_code}): {_said(res)}"
            )
        return next((j for j in parse_jobs(res.stdout) if j.id == self.job.id), None)

    def release(self) -> None:
        """Cancel our allocation (by its id) and a request of ours still waiting; the study
        ended. Its steps end with it."""
        job, self.job = self.job, None
        if job is not None:
            res = self.shell.run(shell(scancel_argv(job.id)))
            if not res.ok and not _ENDED.search(_said(res)):
                raise InfraError(f"{self.host.name}: scancel {job.id} failed: {_said(res)}")
            log.info("%s: released Slurm allocation %s", self.host.name, job.id)
        self._stop_salloc()

    # -- steps --------------------------------------------------------------------------------

    def _jobs(self) -> list[Job]:
        res = self.shell.run(shell(jobs_argv(self.name)))
        if not res.ok:
            raise InfraError(
                f"{self.host.name}: squeue failed (exit {res.exit_code}): {_said(res)}"
            )
        return parse_jobs(res.stdout)

    def _submit(self) -> None:
        """salloc in the background (its own session, output to its log): it waits in the
        queue while this run polls squeue, and exits once the allocation is granted."""
        argv = salloc_argv(self.section, self.name)
        log_q = shlex.quote(self.log_path)
        # the pid once it leads its group (as the detached server launch waits for it), so the
        # group can be polled and signalled at once
        script = (
            f"umask 077; nohup setsid {shell(argv)} > {log_q} 2>&1 < /dev/null & "
            f"p=$!; {GROUP_WAIT}; echo $p"
        )
        res = self.shell.run(script)
        pid = res.stdout.strip().splitlines()[-1:] if res.ok else []
        if not pid or not pid[0].isdigit():
            raise InfraError(f"{self.host.name}: cannot start salloc: {_said(res)}")
        self._salloc = int(pid[0])
        log.info("%s: asked Slurm for an allocation: %s", self.host.name, shell(argv))

    def _wait(self, limit_s: float) -> Job:
        """Poll until our allocation runs on a node; the deadline cancels the request."""
        deadline = self._clock() + limit_s
        waits = _waits(self.section.poll_s)
        asked = self._salloc is not None  # this run's salloc (else a killed run's request)
        while True:
            # salloc's life first: one that ended before squeue answered left its job listed
            running = self._salloc_alive()
            job = self.adopt()
            if job is not None and job.state in USABLE and job.node:
                self._salloc = None  # salloc exits once granted
                return job
            if job is None and not asked:
                raise InfraError(
                    f"{self.host.name}: the pending Slurm allocation {self.name} is gone "
                    "(cancelled outside the tuner?)"
                )
            # granted, and squeue does not list it yet: not a refusal, polled to the deadline
            if job is None and not running and not self._granted():
                self._refused()
            if self._clock() > deadline:
                self._give_up(job, limit_s)
            self._sleep(next(waits))

    def _granted(self) -> bool:
        return salloc_granted(self.host.read_tail(self.log_path, 20)) is not None

    def _refused(self) -> None:
        """salloc ended and no job of ours is live: its last error line says why."""
        lines = self.host.read_tail(self.log_path, 20)
        self._salloc = None
        users, line = salloc_refusal(lines)
        if users:
            raise SetupError(
                f"target.slurm: salloc refused the allocation on {self.host.name}: {line[:200]}; "
                "check target.slurm (partition, account, gpus, time, options)"
            )
        raise InfraError(f"{self.host.name}: salloc failed: {line[:200]}")

    def _give_up(self, job: Job | None, limit_s: float) -> None:
        """Past the deadline: cancel the request, the world's failure with Slurm's reason."""
        why = job.describe() if job is not None else "no job listed by squeue yet"
        self.release()
        raise InfraError(
            f"{self.host.name}: Slurm allocation {self.name} not running after {limit_s:g} s "
            f"(target.slurm.pending_s): {why}; request cancelled"
        )

    def _salloc_alive(self) -> bool:
        """salloc still runs: its group, or its process before setsid made the group (under
        load that moment is long enough for a poll to see no group and no job yet)."""
        pid = self._salloc
        return pid is not None and (
            self.host.group_alive(pid) or self.host.cmdline(pid) is not None
        )

    def _stop_salloc(self) -> None:
        """TERM the salloc this run started, if it still waits (it withdraws its request);
        only after checking the pid still runs salloc."""
        pid, self._salloc = self._salloc, None
        if pid is None or not self.host.group_alive(pid):
            return
        if "salloc" in (self.host.cmdline(pid) or ""):
            self.host.signal_group(pid, "TERM")


def _waits(cap: float) -> Iterator[float]:
    """0.05 s doubling up to target.slurm.poll_s: a grant seen soon, squeue never hammered."""
    wait = min(0.05, cap)
    while True:
        yield wait
        wait = min(wait * 2, cap)


def _said(res: CommandResult) -> str:
    text = (res.stderr or res.stdout).strip()
    return text.splitlines()[-1][:200] if text else f"exit {res.exit_code}"
