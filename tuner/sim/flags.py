"""SGLang's launch flags (server_args.py) as the simulator parses them, for the SGLang version it
plays. Pure.

`--sim-sglang-version` names the version (default: the profile's `version`, else
tuner.sglang's DEFAULT_VERSION); the parser is that version's complete flag table from
tuner.sglang (every flag with SGLang's types, choices, aliases, store_true/BooleanOptionalAction,
nargs), built on argparse with allow_abbrev as SGLang's is, so a flag SGLang rejects is rejected
here too, with argparse's message (exit 2): an unknown flag, a bad value, and a prefix that
matches several option strings (0.5.23: `--cuda-graph-max-bs could match
--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill`). `--tp`/`--dp` work by that prefix
matching. `--config FILE.yaml` is expanded the way that version's ConfigArgumentMerger does it:
each key becomes `--KEY` verbatim, store_true keys emit the bare flag when true and nothing when
false, lists become several values, flags on the command line override the file (what differs
between versions: `_PARSER_AWARE_CONFIG`). The `--sim-*`
flags are the simulator's own (`--sim-fault`: see faults.py). `--port` must be 1 to 65535 (an
argparse error, exit 2, rather than a traceback at bind time).

Flags in `MODELED` change what the simulator does; every other flag is accepted, kept on the
namespace and reported by `/server_info` (`server_args_dict`), as SGLang reports its ServerArgs.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tuner.config.base import MAX_INT
from tuner.config.yamlfile import special_file
from tuner.errors import InputFileError
from tuner.sglang.flags import (
    DEFAULT_VERSION,
    KNOWN_VERSIONS,
    add_to_parser,
    flags_for,
    given_value,
    server_fields,
)
from tuner.sim.faultspec import add_fault_flags
from tuner.sim.profile import DEFAULT_PROFILE, resolve_profile_path

DEFAULT_STARTUP_SECONDS = 1.5

#: ServerArgs fields (namespace dests) that change what the simulator models; the rest are
#: accepted and reported only. Each exists in every version played, or is derived below.
MODELED = frozenset(
    {
        *("model_path", "tokenizer_path", "served_model_name", "context_length", "host"),
        *("port", "api_key", "skip_server_warmup", "random_seed", "enable_metrics"),
        *("enable_cache_report", "decode_log_interval", "stream_interval", "kv_cache_dtype"),
        *("mem_fraction_static", "max_running_requests", "max_queued_requests"),
        *("max_total_tokens", "chunked_prefill_size", "max_prefill_tokens", "page_size"),
        *("schedule_policy", "schedule_conservativeness", "disable_radix_cache"),
        *("disable_cuda_graph", "cuda_graph_max_bs", "cuda_graph_bs"),
        *("tp_size", "pp_size", "dp_size", "enable_hierarchical_cache"),
        *("hicache_ratio", "hicache_size", "hicache_write_policy"),
        *("enable_dp_attention", "load_balance_method", "disable_overlap_schedule"),
        *("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps"),
        *("speculative_eagle_topk", "speculative_num_draft_tokens"),
    }
)


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
    if not number >= 0 or math.isinf(number):  # nan and inf: the start-up would never end
        raise argparse.ArgumentTypeError(f"must be >= 0 and finite, got {value}")
    return number


def _int_in(value: str, low: int, high: int, out_of_range: str) -> int:
    """argparse's int (its own wording for a non-number), within [low, high]."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if not low <= number <= high:
        raise argparse.ArgumentTypeError(out_of_range.format(value=value[:20]))
    return number


def _port(value: str) -> int:
    """argparse type of --port: an integer TCP port (SGLang would fail later, at bind time)."""
    return _int_in(value, 1, 65535, "invalid port: {value} (expected 1 to 65535)")


def _bounded_int(value: str) -> int:
    """argparse's int, bounded: the capacity math divides in floats (10**40 overflowed them)."""
    return _int_in(value, -MAX_INT, MAX_INT, "invalid int value: {value}... (too large)")


def _finite_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"invalid float value: {value!r} (not finite)")
    return number


def build_parser(version: str = DEFAULT_VERSION) -> argparse.ArgumentParser:
    """The launch_server parser of that SGLang version (with `--config`) plus the simulator's
    `--sim-*` flags."""
    p = _Parser(prog="launch_server.py", description="Simulated SGLang server (no GPU).")
    add_to_parser(p, version)
    for action in p._actions:
        if action.dest == "port":
            action.type = _port  # an out-of-range port is a usage error, not a bind traceback
        elif action.type is int:
            action.type = _bounded_int
        elif action.type is float:
            action.type = _finite_float
    a = p.add_argument
    a("--sim-profile", type=str, default=DEFAULT_PROFILE, help="profile name or YAML path")
    a(
        "--sim-sglang-version",
        choices=KNOWN_VERSIONS,
        default=None,
        help=f"the SGLang version played (default: the profile's, else {DEFAULT_VERSION})",
    )
    a("--sim-startup-seconds", type=_non_negative_float, default=DEFAULT_STARTUP_SECONDS)
    a(
        "--sim-seed",
        type=int,
        default=None,
        help="noise seed (default: a fresh one per start, so runs differ as on real hardware)",
    )
    a(
        "--sim-acceptance",
        type=str,
        default=None,
        help="the profile's speculative acceptance kind the traffic plays (chat, code, ...; "
        "default: the profile's default_kind)",
    )
    add_fault_flags(a)
    return p


def profile_version(profile: str) -> str | None:
    """The SGLang version a profile names (None: it names none, or cannot be read: loading it
    later reports that with its own message)."""
    try:
        raw = yaml.safe_load(resolve_profile_path(profile).read_text())
    except (OSError, yaml.YAMLError, InputFileError):
        return None
    version = raw.get("version") if isinstance(raw, dict) else None
    return str(version) if version is not None else None


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


#: versions whose ConfigArgumentMerger reads the parser (python/sglang/srt/utils/
#: server_args_config_parser.py in 0.5.23): it refuses a key of an action that takes no single
#: value (BooleanOptionalAction and its `no-` keys, deprecated switches, --lora-paths), writes a
#: boolean of a flag that is not store_true as `--key true|false`, and a mapping as JSON.
#: 0.5.6.post2's merger gets an empty store_true list (server_args.py:4483 asks each argparse
#: action for an `.action` attribute it lacks), so any `true` is the bare flag, `false` nothing.
_PARSER_AWARE_CONFIG = frozenset({"0.5.23"})


def _config_keys(action: argparse.Action) -> set[str]:
    """The YAML keys that name an action: its dest and every long option, underscored."""
    longs = (o[2:] for o in action.option_strings if o.startswith("--"))
    return {action.dest, *(o.replace("-", "_") for o in longs)}


def _unsupported_keys(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Key -> action class, for the actions a parser-aware merger refuses."""
    ok = [
        a
        for a in parser._actions
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreAction)) or a.nargs is None
    ]
    ok_keys = {k for a in ok for k in _config_keys(a)}
    skip = {"--config", "--help"}
    return {
        k: type(a).__name__
        for a in parser._actions
        if a.option_strings and a not in ok and not skip & set(a.option_strings)
        for k in _config_keys(a)
        if k not in ok_keys
    }


def config_to_argv(
    path: str, parser: argparse.ArgumentParser, version: str = DEFAULT_VERSION
) -> list[str]:
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
    aware = version in _PARSER_AWARE_CONFIG
    unsupported = _unsupported_keys(parser) if aware else {}
    out: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if (action := unsupported.get(str(key).replace("-", "_"))) is not None:
            raise InputFileError(
                path, f"Unsupported config option '{key}' with action '{action}' (SGLang {version})"
            )
        if flag in store_true:
            if not isinstance(value, bool):
                raise InputFileError(path, f"{key}: expected true or false, got {value!r}")
            if value:
                out.append(flag)
        elif isinstance(value, bool) and not aware:
            out += [flag] if value else []
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)] if value else []
        elif value is None:
            raise InputFileError(path, f"{key}: has no value")
        elif isinstance(value, dict) and aware:
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return out


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a launch command line (with `--config` expanded) with the played version's table;
    raises FlagError or InputFileError. The namespace carries `sim_sglang_version`."""
    path, rest = _config_path(list(argv))
    guess = given_value(rest, "--sim-sglang-version")
    if guess not in KNOWN_VERSIONS:
        guess = profile_version(given_value(rest, "--sim-profile") or DEFAULT_PROFILE)
    version = guess if guess in KNOWN_VERSIONS else DEFAULT_VERSION
    for _ in range(2):  # once more if prefixes or the config file named another version
        ns = _parse(version, path, rest)
        played = ns.sim_sglang_version or profile_version(ns.sim_profile) or DEFAULT_VERSION
        if played not in KNOWN_VERSIONS:
            raise FlagError(
                "",
                f"launch_server.py: error: profile {ns.sim_profile} names SGLang {played}; "
                f"the simulator plays {', '.join(KNOWN_VERSIONS)} (--sim-sglang-version)",
            )
        if played == version:
            break
        version = played
    ns.sim_sglang_version = version
    ns.config = path
    _from_cli_args(ns, version)
    if ns.sim_seed is None:
        ns.sim_seed = random.SystemRandom().randrange(2**31)
    return ns


def _parse(version: str, path: str | None, rest: list[str]) -> argparse.Namespace:
    """Parse with that version's parser; the namespace keeps the argv it parsed (`launch_argv`),
    the file's flags in place of `--config FILE` as SGLang's merger puts them."""
    parser = build_parser(version)
    # Config first so that flags given on the command line override the file.
    argv = rest if path is None else config_to_argv(path, parser, version) + rest
    ns = parser.parse_args(argv)
    ns.launch_argv = list(argv)
    return ns


def _from_cli_args(ns: argparse.Namespace, version: str) -> None:
    """What SGLang does between parsing and its ServerArgs, and what the model reads.

    0.5.6.post2's `from_cli_args` copies `tensor_parallel_size` & co. to the fields `tp_size`
    & co. (the flag's alias names the field); a field without a flag keeps its declared default.
    Where SGLang resolves a None at start-up, the simulator uses what SGLang resolves it to on a
    standard model (`page_size` 1, `hicache_ratio` 2.0). Versions without
    `--cuda-graph-max-bs`/`--cuda-graph-bs` size decode graphs with the `-decode` flags, and
    `--cuda-graph-backend-decode disabled` disables them.
    """
    by_option = {o: f.dest for f in flags_for(version).values() for o in f.option_strings}
    for name, default in server_fields(version).items():
        if not hasattr(ns, name):
            dest = by_option.get("--" + name.replace("_", "-"))
            setattr(ns, name, getattr(ns, dest) if dest else default)
    if ns.page_size is None:  # ServerArgs resolves it (0.5.6.post2 server_args.py:1552)
        ns.page_size = 1
    if ns.hicache_ratio is None:  # 0.5.23's --hicache-ratio help: 2.0, 1.2 in buffer_only mode
        buffer_only = getattr(ns, "hicache_host_memory_mode", "cache") == "buffer_only"
        ns.hicache_ratio = 1.2 if buffer_only else 2.0
    if not hasattr(ns, "cuda_graph_max_bs"):
        ns.cuda_graph_max_bs = ns.cuda_graph_max_bs_decode
        ns.cuda_graph_bs = ns.cuda_graph_bs_decode
        ns.disable_cuda_graph = bool(
            ns.disable_cuda_graph
            or getattr(ns, "disable_decode_cuda_graph", False)
            or getattr(ns, "cuda_graph_backend_decode", None) == "disabled"
        )


def server_args_dict(ns: argparse.Namespace) -> dict[str, Any]:
    """Every ServerArgs field of the played version by SGLang's field name, with its value
    (what /get_server_info reports); sim flags and derived model inputs left out."""
    fields = server_fields(getattr(ns, "sim_sglang_version", DEFAULT_VERSION))
    return {name: getattr(ns, name, default) for name, default in fields.items()}
