"""What every check shares: the study, its host, its launch, the facts earlier checks found,
and how a probe runs on the host (the launch's environment, its workdir, a deadline of its own).

The launch's environment (`target.env`, plus CUDA_VISIBLE_DEVICES from `target.gpus`) reaches
a probe through its stdin, never its command line (`ps` shows command lines, and target.env may
hold a token); so a probe sees the PATH, the Python and the variables the server will see.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.config.schema import StudyConfig
from tuner.hosts.base import CommandResult, Host, quote_argv
from tuner.server.target import Launch


@dataclass(frozen=True)
class Deadlines:
    """Every wait of `tuner check`, in seconds; each probe has its own."""

    #: a shell helper (id, test, cat /proc/meminfo, nvidia-smi, ...)
    command_s: float = 10.0
    #: `python -c 'import sglang'` (real SGLang imports take seconds)
    version_s: float = 30.0
    #: `<launch> --help` (real SGLang imports torch before it parses)
    help_s: float = 45.0
    #: the HTTP listener's start, and each GET through the endpoint
    http_s: float = 5.0


@dataclass
class Probe:
    """The state one `tuner check` run threads through its checks."""

    cfg: StudyConfig
    launch: Launch
    deadlines: Deadlines = field(default_factory=Deadlines)
    host: Host | None = None
    #: the runs folder `tuner tune` will be given: its servers' marker depends on it
    runs_dir: Path = Path("runs")
    #: facts a check found for later ones (e.g. "nvidia-smi": its path, "tp": TP size)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return self.host.name if self.host is not None else self.cfg.target.host

    def run(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run a helper script on the host (no launch environment) under its deadline."""
        assert self.host is not None, "the connection check runs first"
        return self.host.run_shell(script, timeout=timeout or self.deadlines.command_s)

    def run_as_server(
        self, argv: Sequence[str], timeout: float | None = None, *, in_workdir: bool = True
    ) -> CommandResult:
        """Run `argv` with the environment (and in the workdir) a server of this study gets."""
        return self.run_env(f"exec {quote_argv(argv)}", timeout, in_workdir=in_workdir)

    def run_env(
        self, script: str, timeout: float | None = None, *, in_workdir: bool = False
    ) -> CommandResult:
        """Run a shell script (values quoted by the caller) in the launch's environment."""
        assert self.host is not None, "the connection check runs first"
        workdir = self.cfg.target.workdir
        cd = f"cd {shlex.quote(workdir)} && " if workdir and in_workdir else ""
        return self.host.run_shell(
            f'eval "$(cat)" && {cd}{script}',
            timeout=timeout or self.deadlines.command_s,
            stdin=self.env_text().encode(),
        )

    def env_text(self) -> str:
        """`export K=V` lines of the launch environment (values quoted), for a probe's stdin."""
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.launch.env.items())


def said(res: CommandResult, limit: int = 160) -> str:
    """The last non-empty line a command wrote (stderr first), bounded, for a one-line detail."""
    for text in (res.stderr, res.stdout):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines:
            last = lines[-1]
            return last if len(last) <= limit else last[: limit - 3] + "..."
    return "no output"
