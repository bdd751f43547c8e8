"""Preflight: tell the user's setup and other tenants apart from the configuration. I/O on a Host.

Before the first spawn the launch program and the workdir must exist on the host (SetupError:
the study stops at once, exit 2, instead of recording every trial as infeasible). After a start
that died, `setup_error` reads the evidence that the command itself could not run. A port held by
a process tuner did not start is named by PID and command (PortHeldError: the study stops).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from tuner.errors import PortHeldError, SetupError
from tuner.hosts.base import Host
from tuner.server.launch import LaunchSpec, launch_program
from tuner.sglang.failures import setup_failure


def check_launch(host: Host, spec: LaunchSpec) -> None:
    """SetupError unless `spec.cwd` is a directory and the launch program an executable file
    (a bare name: found on the PATH of the host's non-interactive shell, as the start sees it)."""
    program = launch_program(spec.argv)
    where = host.name
    if spec.cwd and not host.run(["test", "-d", spec.cwd]).ok:
        raise SetupError(
            f"target.workdir: {spec.cwd} is not a directory on {where}; create it or fix the path"
        )
    if program is None:
        raise SetupError("target.launch: no command to run")
    if "/" in program:  # a path: relative ones are relative to the workdir, as at start
        q = shlex.quote(program)
        cd = f"cd {shlex.quote(spec.cwd)} && " if spec.cwd else ""
        found = host.run_shell(f"{cd}test -f {q} && test -x {q}").ok
    else:
        found = host.which(program) is not None
    if not found:
        raise SetupError(
            f"target.launch: {program} is not an executable file on {where}"
            + ("" if "/" in program else " (not on the PATH of a non-interactive shell)")
            + "; fix target.launch (a full path works) or install SGLang there"
        )


def setup_error(
    where: str,
    spec: LaunchSpec,
    code: int | None,
    tail: Sequence[str],
    mask: Callable[[str], str],
) -> SetupError | None:
    """A SetupError when a dead start's exit code and log show the command could not run."""
    argv = list(spec.argv)
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None
    evidence = setup_failure(code, tail, launch_program(argv) or "", module)
    if evidence is None:
        return None
    return SetupError(
        f"target.launch: the server command cannot run on {where} (exit {code}): "
        f"{mask(evidence)[:200]}; fix target.launch or target.workdir, or install SGLang there"
    )


def port_held_error(host: Host, port: int, mask: Callable[[str], str]) -> PortHeldError:
    """The error that stops the study: who holds `port` (PID and command) when we can see it."""
    holders = host.port_holders(port)
    who = (
        ", ".join(f"PID {pid} ({mask(cmd)[:160]})" for pid, cmd in holders)
        if holders
        else "a process tuner cannot see (another user's?)"
    )
    return PortHeldError(
        f"{host.name}: port {port} is held by {who}, not a server tuner started; "
        "stop it or set target.port to a free port"
    )
