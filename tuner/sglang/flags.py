"""SGLang's launch flags per version: lookup, name resolution, defaults, argparse. Pure.

The tables are SGLang's complete ones (`tables`, generated from each release's server_args.py).
Names here are dashed and without `--` (`mem-fraction-static`); functions that take a name also
accept it with `--`. A name resolves as SGLang's argparse resolves it (allow_abbrev): an exact
option string (`tp-size`, `model`), else a prefix of exactly one option string (`tp` ->
`tp-size` -> `tensor-parallel-size`); a prefix of several is ambiguous (`mod`: --model-path,
--model, --model-impl, ...; in 0.5.23 `cuda-graph-max-bs`: -decode and -prefill).

`effective_flags` turns a study's flags into the ones a server is launched with (full names,
HiCache as `hicache-size` says): a `LaunchFlags`, which every later step takes as it is.

Errors are `ConfigError`s (tuner.errors): `UnknownVersionError` for a version without a table,
`DuplicateFlagError` when one flag is given under two names.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from functools import cache
from itertools import pairwise
from typing import Any

from tuner.errors import ConfigError
from tuner.sglang.argtypes import BOOLEAN_OPTIONAL, DEPRECATED_SWITCH
from tuner.sglang.tables import BASE_VERSION, REPLACED, VERSIONS, Flag, VersionTable, load

__all__ = [
    "DEFAULT_VERSION",
    "KNOWN_VERSIONS",
    "DuplicateFlagError",
    "Flag",
    "LaunchFlags",
    "UnknownVersionError",
    "add_to_parser",
    "boolean_optional",
    "canonical_flag",
    "defaults",
    "effective_flags",
    "find_flag",
    "flags_for",
    "full_name",
    "full_names",
    "normalize_flags",
    "option_strings",
    "server_fields",
    "version_hint",
]

DEFAULT_VERSION = BASE_VERSION
KNOWN_VERSIONS: tuple[str, ...] = VERSIONS
#: argparse adds `--help` to SGLang's parser: it counts when a prefix is checked for ambiguity
_HELP = "help"


class UnknownVersionError(ConfigError):
    """No flag table for this SGLang version."""

    def __init__(self, version: str):
        self.version = version
        super().__init__(
            f"unknown SGLang version {version!r}: the tuner knows {', '.join(KNOWN_VERSIONS)}"
        )


class DuplicateFlagError(ConfigError):
    """One flag given twice under two of its names (`tp` and `tensor-parallel-size`)."""

    def __init__(self, canonical: str, names: tuple[str, str]):
        self.canonical = canonical
        self.names = names
        super().__init__(
            f"{names[0]} and {names[1]} are the same flag (--{canonical}): give it once",
            key=canonical,
        )


def _table(version: str) -> VersionTable:
    table = load(version)
    if table is None:
        raise UnknownVersionError(version)
    return table


@cache
def flags_for(version: str = DEFAULT_VERSION) -> dict[str, Flag]:
    """Every flag of that SGLang version, by canonical name, in SGLang's declaration order.
    (Cached: do not mutate the mapping.)"""
    return {f.name: f for f in _table(version).flags}


def server_fields(version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """ServerArgs' fields (what /server_info reports) with their declared defaults."""
    return dict(_table(version).fields)


@cache
def _options(version: str) -> dict[str, str]:
    """Every option string argparse registers (dashed, no `--`) -> its flag's canonical name;
    `help` -> ''. In registration order, as argparse lists an ambiguity's candidates."""
    out = {_HELP: ""}
    for flag in flags_for(version).values():
        out.update(dict.fromkeys((o.removeprefix("--") for o in flag.registered), flag.name))
    return out


def option_strings(version: str = DEFAULT_VERSION) -> frozenset[str]:
    """Every option string of that version's parser, dashed, without `--` (`help` included)."""
    return frozenset(_options(version))


def _resolve(name: str, options: Mapping[str, str]) -> str | None:
    name = name.removeprefix("--")
    if name in options:
        return options[name] or None
    hits = [o for o in options if name and o.startswith(name)]
    # argparse counts option strings, not flags: `mod` matches --model-path and --model
    return (options[hits[0]] or None) if len(hits) == 1 else None


def canonical_flag(name: str, version: str = DEFAULT_VERSION) -> str | None:
    """The canonical name of a flag given by name, alias or unique prefix; None if unknown or
    ambiguous (`tp` -> `tensor-parallel-size`, `model` -> `model-path`)."""
    return _resolve(name, _options(version))


def normalize_flags(flags: Mapping[str, Any], version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """The same flags under canonical names, in the same order.

    A name that does not resolve (unknown in that version, or ambiguous) is kept as given, for
    the checks that report it with what became of it (`version_hint`). Raises
    DuplicateFlagError when two names given resolve to the same flag.
    """
    options = _options(version)
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for name, value in flags.items():
        key = _resolve(name, options) or name
        if key in given:
            raise DuplicateFlagError(key, (given[key], name))
        given[key] = name
        out[key] = value
    return out


def find_flag(name: str, version: str | None = None) -> Flag | None:
    """The flag a name selects: in `version`'s table when that version is known, else in the
    default table, then in newer ones (newest first: a flag only they know, `enable-hicache`)."""
    if version in KNOWN_VERSIONS:
        versions: tuple[str, ...] = (version,)
    else:
        versions = (DEFAULT_VERSION, *reversed([v for v in KNOWN_VERSIONS if v != DEFAULT_VERSION]))
    for v in versions:
        if (canonical := canonical_flag(name, v)) is not None:
            return flags_for(v)[canonical]
    return None


def full_name(name: str) -> str:
    """SGLang's full (canonical) name of a flag given by name, alias or unique prefix, as the
    default table names it (else the newest table that knows it); unknown names as given.
    An export and a command line use it: `tp` works only through argparse's prefix matching,
    and 0.5.23's `--config` matches store_true keys by their exact option string."""
    flag = find_flag(name)
    return flag.name if flag is not None else name.removeprefix("--")


def full_names(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The same flags under `full_name`s, in the same order; DuplicateFlagError when two names
    given are one flag."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for name, value in flags.items():
        key = full_name(name)
        if key in given:
            raise DuplicateFlagError(key, (given[key], name))
        given[key] = name
        out[key] = value
    return out


#: flags that exist only to configure HiCache: dropped when `hicache-size` is 0 (HiCache off)
HICACHE_FLAG_PREFIX = "hicache-"
HICACHE_SIZE = "hicache-size"
HICACHE_ON = "enable-hierarchical-cache"
#: speculative decoding's flags; `speculative-algorithm: none` drops them all (effective_flags)
SPEC_FLAG_PREFIX = "speculative-"
SPEC_ALGORITHM = "speculative-algorithm"
SPEC_OFF = "none"


class LaunchFlags(dict[str, Any]):
    """The flags a server is launched with, normalized (`effective_flags`). A trial's flags are
    normalized once, where they enter it (`TrialRunner.flags_for`), and passed on as this: the
    pre-check, what a failure teaches and the launch read it as it is."""


def effective_flags(flags: Mapping[str, Any]) -> LaunchFlags:
    """The flags a server is launched with, from the study's fixed flags and a trial's values:
    every name as SGLang's full name (an alias or prefix as argparse resolves it), and two
    switches said by a value, wherever it was set (server: or space:), so a study can search
    "off" beside the settings:

    - HiCache as `hicache-size` says: a positive size turns `enable-hierarchical-cache` on; 0
      means HiCache off, so that flag and every `hicache-*` flag are dropped, even one fixed
      under server:;
    - `speculative-algorithm: none` means no speculative decoding (SGLang's default), so it
      and every `speculative-*` flag are dropped (the draft model's path fixed under server:
      too).

    The launch, the pre-check and the export all judge this set. Flags already normalized (a
    `LaunchFlags`) are returned as they are. Raises DuplicateFlagError for one flag under two
    names."""
    if isinstance(flags, LaunchFlags):
        return flags
    out = full_names(flags)
    size = out.get(HICACHE_SIZE)
    if size is not None and not isinstance(size, bool):
        if size:
            out[HICACHE_ON] = True
        else:
            out = _without(out, HICACHE_FLAG_PREFIX, HICACHE_ON)
    if speculation_off(out.get(SPEC_ALGORITHM)):
        out = _without(out, SPEC_FLAG_PREFIX)
    return LaunchFlags(out)


def speculation_off(algorithm: Any) -> bool:
    """Is this `speculative-algorithm` value the study file's "no speculative decoding"?"""
    return isinstance(algorithm, str) and algorithm.lower() == SPEC_OFF


def _without(flags: dict[str, Any], prefix: str, *names: str) -> dict[str, Any]:
    return {k: v for k, v in flags.items() if k not in names and not k.startswith(prefix)}


#: 0.5.23's spelling of DP attention (`--attn-dp-size D`), and the one it deprecated
ATTN_DP_SIZE = "attn-dp-size"
OLD_DP_ATTENTION = ("enable_dp_attention", "dp_size")


def spelled_for(flags: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    """The flags as `version` wants them written, so its `--config` and parser take them:

    - a flag the version dropped for others (`REPLACED`) under the one that took its role
      (0.5.23 refuses `--cuda-graph-max-bs` as ambiguous; `--cuda-graph-max-bs-decode`);
    - 0.5.23 reads `--enable-dp-attention --dp-size D` as `--attn-dp-size D` with dp_size 1
      (`arg_groups/parallel_hook.py:40-63`), warns that the switch is deprecated
      (`arg_groups/argparse_actions.py:95-100`) and its `--config` refuses the switch
      (`utils/server_args_config_parser.py:50-60`): it is said as `attn-dp-size`.

    An unknown version, and flags it takes as they are, are returned as given."""
    if version not in KNOWN_VERSIONS:
        return dict(flags)
    dropped = REPLACED.get(version, {})
    out = {dropped[k][0] if k in dropped else k: v for k, v in flags.items()}
    if canonical_flag(ATTN_DP_SIZE, version) is None:
        return out
    by_dest = {_dest(name, version): name for name in out}
    switch, size = (by_dest.get(dest) for dest in OLD_DP_ATTENTION)
    if switch is None or out[switch] is not True:
        return out
    groups = out[size] if size is not None else 1
    out = {k: v for k, v in out.items() if k not in (switch, size)}
    if groups != 1 and _dest(ATTN_DP_SIZE, version) not in {_dest(k, version) for k in out}:
        out[ATTN_DP_SIZE] = groups
    return out


def _dest(name: str, version: str) -> str | None:
    flag = find_flag(name, version)
    return flag.dest if flag is not None else None


def boolean_optional(name: str, version: str | None = None) -> bool:
    """Is the flag a `--x/--no-x` switch (argparse BooleanOptionalAction) in that SGLang
    version (None: as `find_flag` resolves it without one)? Its default may be None (SGLang
    decides) or True, so `false` must be said as `--no-x`, never by leaving the flag out."""
    flag = find_flag(name, version)
    return flag is not None and flag.action == BOOLEAN_OPTIONAL


def config_refuses(name: str, version: str | None = None) -> bool:
    """Does that version's `--config` refuse the key as a switch it cannot merge? 0.5.23's
    ConfigArgumentMerger takes only store_true and one-value actions
    (`utils/server_args_config_parser.py:50-60`): `--x/--no-x` switches and deprecated
    switches (`DeprecatedStoreTrueAction`) go on the command line."""
    flag = find_flag(name, version)
    return flag is not None and flag.action in (BOOLEAN_OPTIONAL, DEPRECATED_SWITCH)


def defaults(version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """Canonical name -> SGLang's default (None where SGLang computes one at start-up)."""
    return {name: flag.default for name, flag in flags_for(version).items()}


@cache
def _hints() -> dict[str, str]:
    """Flag -> what became of it, from each version's table against the one before it."""
    hints: dict[str, str] = {}
    for old, new in pairwise(VERSIONS):
        before, after = _by_option(old), _by_option(new)
        renamed = {f.dest: f.name for f in flags_for(new).values()}
        for name, flag in before.items():
            if name in after:
                continue
            successors = REPLACED.get(new, {}).get(name, ())
            if successors:
                split = " and ".join(f"--{s}" for s in successors)
                hints.setdefault(name, f"SGLang {new} split it into {split}")
            elif flag.dest in renamed:
                hints.setdefault(name, f"SGLang {new} calls it --{renamed[flag.dest]}")
            else:
                hints.setdefault(name, f"gone in SGLang {new}")
        older = {f.dest: f.name for f in before.values()}
        for name, flag in after.items():
            if name in before:
                continue
            was = older.get(flag.dest)
            text = f"; older versions call it --{was}" if was else ""
            hints.setdefault(name, f"new in SGLang {new}{text}")
    return hints


def _by_option(version: str) -> dict[str, Flag]:
    """Every registered option string (no `--`) -> its flag."""
    return {o.removeprefix("--"): f for f in flags_for(version).values() for o in f.registered}


def version_hint(flag: str) -> str | None:
    """What replaced a flag gone in a newer SGLang, or in which version a flag is new; None for
    a flag no version change concerns. `flag` is an exact name, with or without `--`."""
    return _hints().get(flag.removeprefix("--"))


def add_to_parser(parser: argparse.ArgumentParser, version: str = DEFAULT_VERSION) -> None:
    """Register every flag of that version the way SGLang's argparse does (types, choices,
    store_true, BooleanOptionalAction, nargs, aliases as extra option strings, SGLang's dests)."""
    for flag in flags_for(version).values():
        flag.add_to(parser)


def given_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `--flag X` / `--flag=X` as written in full (a first guess; prefixes and
    config files are settled by parsing again)."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
