"""SGLang's launch flags (server_args.py, v0.5.6.post2) as the simulator parses them. Pure.

The flags come from tuner.sglang.flags (real names, types, choices and defaults), so a flag SGLang
rejects is rejected here too (exit 2, argparse's message). `--tp`/`--dp` work as in SGLang:
argparse prefix matching (allow_abbrev). `--config FILE.yaml` is expanded the way SGLang's
ConfigArgumentMerger does it: each key becomes `--KEY` verbatim, store_true keys emit the bare
flag when true and nothing when false, lists become several values, and flags on the command line
override the file. The `--sim-*` flags are the simulator's own (`--sim-fault`: see faults.py).
`--port` must be 1 to 65535 (an argparse error, exit 2, rather than a traceback at bind time).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import InputFileError
from tuner.sglang.flags import DEFAULT_VERSION, add_to_parser
from tuner.sim.faults import add_fault_flags
from tuner.yamlfile import special_file

DEFAULT_PROFILE = "llama-3.1-8b-h100"
DEFAULT_STARTUP_SECONDS = 1.5


class FlagError(Exception):
    """argparse rejected the command line; `usage` and `message` are what argparse prints."""

    def __init__(self, usage: str, message: str):
        self.usage = usage
        self.message = message
        super().__init__(message)


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting so `main` returns the exit code (no sys.exit below the CLI)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise FlagError(self.format_usage(), f"{self.prog}: error: {message}")


def _non_negative_float(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _port(value: str) -> int:
    """argparse type of --port: an integer TCP port (SGLang would fail later, at bind time)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port: {value} (expected 1 to 65535)")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The launch_server parser: SGLang's flags (with `--config`) plus the simulator's `--sim-*`."""
    p = _Parser(prog="launch_server.py", description="Simulated SGLang server (no GPU).")
    add_to_parser(p, DEFAULT_VERSION)
    for action in p._actions:
        if action.dest == "port":
            action.type = _port  # an out-of-range port is a usage error, not a bind traceback
    a = p.add_argument
    a("--sim-profile", type=str, default=DEFAULT_PROFILE, help="profile name or YAML path")
    a("--sim-startup-seconds", type=_non_negative_float, default=DEFAULT_STARTUP_SECONDS)
    a(
        "--sim-seed",
        type=int,
        default=None,
        help="noise seed (default: a fresh one per start, so runs differ as on real hardware)",
    )
    add_fault_flags(a)
    return p


def _config_path(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Find `--config X` / `--config=X` and return it with the remaining arguments."""
    rest: list[str] = []
    path: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return path, rest


def config_to_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """SGLang's YAML launch config as command-line arguments (see module docstring)."""
    if not path.endswith((".yaml", ".yml")):
        raise InputFileError(path, "config file must be YAML (.yaml or .yml)")
    special = special_file(Path(path))
    if special:  # a FIFO would block the start-up forever
        raise InputFileError(path, special)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise InputFileError(path, f"cannot read config file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputFileError(path, f"not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise InputFileError(path, "config file must hold a mapping at its root")
    store_true = {
        s
        for act in parser._actions
        if isinstance(act, argparse._StoreTrueAction)
        for s in act.option_strings
    }
    out: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if flag in store_true:
            if not isinstance(value, bool):
                raise InputFileError(path, f"{key}: expected true or false, got {value!r}")
            if value:
                out.append(flag)
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
        elif value is None:
            raise InputFileError(path, f"{key}: has no value")
        else:
            out += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return out


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a launch command line (with `--config` expanded); raises FlagError or InputFileError."""
    parser = build_parser()
    path, rest = _config_path(list(argv))
    if path is not None:
        # Config first so that flags given on the command line override the file.
        rest = config_to_argv(path, parser) + rest
    ns = parser.parse_args(rest)
    ns.config = path
    if ns.sim_seed is None:
        ns.sim_seed = random.SystemRandom().randrange(2**31)
    return ns


def server_args_dict(ns: argparse.Namespace) -> dict[str, Any]:
    """Every server arg by SGLang's field name (what /get_server_info reports), sim flags left out."""
    return {k: v for k, v in vars(ns).items() if not k.startswith("sim_") and k != "config"}
