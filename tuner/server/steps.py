"""Each server as one step of the study's Slurm allocation: the Runtime `server.lifecycle.Server`
calls for `target.slurm`, and the endpoint that follows the allocation's node.

`SlurmRuntime` wraps each launch in `srun` (commands built by `server.slurm`) once the
allocation (`server.allocation.Allocation`) runs: the launch script on the login node execs the
attached srun, so its process group, log and exit status work as a direct server's do, while
the task runs on the node. A step outlives a killed srun, so once srun's group is gone the
step is cancelled by its id (`remove`), and a killed run's steps are found by their name and
cancelled (`stop_strays`); nothing is ever cancelled by name. A step Slurm ended (a node
failure, a preemption, the walltime, the allocation gone) raises InfraError the first time it
is read (`exit_and_tail`): the world's failure, never the configuration's; srun's refusal of the
step's own options is the user's (`setup_error`).

`SlurmEndpoint` reaches the server on the node: directly when the tuner runs on the login node
(`host: local`), else through an SSH forward from the login node to NODE:PORT; the node is the
allocation's, so a new allocation on another node is followed (`following` makes the load run
use it too). The server must listen there (`server.host`, config/slurm.py).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuner.config.slurm import SlurmSection
from tuner.config.target import TargetSection, Timeouts
from tuner.errors import HaltError, InfraError, SetupError
from tuner.hosts.base import Host
from tuner.hosts.ssh import SSHHost
from tuner.server.allocation import Allocation, LaunchShell
from tuner.server.endpoint import DirectEndpoint, Endpoint, TunnelEndpoint, url_for
from tuner.server.launch import LaunchSpec
from tuner.server.runtime import DirectRuntime, Gpus
from tuner.server.slurm import (
    COMMANDS,
    Step,
    job_name,
    parse_steps,
    scancel_argv,
    shell,
    step_name,
    step_refusal,
    steps_argv,
    world_end,
    wrap,
)

log = logging.getLogger(__name__)

#: how long a cancelled step may take to go beyond target.timeouts.stop_s (Slurm's KillWait
#: between its TERM and its KILL is 30 s by default)
KILL_WAIT_S = 30.0
#: the host of the URL before the allocation has a node (RFC 2606: never resolves)
NO_NODE = "slurm-node-pending.invalid"


class SlurmRuntime:
    """The server as the step `<job>-server` of the allocation `<prefix>-<tag>` (per marker)."""

    host_pids = False  # the task's pids are the node's
    remote = True  # so are its port and GPUs: the lifecycle does not look for them on the host

    def __init__(
        self,
        host: Host,
        section: SlurmSection,
        env: Mapping[str, str] | None = None,
        marker: str | None = None,
        workdir: str = "/tmp",
        timeouts: Timeouts | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.host = host
        self.section = section
        self.shell = LaunchShell(host, env)
        self.name = job_name(section.job_name_prefix, marker)
        self.step = step_name(self.name)
        self.timeouts = timeouts or Timeouts()
        self.allocation = Allocation(
            self.shell, section, self.name, workdir, clock=clock, sleep=sleep
        )
        self._clock, self._sleep = clock, sleep
        self._reported: set[str] = set()  # logs whose step Slurm ended: said once
        self._launched = False  # a step of ours may run (remove asks squeue only then)

    def check_setup(self, spec: LaunchSpec) -> None:
        """SetupError unless the workdir exists and Slurm's commands are on the PATH."""
        # builtins only: a PATH without Slurm may lack every other command too
        script = "; ".join(f"{{ command -v -- {c} >/dev/null || echo {c}; }}" for c in COMMANDS)
        if spec.cwd:
            script = f"{{ test -d {shlex.quote(spec.cwd)} || exit 4; }}; {script}; true"
        res = self.shell.run(script)
        if res.exit_code == 4:
            raise SetupError(
                f"target.workdir: {spec.cwd} is not a directory on {self.host.name}; "
                "create it (on a filesystem the compute nodes share) or fix the path"
            )
        if not res.ok:
            raise InfraError(f"{self.host.name}: setup check failed (exit {res.exit_code})")
        missing = res.stdout.split()
        if missing:
            raise SetupError(
                f"target.slurm: {', '.join(missing)} not on the PATH on {self.host.name} (a "
                "non-interactive shell with target.env); set target.env.PATH to Slurm's bin"
            )

    def hold(self, say: Callable[[str], None]) -> None:
        """At the start of the run (strays stopped): the study's allocation, ours again or
        asked for, waited for up to `pending_s`; HaltError when it does not run (the night
        cannot start: Slurm's reason said, the request cancelled, the study resumable)."""
        sec = self.section
        say(
            f"Slurm: holding allocation {self.name} for the study (partition {sec.partition}, "
            f"1 node x {sec.gpus} GPUs, {sec.time}; waiting up to {sec.pending_s:g} s)"
        )
        try:
            job = self.allocation.ensure()
        except InfraError as exc:
            raise HaltError(str(exc)) from exc
        say(f"Slurm: allocation {job.id} runs on {job.node}")

    def wrap(self, spec: LaunchSpec, config_path: str | None) -> LaunchSpec:
        """`spec` as a step of the running allocation (one Slurm ended is replaced first,
        waited for no longer than a start: min(pending_s, ready_s), so the wait ends as the
        world's failure inside the trial's time). When that fails, the secret flags' file
        already written is removed before the error."""
        limit = min(self.section.pending_s, self.timeouts.ready_s)
        try:
            job = self.allocation.ensure(limit)
        except BaseException:
            if config_path:
                with contextlib.suppress(InfraError):
                    self.host.run_shell(f"rm -f -- {shlex.quote(config_path)}")
            raise
        self._launched = True
        return wrap(spec, self.section, job.id, self.step)

    def remove(self, gpus: Gpus) -> list[int]:
        """srun's group is gone: cancel our step if it still runs (by its id), wait until it
        is gone. No host pids (the task's are the node's)."""
        if self._launched:
            self._cancel(self._ours())
        return []

    def stop_strays(self, gpus: Gpus) -> list[int]:
        """Cancel every step of our name (a killed run's) and take our allocation back."""
        steps = self._ours()
        for step in steps:
            log.warning(
                "%s: cancelling Slurm step %s (%s) left by an earlier run",
                self.host.name,
                step.id,
                step.name,
            )
        self._cancel(steps)
        self.allocation.adopt()
        return []

    def exit_and_tail(self, log_path: str, lines: int) -> tuple[int | None, list[str]]:
        """srun's exit code and log tail (the server's output and srun's own lines); InfraError,
        once per log, when Slurm ended the step (`server.slurm.world_end`)."""
        code, tail = DirectRuntime(self.host).exit_and_tail(log_path, lines)
        if log_path in self._reported:
            return code, tail
        job = self.allocation.job
        now = self.allocation.state() if job is not None else None
        why = world_end(tail, now, job.id if job is not None else None)
        if why is None:
            return code, tail
        self._reported.add(log_path)
        raise InfraError(
            f"{self.host.name}: Slurm ended the server's step {self.step}: {why[:200]} "
            "(the world's failure, not the configuration's)"
        )

    def setup_error(
        self, code: int | None, tail: Sequence[str], mask: Callable[[str], str]
    ) -> SetupError | None:
        """SetupError when srun refused the step's own options (an unknown option, a GRES)."""
        why = step_refusal(tail)
        if why is None:
            return None
        return SetupError(
            f"target.slurm: srun refused the server's step on {self.host.name}: "
            f"{mask(why)[:200]}; check target.slurm.srun_options"
        )

    def release(self) -> None:
        """The study ended: cancel the allocation (its steps end with it)."""
        self.allocation.release()

    # -- steps ----------------------------------------------------------------------------

    def _ours(self) -> list[Step]:
        """Our running steps, found by their name (any job of this user)."""
        res = self.shell.run(shell(steps_argv()))
        if not res.ok:
            said = (res.stderr or res.stdout).strip()[:200]
            raise InfraError(f"{self.host.name}: squeue --steps failed: {said}")
        return [s for s in parse_steps(res.stdout) if s.name == self.step]

    def _cancel(self, steps: Sequence[Step]) -> None:
        """scancel each step by its id; wait until squeue no longer lists them."""
        if not steps:
            return
        for step in steps:
            self.shell.run(shell(scancel_argv(step.id)))  # a step already ending is fine
        ids = {s.id for s in steps}
        limit = self.timeouts.stop_s + KILL_WAIT_S
        deadline = self._clock() + limit
        wait = 0.05
        while ids & {s.id for s in self._ours()}:
            if self._clock() > deadline:
                raise InfraError(
                    f"{self.host.name}: Slurm step(s) {', '.join(sorted(ids))} still running "
                    f"{limit:g} s after scancel"
                )
            self._sleep(wait)
            wait = min(wait * 2, self.section.poll_s)


class SlurmEndpoint:
    """The way to the server on the allocation's node, rebuilt when the node changes."""

    def __init__(self, allocation: Allocation, make: Callable[[str], Endpoint]):
        self.allocation = allocation
        self._make = make
        self._node: str | None = None
        self._inner: Endpoint | None = None
        self._breaks_before = 0  # breaks of the ways to earlier nodes

    def url(self, port: int) -> str:
        inner = self._current()
        return inner.url(port) if inner is not None else url_for(NO_NODE, port)

    def describe(self, port: int) -> str:
        inner = self._current()
        if inner is None:
            return f"port {port} on the Slurm allocation's node (none yet)"
        return f"{inner.describe(port)} (node {self._node})"

    def unreachable(self) -> str | None:
        inner = self._current()
        return inner.unreachable() if inner is not None else None

    def connects(self, port: int, timeout_s: float) -> bool | None:
        inner = self._current()
        return inner.connects(port, timeout_s) if inner is not None else False

    def breaks(self) -> int:
        inner = self._current()
        return self._breaks_before + (inner.breaks() if inner is not None else 0)

    def close(self) -> None:
        inner, self._inner, self._node = self._inner, None, None
        if inner is not None:
            inner.close()

    def _current(self) -> Endpoint | None:
        node = self.allocation.node
        if node is not None and node != self._node:
            if self._inner is not None:
                self._breaks_before += self._inner.breaks()
                self._inner.close()
            self._node, self._inner = node, self._make(node)
        return self._inner


def slurm_parts(
    target: TargetSection, host: Host, env: Mapping[str, str], marker: str | None
) -> tuple[SlurmRuntime, SlurmEndpoint]:
    """The runtime and the endpoint of a `target.slurm` study (api.build_seams)."""
    assert target.slurm is not None and target.workdir  # config.slurm.slurm_problem
    runtime = SlurmRuntime(host, target.slurm, env, marker, target.workdir, target.timeouts)

    def make(node: str) -> Endpoint:
        if isinstance(host, SSHHost):  # the login node forwards to the node's port
            return TunnelEndpoint(host, remote_host=node)
        return DirectEndpoint(node)

    return runtime, SlurmEndpoint(runtime.allocation, make)


def following(run_load: Callable[..., Any], endpoint: Endpoint, port: int) -> Callable[..., Any]:
    """`run_load` sent to the endpoint's URL of now (the allocation's node may have changed
    since the runner was built) instead of the one it is given."""

    def run(url: str, client: Mapping[str, Any], **kw: Any) -> Any:
        return run_load(endpoint.url(port), client, **kw)

    return run
