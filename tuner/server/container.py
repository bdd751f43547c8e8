"""The server in a container: every docker/podman command line the tuner runs for the study
file's `target.container` (its schema: `config/target.py`). Pure (no I/O); `server.runtime.ContainerRuntime` runs them.

A container server is started as `RUNTIME run --name NAME --label tuner.marker=MARKER
[run_options] [-v mounts] [-e NAME ...] IMAGE <target.launch> <flags>` from the launch script,
attached: the client's output is the server log and its exit status is the container's (docker
and podman pass the contained command's code through; 125 means the runtime itself refused, 126
and 127 that the command cannot be invoked or found). Killing the client does not stop the
container, which keeps the GPU memory: it is stopped by its name (`stop -t N`, then `rm -f`),
and a killed run's leftovers are found by the label carrying the worker's marker.

Why no `--rm`: a container that died keeps its exit code and log until the tuner has read them
(`inspect`, `logs`: the evidence when the client or its log is gone); the tuner removes it by
name afterwards, and a killed run's stopped leftover is still listed (`ps -a`) by its label.
Secrets never reach a command line: environment variables enter the container as `-e NAME`
(the value comes from the launch script's environment), and the secret flags' 0600 `--config`
file is bind-mounted read-only, alone, at its own path.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tuner.config.target import NAME_RE, ContainerSection
from tuner.server.launch import LaunchSpec

#: the label every container of a worker carries: `tuner.marker=<marker>`
LABEL = "tuner.marker"
#: what `runtime top NAME ...` needs to print host pids (the GPU check compares them)
_TOP_PIDS = {"docker": ["-o", "pid"], "podman": ["hpid"]}
#: `inspect` of a container that does not exist (docker: "No such container"/"No such object",
#: podman: "no such container")
NO_SUCH = re.compile(r"no such (container|object)", re.I)
#: environment variables of the launch script that stay outside the container by default: the
#: host's PATH finds the runtime, the image has its own
HOST_ONLY_ENV = frozenset({"PATH"})
#: the command inside the container when target.launch is not given (the sglang images' python)
DEFAULT_LAUNCH = ("python3", "-m", "sglang.launch_server")


def container_name(prefix: str, marker: str | None) -> str:
    """The worker's container name: stable per marker (a resumed run stops its predecessor's by
    name), random without one."""
    tag = hashlib.sha256(marker.encode()).hexdigest()[:12] if marker else secrets.token_hex(6)
    return f"{prefix}-{tag}"


def passed_env(section: ContainerSection, env: Mapping[str, str]) -> list[str]:
    """Names entering the container as `-e NAME`: the section's list, else the launch env's."""
    if section.env is not None:
        return list(section.env)
    return sorted(k for k in env if k not in HOST_ONLY_ENV)


def run_argv(
    section: ContainerSection,
    name: str,
    marker: str | None,
    inner: Sequence[str],
    env_names: Sequence[str] = (),
    config_path: str | None = None,
) -> list[str]:
    """`RUNTIME run ...` starting `inner` (the server's argv) in a new container named `name`.

    `config_path` (the secret flags' --config file, on the host) is mounted read-only at the same
    path; the caller appends `--config PATH` to the inner argv (LaunchSpec.script does).
    """
    argv = [section.runtime, "run", "--name", name]
    if marker:
        argv += ["--label", f"{LABEL}={marker}"]
    argv += section.run_options
    for m in section.mounts:
        argv += ["-v", m]
    if config_path:
        if ":" in config_path or "," in config_path:
            raise ValueError(f"cannot bind-mount {config_path!r}: ':' or ',' in the path")
        argv += ["-v", f"{config_path}:{config_path}:ro"]
    for env in env_names:  # never NAME=VALUE: the command line is visible in ps
        argv += ["-e", env]
    return [*argv, section.image, *inner]


def probe_argv(
    section: ContainerSection, inner: Sequence[str], env_names: Sequence[str] = ()
) -> list[str]:
    """A one-off container running `inner` (e.g. `python3 -m sglang.launch_server --help`, a
    version probe) like the server's (options, mounts, environment), removed when it ends."""
    argv = [section.runtime, "run", "--rm", *section.run_options]
    for m in section.mounts:
        argv += ["-v", m]
    for env in env_names:
        argv += ["-e", env]
    return [*argv, section.image, *inner]


def wrap(
    spec: LaunchSpec,
    section: ContainerSection,
    name: str,
    marker: str | None,
    config_path: str | None = None,
) -> LaunchSpec:
    """`spec` run in a container: the same spec (env, port, flags) with the runtime's argv."""
    argv = run_argv(section, name, marker, spec.argv, passed_env(section, spec.env), config_path)
    return replace(spec, argv=tuple(argv))


def stop_argv(section: ContainerSection, name: str) -> list[str]:
    return [section.runtime, "stop", "-t", str(section.stop_timeout_s), name]


def rm_argv(section: ContainerSection, name: str) -> list[str]:
    return [section.runtime, "rm", "-f", name]


def state_argv(section: ContainerSection, name: str) -> list[str]:
    """`container inspect`: prints `STATUS EXIT_CODE` (running 0, exited 137, ...)."""
    fmt = "{{.State.Status}} {{.State.ExitCode}}"
    return [section.runtime, "container", "inspect", "-f", fmt, name]


def list_argv(section: ContainerSection, marker: str) -> list[str]:
    """Every container (running or not) carrying the worker's label, one name a line."""
    label = f"label={LABEL}={marker}"
    return [section.runtime, "ps", "-a", "--filter", label, "--format", "{{.Names}}"]


def logs_argv(section: ContainerSection, name: str, lines: int) -> list[str]:
    return [section.runtime, "logs", "--tail", str(int(lines)), name]


def pids_argv(section: ContainerSection, name: str) -> list[str]:
    """The container's processes as host pids (a header line first)."""
    return [section.runtime, "top", name, *_TOP_PIDS[section.runtime]]


def parse_state(text: str) -> tuple[str, int | None] | None:
    """`STATUS EXIT_CODE` -> (status, exit code; None while it runs), None if unreadable."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
        return None
    status, code = parts[0], int(parts[1])
    return status, None if status in ("running", "created", "restarting", "paused") else code


def parse_pids(text: str) -> list[int]:
    """Host pids from `top` output (the header and anything not a number dropped)."""
    return [int(w) for w in text.split() if w.isdigit()]


def parse_names(text: str) -> list[str]:
    """Container names from `ps --format {{.Names}}` (only valid names: never a stray word)."""
    return [ln.strip() for ln in text.splitlines() if NAME_RE.match(ln.strip())]


def setup_problem(runtime: str, code: int | None, tail: Sequence[str]) -> str | None:
    """The runtime's own refusal to run the container (exit 125: image, options, daemon,
    permissions), or None. A name conflict is not the user's: the tuner removes its leftover."""
    if code != 125:
        return None
    # the last line is often the CLI's "Run 'docker run --help' for more information"
    lines = [ln.strip() for ln in tail if ln.strip() and "--help" not in ln]
    if re.search(r"conflict|already in use", " ".join(lines), re.I):
        return None
    why = re.compile(r"error|unable|denied|cannot|unknown|invalid|not found", re.I)
    hit = next((ln for ln in reversed(lines) if why.search(ln)), "")
    return hit or (lines[-1] if lines else f"{runtime} run exited 125")


def shell(argv: Sequence[str]) -> str:
    """One command line, every value quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)
