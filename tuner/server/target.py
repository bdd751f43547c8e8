"""The study's `target:`: the Host it runs on, where the server is reached (its Endpoint), how it
is launched.

Everything a study derives from the `target:` section is derived here once, so the SSH options,
the server's address and the launch template have one owner.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.config.nodes import node_ssh
from tuner.config.target import TargetSection
from tuner.errors import ConfigError
from tuner.hosts.local import LocalHost
from tuner.hosts.ssh import SSHHost, SSHOptions, _resolve
from tuner.server.container import DEFAULT_LAUNCH
from tuner.server.endpoint import DirectEndpoint, Endpoint, TunnelEndpoint
from tuner.sglang.flags import given_value


def is_local(target: TargetSection) -> bool:
    """Only the keyword `local` runs without SSH: `127.0.0.1` means SSH to this machine."""
    return target.host == "local"


def host_for(target: TargetSection) -> LocalHost | SSHHost:
    """LocalHost for `host: local`, else SSHHost with the study file's SSH options."""
    if is_local(target):
        return LocalHost(command_timeout_s=target.ssh.command_timeout_s)
    # across nodes, the target's host is nodes[0], with its own SSH settings (config/nodes.py)
    section = node_ssh(target, target.nodes[0]) if target.nodes else target.ssh
    return SSHHost(SSHOptions.from_section(target.host, section))


def endpoint_for(target: TargetSection, host: LocalHost | SSHHost) -> Endpoint:
    """Where the tuner reaches the server's port: `target.http_host` directly when set (an
    ssh_config alias resolved to its HostName, as ssh would), 127.0.0.1 for a local target,
    else an SSH tunnel to 127.0.0.1 on the host (the server keeps listening on its loopback)."""
    if target.http_host:
        return DirectEndpoint(http_hostname(target))
    if is_local(target) or not isinstance(host, SSHHost):
        return DirectEndpoint("127.0.0.1")
    return TunnelEndpoint(host)


def http_hostname(target: TargetSection) -> str:
    """`target.http_host`, or the HostName ssh_config gives it when it is an alias there (the
    same file as the SSH options; explicit SSH options do not apply to it)."""
    assert target.http_host
    section = target.ssh.model_copy(update={"port": None, "user": None, "identity_file": None})
    return _resolve(SSHOptions.from_section(target.http_host, section)).hostname


def env_secret(name: str | None, key: str, file: str | None = None) -> str | None:
    """A secret read from the environment variable the study file names (never from the file)."""
    if not name:
        return None
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"environment variable {name} is not set", file=file, key=key)
    return value


#: a launch that runs `python -m tuner.sim` plays SGLang on this machine (simulator studies)
SIM_MODULE = "tuner.sim"


#: the simulated host's nvidia-smi (`Launch.nvidia_smi`)
SIM_SMI_MODULE = "tuner.sim.smi"


def sim_args(argv: Sequence[str]) -> list[str] | None:
    """The simulator's own arguments in a launch argv (after `-m tuner.sim`), or None."""
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == SIM_MODULE:
            return list(argv[i + 2 :])
    return None


@dataclass(frozen=True)
class Launch:
    """How servers are started on the target: argv prefix, inline environment, a marker."""

    template: tuple[str, ...]
    env: dict[str, str]

    @classmethod
    def of(cls, target: TargetSection) -> Launch:
        # `{python}` stands for the Python running tuner (simulator studies); in a container (or a pod) the
        # command runs inside the image, by default with its python3
        launch = target.launch
        boxed = target.container is not None or target.kubernetes is not None
        if boxed and "launch" not in target.model_fields_set:
            launch = list(DEFAULT_LAUNCH)
        template = tuple(sys.executable if a == "{python}" else a for a in launch)
        env = dict(target.env)
        if target.gpus:
            env["CUDA_VISIBLE_DEVICES"] = target.gpus
        return cls(template, env)

    @property
    def simulated(self) -> bool:
        """The server is tuner's simulator: its GPUs and host RAM are its profile's."""
        return sim_args(self.template) is not None

    def nvidia_smi(self, port: int) -> tuple[str, ...]:
        """The command that reads the host's GPUs: nvidia-smi, or for tuner's simulator serving
        `port` its simulated nvidia-smi (sim/smi.py), run by the launch's own Python."""
        argv = self.template
        for i in range(1, len(argv) - 1):
            if argv[i] == "-m" and argv[i + 1] == SIM_MODULE:
                profile = given_value(argv[i + 2 :], "--sim-profile")
                named = ("--sim-profile", profile) if profile else ()
                return (argv[i - 1], "-m", SIM_SMI_MODULE, *named, "--sim-port", str(port))
        return ("nvidia-smi",)

    @property
    def marker(self) -> str:
        """A secret-free part of the server's command line, to recognise it after a PID reuse."""
        return " ".join(a for a in self.template if not a.startswith("{"))
