"""Launch specs: what to run on the host to start one server. Pure.

`LaunchSpec.argv` is a list of arguments; turning it into a shell command line (quoting every
value) is done once, by `shell_command`, so no caller ever builds a remote command by hand.

Secrets never reach a command line (which `ps` shows to every user of the host for the server's
whole life): secret flags stay out of `argv` (`LaunchSpec.secret_flags`) and reach SGLang through
a `--config` YAML file of mode 0600 (`secrets_yaml`), and the environment is exported by a launch
script file (`script`) that execs the server, instead of `env K=V` on its command line.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: flags whose values are secrets: masked wherever a command or config is recorded or printed
SECRET_FLAGS = frozenset({"api-key", "admin-api-key"})
REDACTED = "***"
#: a dash- or underscore-separated word that makes a flag or variable name a secret's
_SECRET_WORD = re.compile(r"(?:^|[-_])(?:api|admin)?(?:key|token|secret|password|passwd)(?:$|[-_])")
#: secret values shorter than this are not masked in text (masking "1" would garble every log)
MIN_MASKED_LEN = 4


def is_secret_name(name: str) -> bool:
    """True for secret-looking flag or variable names: api-key, HF_TOKEN, DB_PASSWORD, ...

    Whole words only, so `max-total-tokens` is not one.
    """
    low = name.lower().lstrip("-")
    return low in SECRET_FLAGS or bool(_SECRET_WORD.search(low))


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
    #: secret flags (api-key, ...): not in argv nor in flags; passed in a 0600 `--config` file
    secret_flags: Mapping[str, object] = field(default_factory=dict)

    def shell_command(self) -> str:
        """`env K=V ... argv...` with every value shell-quoted (sshd drops unaccepted env vars).

        For display and tests; the lifecycle starts servers through `script` instead, which
        keeps the environment's values off the command line.
        """
        parts = [shlex.quote(a) for a in self.argv]
        if self.env:
            assigns = [f"{k}={shlex.quote(str(v))}" for k, v in sorted(self.env.items())]
            parts = ["env", *assigns, *parts]
        return " ".join(parts)

    def script(self, config_path: str | None = None) -> str:
        """A bash launch script: export the environment, then exec argv (+ `--config FILE`)."""
        lines = [
            "# written by tuner for one server start",
            # bash holds the file open: removing it now keeps the environment's secrets on
            # the host's disk for milliseconds, not all night
            'rm -f -- "$0"',
        ]
        for k, v in sorted(self.env.items()):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"bad environment variable name {k!r}")
            lines.append(f"export {k}={shlex.quote(str(v))}")
        argv = [*self.argv, *(["--config", config_path] if config_path else [])]
        lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
        return "\n".join(lines) + "\n"

    def secrets_yaml(self) -> str:
        """The secret flags as SGLang's `--config` YAML (merged with the command line)."""
        import yaml

        return yaml.safe_dump(
            {k: _text(v) for k, v in self.secret_flags.items() if v is not None},
            sort_keys=True,
            default_flow_style=False,
        )

    def secret_values(self) -> set[str]:
        """Every value this spec must never show: secret flags and secret-named variables."""
        values = {str(v) for v in self.secret_flags.values() if v is not None}
        values |= {str(v) for k, v in self.env.items() if is_secret_name(k)}
        return {v for v in values if len(v) >= MIN_MASKED_LEN}


def launch_program(argv: Sequence[str]) -> str | None:
    """The program a launch runs: argv[0], or the command after `env [-opts] [K=V ...]`."""
    rest = list(argv)
    if rest and rest[0].rsplit("/", 1)[-1] == "env":
        rest = rest[1:]
        while rest and (rest[0].startswith("-") or "=" in rest[0]):
            rest = rest[1:]
    return rest[0] if rest else None


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
    Secret flags go to `secret_flags`, never into argv.
    """
    merged = {**dict(flags), "port": port}
    public = {k: v for k, v in merged.items() if not is_secret_name(k)}
    secret = {k: v for k, v in merged.items() if is_secret_name(k) and v is not None}
    return LaunchSpec(
        argv=(*template, *flag_args(public)),
        port=port,
        env=dict(env or {}),
        cwd=cwd,
        flags=public,
        secret_flags=secret,
    )


def server_log_path(workdir: str | None, study: str, number: int, trial_dir: str) -> str:
    """Where trial `number`'s server writes its log on the host. The tag, a hash of the trial's
    local dir (unique per runs dir), keeps two runs of same-named studies sharing a host (two
    users, two checkouts, tests side by side) from overwriting each other's log and script."""
    tag = hashlib.sha256(trial_dir.encode()).hexdigest()[:8]
    return f"{workdir or '/tmp'}/tuner-{study}-trial{number}-{tag}.log"


def shown_command(argv: Sequence[str]) -> str:
    """The launch as one shell line (secrets masked) that pastes back as the same argv."""
    return shlex.join(redact_argv(argv))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv with every secret flag's value masked (for logs, trial records and exports)."""
    out = list(argv)
    for i, arg in enumerate(out):
        name, eq, _ = arg.partition("=")
        if not arg.startswith("--") or not is_secret_name(name):
            continue
        if eq:  # --api-key=VALUE
            out[i] = f"{name}={REDACTED}"
        elif i + 1 < len(out):
            out[i + 1] = REDACTED
    return out


def render_sglang_yaml(flags: Mapping[str, object], header: Sequence[str] = ()) -> str:
    """SGLang's `--config` YAML: flat, dashed keys, store_true flags as `true`, secrets left out."""
    import yaml

    body = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in flags.items()
        if v is not None and v is not False and not is_secret_name(k)
    }
    lines = [f"# {h}".rstrip() for h in header]
    text = yaml.safe_dump(body, sort_keys=False, default_flow_style=False)
    return "\n".join([*lines, text]) if lines else text
