"""SGLang's launch flags per version: lookup, name resolution, defaults, argparse. Pure.

Names here are dashed and without `--` (`mem-fraction-static`); functions that take a name also
accept it with `--`. A name resolves as SGLang's argparse resolves it: the canonical name, an
alias (`tp-size`, `model`), or a prefix of exactly one option string (`tp` -> `tp-size` ->
`tensor-parallel-size`; `mod` is ambiguous between `--model-path` and `--model`). The tables hold
only the flags the tuner knows, so a prefix unique here could still be ambiguous in the full
SGLang; write full names where it matters (the tuner's own output always does).

Errors are `ConfigError`s (tuner.errors): `UnknownVersionError` for a version without a table,
`DuplicateFlagError` when one flag is given under two names.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tuner.errors import ConfigError
from tuner.sglang.tables import BASE_TABLE, BASE_VERSION, DELTAS, STORE_TRUE, Flag

__all__ = [
    "DEFAULT_VERSION",
    "KNOWN_VERSIONS",
    "DuplicateFlagError",
    "Flag",
    "UnknownVersionError",
    "add_to_parser",
    "canonical_flag",
    "defaults",
    "flags_for",
    "normalize_flags",
    "version_hint",
]

DEFAULT_VERSION = BASE_VERSION
KNOWN_VERSIONS: tuple[str, ...] = (BASE_VERSION, *DELTAS)
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


def flags_for(version: str = DEFAULT_VERSION) -> dict[str, Flag]:
    """Every flag of that SGLang version, by canonical name, in SGLang's declaration order."""
    if version == BASE_VERSION:
        return {f.name: f for f in BASE_TABLE}
    delta = DELTAS.get(version)
    if delta is None:
        raise UnknownVersionError(version)
    table = {n: f for n, f in flags_for(delta.base).items() if n not in delta.removed}
    for name, aliases in delta.new_aliases.items():
        table[name] = replace(table[name], aliases=(*table[name].aliases, *aliases))
    table.update((f.name, f) for f in delta.added)
    return table


def _options(version: str) -> dict[str, str]:
    """Every option string (dashed, no `--`) -> its flag's canonical name; `help` -> ''."""
    out = {_HELP: ""}
    for flag in flags_for(version).values():
        out.update(dict.fromkeys((flag.name, *flag.aliases), flag.name))
    return out


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

    A name that does not resolve (unknown to the tables, or ambiguous) is kept as given: the
    tables are not all of SGLang's flags, so SGLang itself is the judge of those. Raises
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


def defaults(version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """Canonical name -> SGLang's default (None where SGLang computes one at start-up)."""
    return {name: flag.default for name, flag in flags_for(version).items()}


def _hints() -> dict[str, str]:
    """Flag -> what became of it, from every version delta."""
    hints: dict[str, str] = {}
    for version, delta in DELTAS.items():
        for name, successors in delta.removed.items():
            split = " and ".join(f"--{s}" for s in successors)
            hints[name] = (
                f"SGLang {version} split it into {split}" if split else f"gone in SGLang {version}"
            )
        for flag in delta.added:
            hints[flag.name] = f"new in SGLang {version}"
        for name, aliases in delta.new_aliases.items():
            for alias in aliases:
                hints[alias] = f"new in SGLang {version}; older versions call it --{name}"
    return hints


def version_hint(flag: str) -> str | None:
    """What replaced a flag gone in a newer SGLang, or in which version a flag is new; None for
    a flag no version change concerns. `flag` is an exact name, with or without `--`."""
    return _hints().get(flag.removeprefix("--"))


def add_to_parser(parser: argparse.ArgumentParser, version: str = DEFAULT_VERSION) -> None:
    """Register every flag of that version the way SGLang's argparse does (types, choices,
    store_true, nargs, aliases as extra option strings, ServerArgs field names as dest)."""
    for flag in flags_for(version).values():
        kwargs: dict[str, Any] = {"dest": flag.dest, "default": flag.default, "help": flag.help}
        if flag.action == STORE_TRUE:
            kwargs["action"] = STORE_TRUE
        else:
            kwargs["type"] = flag.type
            if flag.choices is not None:
                kwargs["choices"] = list(flag.choices)
            if flag.nargs is not None:
                kwargs["nargs"] = flag.nargs
            if flag.required:
                kwargs["required"] = True
        parser.add_argument(*flag.option_strings, **kwargs)
