"""Launch specs: what to run on the host to start one server. Pure.

`LaunchSpec.argv` is a list of arguments; turning it into a shell command line (quoting every
value) is done once, by `shell_command`, so no caller ever builds a remote command by hand.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
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


#: flags whose values are secrets: masked wherever a command or config is recorded or printed
SECRET_FLAGS = frozenset({"api-key", "admin-api-key"})
REDACTED = "***"


def flag_args(flags: Mapping[str, object]) -> list[str]:
    """SGLang flags (dashed names) -> argv, as SGLang's own `--config` expands them.

    `True` emits the bare flag, `False` and `None` drop it, a list becomes `--key a b c`.
    """
    argv: list[str] = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{key}")
        elif isinstance(value, list | tuple):
            argv += [f"--{key}", *(_text(v) for v in value)]
        else:
            argv += [f"--{key}", _text(value)]
    return argv


def _text(value: object) -> str:
    if isinstance(value, float):
        return repr(round(value, 10))
    return str(value)


def build_launch(
    template: Sequence[str],
    flags: Mapping[str, object],
    port: int,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> LaunchSpec:
    """A server start from the launch template and the full flag set (fixed + trial's).

    The target's port always wins over a `port` flag, so the tuner knows where to look.
    """
    merged = {**dict(flags), "port": port}
    return LaunchSpec(
        argv=(*template, *flag_args(merged)), port=port, env=dict(env or {}), cwd=cwd, flags=merged
    )


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv with every secret flag's value masked (for logs, trial records and exports)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg.lstrip("-") in SECRET_FLAGS and arg.startswith("--"):
            out[i + 1] = REDACTED
    return out


def render_sglang_yaml(flags: Mapping[str, object], header: Sequence[str] = ()) -> str:
    """SGLang's `--config` YAML: flat, dashed keys, store_true flags as `true`, secrets left out."""
    import yaml

    body = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in flags.items()
        if v is not None and v is not False and k not in SECRET_FLAGS
    }
    lines = [f"# {h}".rstrip() for h in header]
    text = yaml.safe_dump(body, sort_keys=False, default_flow_style=False)
    return "\n".join([*lines, text]) if lines else text
