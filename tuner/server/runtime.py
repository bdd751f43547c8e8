"""How a server runs on its Host: directly, or in a container. The seam `server.lifecycle.Server` calls.

`DirectRuntime` (the default) is the launch script's process group itself. `ContainerRuntime`
runs it in a docker/podman container (commands built by `tuner.server.container`): the launch script
execs the attached `run` client, so the client's group, log and exit status still work, while the
container's own processes live outside that group. So it is stopped and removed by its name once
its client is gone (`remove`), a killed run's leftovers are found by their label (`stop_strays`),
and its exit code and log are read from the runtime when the client's are missing (`evidence`).

Every runtime command runs with the launch script's environment (target.env: the PATH that finds
the runtime, DOCKER_HOST, ...), so it talks to the daemon the client talked to. Those values go
through the shell's stdin and are sourced, never on a command line (`ps` shows command lines).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from tuner.config.target import ContainerSection
from tuner.errors import InfraError, SetupError
from tuner.hosts.base import EXIT_SUFFIX, CommandResult, Host
from tuner.server.container import (
    NO_SUCH,
    container_name,
    list_argv,
    logs_argv,
    parse_names,
    parse_pids,
    parse_state,
    pids_argv,
    rm_argv,
    setup_problem,
    shell,
    state_argv,
    stop_argv,
    wrap,
)
from tuner.server.hostfacts import check_launch
from tuner.server.launch import LaunchSpec

log = logging.getLogger(__name__)

#: the host's GPUs (Server.gpus: empty without nvidia-smi); container pids are read only with some
Gpus = Callable[[], Sequence[object]]
#: separates the outputs of two commands run in one shell round trip
_SEP = "--tuner-sep-7f3a--"


class Runtime(Protocol):
    """What Server asks of the way its server runs (every method a no-op when direct)."""

    #: does SGLang report a pid of the launch group (False in a container: its own namespace's)
    host_pids: bool
    #: does the server run on another machine than the Host (a Slurm step: its port and GPUs
    #: are the node's, not the login node's)
    remote: bool

    def check_setup(self, spec: LaunchSpec) -> None: ...
    def wrap(self, spec: LaunchSpec, config_path: str | None) -> LaunchSpec: ...
    def remove(self, gpus: Gpus) -> list[int]: ...
    def stop_strays(self, gpus: Gpus) -> list[int]: ...
    def exit_and_tail(self, log_path: str, lines: int) -> tuple[int | None, list[str]]: ...
    def setup_error(
        self, code: int | None, tail: Sequence[str], mask: Callable[[str], str]
    ) -> SetupError | None: ...


class DirectRuntime:
    """No container: the launch script's process group is the server."""

    host_pids = True
    remote = False

    def __init__(self, host: Host):
        self.host = host

    def check_setup(self, spec: LaunchSpec) -> None:
        check_launch(self.host, spec)

    def wrap(self, spec: LaunchSpec, config_path: str | None) -> LaunchSpec:
        return spec

    def remove(self, gpus: Gpus) -> list[int]:
        return []

    def stop_strays(self, gpus: Gpus) -> list[int]:
        return []

    def exit_and_tail(self, log_path: str, lines: int) -> tuple[int | None, list[str]]:
        """The exit status the launch script recorded (`<log>.exit`) and the log's last lines."""
        status = self.host.read_tail(log_path + EXIT_SUFFIX, 1)
        code = int(status[0]) if status and status[0].strip().lstrip("-").isdigit() else None
        return code, self.host.read_tail(log_path, lines)

    def setup_error(
        self, code: int | None, tail: Sequence[str], mask: Callable[[str], str]
    ) -> SetupError | None:
        return None


class ContainerRuntime:
    """The server in a container named `name` (stable per marker), labelled with the marker."""

    host_pids = False
    remote = False

    def __init__(
        self,
        host: Host,
        section: ContainerSection,
        env: Mapping[str, str] | None = None,
        marker: str | None = None,
    ):
        self.host = host
        self.section = section
        self.env = dict(env or {})
        self.marker = marker
        self.name = container_name(section.name_prefix, marker)
        #: the runtime refused the last `run` (exit 125): its removal may fail the same way
        self._refused = False

    def check_setup(self, spec: LaunchSpec) -> None:
        """SetupError unless the workdir exists and the runtime is on the PATH (with target.env)."""
        rt = self.section.runtime
        script = f"command -v -- {shlex.quote(rt)} >/dev/null || exit 3"
        if spec.cwd:
            script = f"{{ test -d {shlex.quote(spec.cwd)} || exit 4; }} && {script}"
        res = self._run(script)
        if res.exit_code == 4:
            raise SetupError(
                f"target.workdir: {spec.cwd} is not a directory on {self.host.name}; "
                "create it or fix the path"
            )
        if res.exit_code == 3:
            raise SetupError(
                f"target.container.runtime: {rt} is not on the PATH on {self.host.name} (a "
                "non-interactive shell with target.env); install it or set target.env.PATH"
            )
        if not res.ok:
            raise InfraError(f"{self.host.name}: setup check failed (exit {res.exit_code})")

    def wrap(self, spec: LaunchSpec, config_path: str | None) -> LaunchSpec:
        """`spec` started by `RUNTIME run` in our container (the secrets file mounted)."""
        return wrap(spec, self.section, self.name, self.marker, config_path)

    def remove(self, gpus: Gpus, name: str | None = None) -> list[int]:
        """Stop (`stop -t N`: TERM, then KILL) and remove our container, or `name`; return its
        host pids as they were (read when `gpus()` lists any: the GPU check), InfraError if it
        is still there."""
        if self._refused and name is None:  # the user's setup error is the news, not this
            self._refused = False
            try:
                return self.remove(gpus, self.name)
            except InfraError as exc:
                log.warning("%s", exc)
                return []
        name = name or self.name
        sec = self.section
        pids = bool(gpus())
        top = f"{shell(pids_argv(sec, name))} 2>/dev/null; echo {_SEP}; " if pids else ""
        script = (
            f"{top}{shell(stop_argv(sec, name))} >/dev/null 2>&1; "
            f"{shell(rm_argv(sec, name))} >/dev/null 2>&1; {shell(state_argv(sec, name))}"
        )
        res = self._run(script, timeout=sec.stop_timeout_s + 60.0)
        before, _, after = res.stdout.rpartition(_SEP) if pids else ("", "", res.stdout)
        if res.ok:
            raise InfraError(
                f"{self.host.name}: container {name} is still there after {sec.runtime} rm -f "
                f"({after.strip()[:80]})"
            )
        if not NO_SUCH.search(res.stderr):
            raise InfraError(
                f"{self.host.name}: cannot remove container {name}: "
                f"{(res.stderr or res.stdout).strip()[:200]}"
            )
        return parse_pids(before)

    def stop_strays(self, gpus: Gpus) -> list[int]:
        """Stop and remove every container carrying our label (a killed run's, running or not);
        return their host pids (when `gpus()` lists any)."""
        if not self.marker:
            return []
        res = self._run(shell(list_argv(self.section, self.marker)))
        if not res.ok:
            raise InfraError(
                f"{self.host.name}: cannot list containers: {(res.stderr or res.stdout).strip()[:200]}"
            )
        held: list[int] = []
        for name in parse_names(res.stdout):
            log.warning("%s: removing container %s left by an earlier run", self.host.name, name)
            held += self.remove(gpus, name)
        return held

    def exit_and_tail(self, log_path: str, lines: int) -> tuple[int | None, list[str]]:
        """The client's exit code and log tail, from the container's when missing (the client
        was killed, its log removed): `inspect` and `logs --tail`."""
        code, tail = DirectRuntime(self.host).exit_and_tail(log_path, lines)
        if code is not None and tail:
            return code, tail
        sec = self.section
        res = self._run(
            f"{shell(state_argv(sec, self.name))} 2>/dev/null; echo {_SEP}; "
            f"{shell(logs_argv(sec, self.name, lines))} 2>&1"
        )
        state_text, _, logs = res.stdout.partition(_SEP)
        state = parse_state(state_text)
        if state is None:  # no such container (removed already)
            return code, tail
        # a killed client's log stops where it died; the container's goes on to the end
        return (code if code is not None else state[1]), logs.splitlines()[-lines:] or tail

    def setup_error(
        self, code: int | None, tail: Sequence[str], mask: Callable[[str], str]
    ) -> SetupError | None:
        """SetupError when the runtime refused to run the container (exit 125)."""
        problem = setup_problem(self.section.runtime, code, tail)
        if problem is None:
            return None
        self._refused = True
        return SetupError(
            f"target.container: {self.section.runtime} cannot run the container on "
            f"{self.host.name} (exit 125): {mask(problem)[:200]}; check target.container.image "
            "and run_options, and that the runtime works there for this user"
        )

    def _run(self, script: str, timeout: float | None = None) -> CommandResult:
        """`script` with the launch environment sourced from stdin (values never in argv)."""
        if not self.env:
            return self.host.run_shell(script, timeout=timeout)
        exports = "".join(
            f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(self.env.items())
        )
        return self.host.run_shell(
            f". /dev/stdin && {script}", timeout=timeout, stdin=exports.encode()
        )
