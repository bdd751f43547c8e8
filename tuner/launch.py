"""Launch specs: what to run on the host to start one server. Pure.

`LaunchSpec.argv` is a list of arguments; turning it into a shell command line (quoting every
value) is done once, by `shell_command`, so no caller ever builds a remote command by hand.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaunchSpec:
    """One server start: argv (template + flags), inline environment, working directory, port."""

    argv: tuple[str, ...]
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    #: the server-side flags (dashed names -> values) this spec asks for; used to verify the
    #: answering server through /get_server_info and to decide whether a restart is needed
    flags: Mapping[str, object] = field(default_factory=dict)

    def shell_command(self) -> str:
        """`env K=V ... argv...` with every value shell-quoted (sshd drops unaccepted env vars)."""
        parts = [shlex.quote(a) for a in self.argv]
        if self.env:
            assigns = [f"{k}={shlex.quote(str(v))}" for k, v in sorted(self.env.items())]
            parts = ["env", *assigns, *parts]
        return " ".join(parts)
