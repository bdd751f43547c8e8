"""The host's own SGLang flags, read from its `--help`, and the study's flag names resolved
against them as SGLang's argparse resolves them. Pure.

SGLang's parser is argparse: its help lists every option string in two places, the usage block
(`[--mem-fraction-static MEM_FRACTION_STATIC]`, first option string of each flag only) and the
options section (`  --tensor-parallel-size TENSOR_PARALLEL_SIZE, --tp-size ...`, every alias).
Both are read; help prose (indented to the help column) is not, so a flag a description merely
mentions is not taken for one the parser accepts.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from tuner.sglang.flags import KNOWN_VERSIONS, option_strings, version_hint

_OPTION = re.compile(r"(?<![\w-])--([A-Za-z0-9][A-Za-z0-9_.-]*)")
#: argparse indents invocations by 2 per section level; help prose starts at its help column
#: (24 by default), so a line indented less than this that starts with "-" is an invocation
_MAX_INVOCATION_INDENT = 8


def help_options(text: str) -> frozenset[str]:
    """Every `--option` string (dashed, without `--`) an argparse `--help` output lists."""
    found: set[str] = set()
    in_usage = False
    for line in text.splitlines():
        if line.startswith("usage:"):
            in_usage = True
        elif in_usage and not line.strip():
            in_usage = False
        if in_usage:
            found.update(_OPTION.findall(line))
            continue
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("-") and indent <= _MAX_INVOCATION_INDENT:
            invocation = re.split(r"\s{2,}", stripped, maxsplit=1)[0]
            found.update(_OPTION.findall(invocation))
    return frozenset(found)


def resolve(name: str, options: Iterable[str]) -> tuple[str | None, list[str]]:
    """(the option string `--name` selects, the candidates when it selects none).

    As argparse with allow_abbrev: an exact option string wins, else a prefix of exactly one
    option string; a prefix of several is ambiguous (they are returned), none is unknown ([]).
    """
    name = name.removeprefix("--")
    opts = set(options)
    if name in opts:
        return name, []
    hits = sorted(o for o in opts if name and o.startswith(name))
    return (hits[0], []) if len(hits) == 1 else (None, hits)


def flag_problem(name: str, options: frozenset[str]) -> str | None:
    """Why `--name` would be refused by the parser whose options these are (None: accepted),
    with what became of it in a newer SGLang, or the nearest real flag."""
    chosen, candidates = resolve(name, options)
    if chosen is not None:
        return None
    hint = version_hint(name)
    if candidates:
        shown = ", ".join(f"--{c}" for c in candidates[:4])
        more = f" and {len(candidates) - 4} more" if len(candidates) > 4 else ""
        text = f"ambiguous on the host's SGLang (could match {shown}{more})"
    else:
        text = "the host's SGLang has no such flag"
        near = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.75)
        if near and not hint:
            text += f"; did you mean --{near[0]}?"
    return f"{text} ({hint})" if hint else text


def version_problems(names: Iterable[str], version: str | None) -> list[str]:
    """`--name: why` for each flag SGLang `version`'s own parser would refuse, from the tuner's
    table of that version ([] for a version without one: SGLang itself is then the judge)."""
    if version not in KNOWN_VERSIONS:
        return []
    options = option_strings(version)
    problems = ((name, flag_problem(name, options)) for name in names)
    return [
        f"--{name}: " + problem.replace("the host's SGLang", f"SGLang {version}", 1)
        for name, problem in problems
        if problem is not None
    ]
