"""Reading a YAML file the user wrote: UTF-8, safe, duplicate keys refused, one-line errors.

Every failure is a `ConfigError` naming the file (and line and column where YAML gives one).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys instead of keeping the last silently."""


def _no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            # `? [a, b]: 1`: no key of a study is a list or a mapping
            raise yaml.constructor.ConstructorError(
                None, None, "expected a plain key, not a list or mapping", key_node.start_mark
            )
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


def _int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
    except ValueError:  # Python refuses to parse an integer of more than 4300 digits
        raise yaml.constructor.ConstructorError(
            None, None, "integer too long", node.start_mark
        ) from None


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _int)

#: a study file is a few KB; a file this large is the wrong file (PyYAML parses ~5 MB/s)
MAX_YAML_BYTES = 1 << 20


def special_file(path: Path) -> str | None:
    """Why `path` cannot be read as a data file, when it is a FIFO, device or socket: reading
    one blocks forever (a FIFO) or never ends (/dev/zero). None for anything else (a missing
    file or a directory is left to the reader, which names it in its own words)."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # ValueError: a NUL byte in the path; the reader names it
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"{kind}, not a regular file"


def load_yaml(path: Path) -> Any:
    """Parse YAML safely; syntax errors become one line with file, line and column."""
    if problem := special_file(path):
        raise ConfigError(problem, file=str(path))
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("no such file", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from None
    except ValueError:  # a NUL byte in the name
        raise ConfigError("cannot read: the name holds a NUL byte", file=repr(str(path))) from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(
            f"larger than {MAX_YAML_BYTES >> 20} MiB: not a study file", file=str(path)
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x}): save the file as UTF-8",
            file=f"{path}:{line}",
        ) from None
    if not text.strip():
        raise ConfigError(
            "the file is empty: expected a study (study:, server:, space:)", file=str(path)
        )
    try:
        return yaml.load(
            text, Loader=_UniqueKeyLoader
        )  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"invalid YAML: {problem}", file=where) from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigError("invalid YAML: nested too deeply", file=str(path)) from None
