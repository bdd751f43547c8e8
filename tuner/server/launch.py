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
from typing import Any

from tuner.sglang.argtypes import BOOLEAN_OPTIONAL
from tuner.sglang.flags import (
    KNOWN_VERSIONS,
    Flag,
    LaunchFlags,
    boolean_optional,
    config_refuses,
    effective_flags,
    find_flag,
)

#: flags whose values are secrets: masked wherever a command or config is recorded or printed
SECRET_FLAGS = frozenset({"api-key", "admin-api-key"})
REDACTED = "***"
_SECRET_WORDS = r"(?:key|token|secret|password|passwd)"
#: a name that ENDS in a secret's word is a secret's (api-key, HF_TOKEN, ssl-keyfile-password);
#: one that merely has the word inside is SGLang's (tbo-token-distribution-threshold)
_SECRET_TAIL = re.compile(rf"(?:^|[-_])(?:api|admin|access)?{_SECRET_WORDS}$")
#: an environment variable with the word anywhere (AWS_SECRET_ACCESS_KEY_ID): its value is only
#: masked, never refused, so erring on the side of masking costs nothing
_SECRET_WORD = re.compile(rf"(?:^|[-_])(?:api|admin)?{_SECRET_WORDS}(?:$|[-_])")
#: secret values shorter than this are not masked in text (masking "1" would garble every log)
MIN_MASKED_LEN = 4
#: the simulator's flag naming the SGLang version it plays (a launch template may carry it)
SIM_VERSION_FLAG = "--sim-sglang-version"


def is_secret_name(name: str) -> bool:
    """True for secret-looking flag names: api-key, or any name ENDING in key, token, secret,
    password (`hf-token`, `ssl-keyfile-password`); whole words only, so `max-total-tokens` and
    `tbo-token-distribution-threshold` are not. A flag SGLang types as a number or a switch
    (`kt-max-deferred-experts-per-token`, an int) holds no secret whatever its name."""
    low = name.lower().lstrip("-")
    if low in SECRET_FLAGS:
        return True
    if not _SECRET_TAIL.search(low):
        return False
    flag = find_flag(low.replace("_", "-"))
    return flag is None or not _not_text(flag)


def _not_text(flag: Flag) -> bool:
    """A switch or a number: a value that cannot be a key or a password."""
    if flag.action in ("store_true", BOOLEAN_OPTIONAL):
        return True
    return flag.type_name in ("int", "float", "human_readable_int")


def is_secret_variable(name: str) -> bool:
    """An environment variable whose value is masked in every log and file: a secret-looking
    name, or one with a secret's word anywhere (`AWS_SECRET_ACCESS_KEY_ID`)."""
    low = name.lower()
    return is_secret_name(low) or bool(_SECRET_WORD.search(low))


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
        values |= {str(v) for k, v in self.env.items() if is_secret_variable(k)}
        return {v for v in values if len(v) >= MIN_MASKED_LEN}


def launch_program(argv: Sequence[str]) -> str | None:
    """The program a launch runs: argv[0], or the command after `env [-opts] [K=V ...]`."""
    rest = list(argv)
    if rest and rest[0].rsplit("/", 1)[-1] == "env":
        rest = rest[1:]
        while rest and (rest[0].startswith("-") or "=" in rest[0]):
            rest = rest[1:]
    return rest[0] if rest else None


def flag_args(flags: Mapping[str, object], version: str | None = None) -> list[str]:
    """SGLang flags (dashed names) -> argv, as SGLang's own `--config` expands them.

    `True` emits the bare flag, `None` drops it, a list becomes `--key a b c`. `False` drops a
    store_true flag (its default is off) but is `--no-key` for a `--key/--no-key` switch of
    that SGLang `version` (BooleanOptionalAction: its default is None, SGLang's own choice, or
    True, so leaving it out would not mean off).
    """
    argv: list[str] = []
    for key, value in flags.items():
        if value is None:
            continue
        if value is False:
            argv += [f"--no-{key}"] if boolean_optional(key, version) else []
        elif value is True:
            argv.append(f"--{key}")
        elif isinstance(value, list | tuple):
            argv += [f"--{key}", *(_text(v) for v in value)]
        else:
            argv += [f"--{key}", _text(value)]
    return argv


def config_cli_flags(flags: Mapping[str, object], version: str | None = None) -> dict[str, Any]:
    """The flags SGLang's `--config` file cannot carry, which go on the command line instead:
    `--x/--no-x` and deprecated switches (`config_refuses`: 0.5.23's ConfigArgumentMerger
    refuses them; 0.5.6.post2 has none). Without a known `version`, a flag that is such a
    switch in any version tuner knows is put there when true (`--x` is then valid in every
    version)."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if not isinstance(value, bool):
            continue
        if config_refuses(key, version) or (
            value and version not in KNOWN_VERSIONS and _switch_somewhere(key)
        ):
            out[key] = value
    return out


def _switch_somewhere(name: str) -> bool:
    return any(config_refuses(name, v) for v in KNOWN_VERSIONS)


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
    version: str | None = None,
) -> LaunchSpec:
    """A server start from the launch template and the full flag set (fixed + trial's).

    The flags are what the server is launched with (`effective_flags`: full names, HiCache
    consistent with hicache-size). The target's port always wins over a `port` flag, so the
    tuner knows where to look. Secret flags go to `secret_flags`, never into argv. `version`:
    the host's SGLang, when known (else the one the simulator's template names), for the
    form of `false` on a `--x/--no-x` switch.
    """
    version = version or launch_version(template)
    merged = LaunchFlags({**effective_flags(flags), "port": port})
    public = {k: v for k, v in merged.items() if not is_secret_name(k)}
    secret = {k: v for k, v in merged.items() if is_secret_name(k) and v is not None}
    return LaunchSpec(
        argv=(*template, *flag_args(public, version)),
        port=port,
        env=dict(env or {}),
        cwd=cwd,
        flags=public,
        secret_flags=secret,
    )


def launch_version(template: Sequence[str]) -> str | None:
    """The SGLang version a launch template names (the simulator's `--sim-sglang-version`), or
    None: a real SGLang's version is known only once it answers."""
    args = list(template)
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == SIM_VERSION_FLAG and i + 1 < len(args) else None
        if arg.startswith(SIM_VERSION_FLAG + "="):
            value = arg.split("=", 1)[1]
        if value in KNOWN_VERSIONS:
            return value
    return None


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


def render_sglang_yaml(
    flags: Mapping[str, object], header: Sequence[str] = (), version: str | None = None
) -> str:
    """SGLang's `--config` YAML: flat, dashed keys, store_true flags as `true`, secrets left out,
    and so are the switches `--config` cannot carry (`config_cli_flags`: the command line's)."""
    import yaml

    cli = config_cli_flags(flags, version)
    body = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in flags.items()
        if v is not None and v is not False and not is_secret_name(k) and k not in cli
    }
    lines = [f"# {h}".rstrip() for h in header]
    text = yaml.safe_dump(body, sort_keys=False, default_flow_style=False)
    return "\n".join([*lines, text]) if lines else text
