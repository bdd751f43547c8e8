"""LocalHost: the machine the tuner runs on, through subprocess."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

from tuner.config.target import SSHSection
from tuner.errors import CommandTimeout, HostUnreachable, InfraError
from tuner.hosts.base import CommandResult, ShellHost


class LocalHost(ShellHost):
    """Runs bash scripts as local subprocesses, each in its own session so a deadline kills all."""

    def __init__(
        self,
        *,
        address: str = "127.0.0.1",
        # the study file's default deadline of helper commands (target.ssh.command_timeout_s)
        command_timeout_s: float = SSHSection().command_timeout_s,
    ):
        self.name = "local"
        self.address = address
        self.command_timeout_s = command_timeout_s

    def run_shell(
        self, script: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        """`bash -c script`; stdout and stderr drained together by communicate()."""
        limit = self.command_timeout_s if timeout is None else timeout
        try:
            proc = subprocess.Popen(
                ["bash", "-c", script],
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a deadline kills the script's whole group
            )
        except OSError as exc:  # bash missing, fork failed: the host, not the user
            raise HostUnreachable(f"local: cannot run bash: {exc}") from exc
        try:
            out, err = proc.communicate(stdin, timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CommandTimeout(
                f"local: command ran past its {limit:g} s deadline: {script[:120]}"
            ) from None
        return CommandResult(
            proc.returncode,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
        )

    def fetch(self, remote_path: str, local_path: str) -> None:
        """Copy a file (same machine)."""
        try:
            shutil.copyfile(remote_path, local_path)
        except OSError as exc:
            raise InfraError(f"local: cannot copy {remote_path} to {local_path}: {exc}") from exc
