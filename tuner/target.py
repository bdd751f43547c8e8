"""The study's `target:`: the Host it runs on, where the server is reached, how it is launched.

Everything a study derives from the `target:` section is derived here once, so the SSH options,
the server's address and the launch template have one owner.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from tuner.config import TargetSection
from tuner.errors import ConfigError
from tuner.hosts.local import LocalHost
from tuner.hosts.ssh import SSHHost, SSHOptions


def is_local(target: TargetSection) -> bool:
    """Only the keyword `local` runs without SSH: `127.0.0.1` means SSH to this machine."""
    return target.host == "local"


def host_for(target: TargetSection) -> LocalHost | SSHHost:
    """LocalHost for `host: local`, else SSHHost with the study file's SSH options."""
    if is_local(target):
        return LocalHost(command_timeout_s=target.ssh.command_timeout_s)
    return SSHHost(SSHOptions.from_section(target.host, target.ssh))


def http_host(target: TargetSection) -> str:
    """The address the tuner reaches the server's port at."""
    if target.http_host:
        return target.http_host
    return "127.0.0.1" if is_local(target) else target.host


def base_url(target: TargetSection) -> str:
    host = http_host(target)
    return f"http://[{host}]:{target.port}" if ":" in host else f"http://{host}:{target.port}"


def env_secret(name: str | None, key: str) -> str | None:
    """A secret read from the environment variable the study file names (never from the file)."""
    if not name:
        return None
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"environment variable {name} is not set", key=key)
    return value


@dataclass(frozen=True)
class Launch:
    """How servers are started on the target: argv prefix, inline environment, a marker."""

    template: tuple[str, ...]
    env: dict[str, str]

    @classmethod
    def of(cls, target: TargetSection) -> Launch:
        # `{python}` stands for the Python running tuner (simulator studies)
        template = tuple(sys.executable if a == "{python}" else a for a in target.launch)
        env = dict(target.env)
        if target.gpus:
            env["CUDA_VISIBLE_DEVICES"] = target.gpus
        return cls(template, env)

    @property
    def marker(self) -> str:
        """A secret-free part of the server's command line, to recognise it after a PID reuse."""
        return " ".join(a for a in self.template if not a.startswith("{"))
