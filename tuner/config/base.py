"""What every section of the study file shares: the strict base model, durations and the
bounds on numbers (a study file's value must not overflow the arithmetic it feeds)."""

from __future__ import annotations

import datetime
import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.ASCII)
#: the longest wait or run any duration may ask for: a week (a night's budget, with room)
MAX_DURATION_S = 7 * 86400.0
#: the longest request length (tokens) without a model config to give the context length
MAX_TOKENS = 1_000_000
#: client concurrency beyond this is a typo, not a load (each slot is an open connection)
MAX_CONCURRENCY = 10_000
#: trials in one study: a night is ~50 restarts; beyond this a number is a typo
MAX_TRIALS = 100_000
#: points a stepped range may hold: beyond this a step is a typo (and its decimals overflow)
MAX_STEPS = 1_000_000
#: the largest whole number a study file may hold: floats represent every integer up to it,
#: and no count, size or flag of a study comes near it (10**400 has no float at all)
MAX_INT = 2**53


def parse_duration(value: str | float | int, zero_ok: bool = False) -> float:
    """`90`, `90s`, `15m`, `8h`, `1d` -> seconds (`zero_ok`: 0 too, a bound that is off)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a duration like 90s, 15m or 8h, got {_kind(value)}")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise ValueError(f"a duration must be at most 7d ({MAX_DURATION_S:g} s)")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = DURATION_RE.match(value)
        if not m:
            raise ValueError(f"expected a duration like 90s, 15m or 8h, got {value!r}")
        seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        which = "positive (or 0)" if zero_ok else "positive"
        raise ValueError(f"a duration must be {which} and finite, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be at most 7d ({MAX_DURATION_S:g} s), got {value!r}")
    return seconds


Duration = Annotated[float, Field(gt=0, le=MAX_DURATION_S)]
#: a duration where 0 turns the bound off (parsed here: a field of it needs no validator)
DurationOrOff = Annotated[
    float,
    BeforeValidator(lambda v: parse_duration(v, zero_ok=True)),
    Field(ge=0, le=MAX_DURATION_S),
]


class Model(BaseModel):
    """Strict, immutable base: unknown keys are errors, `true` is not 1, floats are finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _kind(value: Any) -> str:
    return f"a {type(value).__name__}" if isinstance(value, list | dict) else repr(value)


def number_problem(data: Any) -> tuple[list[str], str] | None:
    """The key path and the problem of the first value parsed YAML must not hold, or None: a
    whole number beyond `MAX_INT`, a NUL byte in a string (a path, argument or environment value
    holding one fails deep inside the OS call), a key that is not a string. Containers are
    visited once each: an alias bomb is 10**9 items by reference."""
    seen: set[int] = set()
    stack: list[tuple[list[str], Any]] = [([], data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict | list):
            if id(node) in seen:
                continue
            seen.add(id(node))
            for key in node if isinstance(node, dict) else ():
                if problem := _key_problem(key, path):
                    return path, problem
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend(([*path, str(k)], v) for k, v in reversed(list(items)))
        elif isinstance(node, str) and "\x00" in node:
            return path, f"{NUL}: expected text without one (got {node!r:.80})"
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_INT:
            return (
                path,
                f"expected a number of at most 2**53, got one of {len(str(abs(node)))} digits",
            )
    return None


NUL = "contains a NUL byte (\\x00)"
#: why YAML made a key that is not a string, for the keys YAML 1.1 reads as something else
_KEY_HINTS = {
    bool: "YAML 1.1 reads an unquoted yes, no, on, off, true or false as a boolean",
    type(None): "YAML reads an unquoted ~, null or an empty key as null",
    datetime.date: "YAML reads an unquoted date as a date",
    datetime.datetime: "YAML reads an unquoted timestamp as a date and time",
}


def _key_problem(key: Any, path: list[str]) -> str | None:
    if isinstance(key, str):
        return f"key {key!r} {NUL}" if "\x00" in key else None
    what = "a string flag name" if path in (["server"], ["space"], ["baseline"]) else "a string"
    hint = _KEY_HINTS.get(type(key), "YAML reads an unquoted number as a number")
    return f"key {key!r} must be {what} ({hint}): quote it"


def user_loc(loc: tuple[Any, ...], data: Any) -> list[str]:
    """pydantic's error location -> the key path in the user's mapping: the parts naming a union
    branch or a validator (`str`, `int`, `list[...]`, `function-after[...]`, `[key]`) are not
    keys the user wrote, and are dropped; a key the data lacks (a missing one) is kept."""
    out: list[str] = []
    node = data
    for part in loc:
        in_list = isinstance(node, list) and type(part) is int and 0 <= part < len(node)
        if in_list or (isinstance(node, dict) and part in node):
            node = node[part]
        elif isinstance(part, str) and _BRANCH_RE.match(part):
            continue
        else:
            node = None
        out.append(str(part))
    return out


_BRANCH_RE = re.compile(
    r"^(str|int|float|bool|bytes|none|\[key\]|[a-z-]+\[.*\]|"
    r"(function|tagged-union|constrained|lax|json|is-instance|literal|union)\b.*)$"
)
#: a union's branches' type errors, merged into one expectation
_EXPECTS = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a bool",
    "bool_parsing": "a bool",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "none_required": "null",
}


def merge_union(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The errors pydantic gives at one location, one per branch of a union -> one error: the
    expectation of every branch (`expected a string, a number or a bool`), or the first error
    that is not a type mismatch (a value of the right type that a check refused)."""
    if len(errors) == 1:
        return errors[0]
    for err in errors:
        if err["type"] not in _EXPECTS:
            return err
    names = list(dict.fromkeys(_EXPECTS[e["type"]] for e in errors))
    if "a number" in names and "a whole number" in names:
        names.remove("a whole number")
    expect = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return {**errors[0], "type": "union_type", "msg": f"expected {expect}"}


def got(value: Any, brief: str) -> str:
    """`(got VALUE)` for a type error, with YAML's reason when it typed a scalar by surprise."""
    if isinstance(value, datetime.date):
        return f"(got {brief}: {_KEY_HINTS.get(type(value), _KEY_HINTS[datetime.date])}; quote it)"
    return f"(got {brief})"


def image_reference(v: str) -> str:
    """A container image reference (a field validator of target.container and
    target.kubernetes): no leading '-' (an option to the runtime), no whitespace."""
    if not v or v.startswith("-") or any(c.isspace() for c in v):
        raise ValueError(f"expected an image reference such as lmsysorg/sglang:latest, got {v!r}")
    return v


#: digits and dots alone: resolvers read such a name as an IPv4 address, valid or not
_DOTTED_RE = re.compile(r"^[0-9.]+$", re.ASCII)


def host_problem(v: str, port_key: str) -> str | None:
    """Why `v` cannot name a host (an ssh_config alias, a name or an address), or None.

    Each of these would otherwise fail only at the first connection, as the world's failure
    after retries (exit 1) or, for `target.http_host`, on every trial of a night: an empty or
    spaced name, an option (`-o...`), a URL, `user@host`, `host:port` (`port_key` is where the
    port goes), an IPv6 address in brackets, and four numbers that are no IPv4 address (glibc
    reads `1.2.3` as 1.2.0.3, aiohttp refuses `999.0.0.1`)."""
    import ipaddress

    shown = f"expected a host name, an address or an ssh_config alias, got {v!r}"
    if not v.strip() or any(c.isspace() or not c.isprintable() for c in v):
        return shown
    if v.startswith("-"):
        return f"{shown}: a leading '-' reads as an option"
    if "/" in v:
        return f"{shown}: give the host alone, not a URL (the port is {port_key})"
    if "@" in v:
        return f"{shown}: give the user as target.ssh.user"
    if v.startswith("["):
        return f"{shown}: an IPv6 address goes without brackets"
    if ":" in v or _DOTTED_RE.match(v):
        try:
            ipaddress.ip_address(v)
        except ValueError:
            if ":" in v:
                return f"{shown}: give the port as {port_key}"
            return f"{shown}: not an IPv4 address"
    return None


def bool_choices(data: Any) -> Any:
    """A `{type: bool, choices: [...]}` search-space entry as it samples: both values are the
    plain bool; one alone is a list of one choice (categorical), so only it is sampled. Raises
    ValueError for choices that are not true/false."""
    if not isinstance(data, dict) or data.get("type") != "bool" or "choices" not in data:
        return data
    choices = data["choices"]
    if not isinstance(choices, list) or not choices:
        raise ValueError("a bool parameter's choices: expected a list of true and/or false")
    if bad := [c for c in choices if not isinstance(c, bool)]:
        raise ValueError(f"a bool parameter's choices are true and/or false (got {bad[0]!r:.40})")
    unique = list(dict.fromkeys(choices))
    if len(unique) == 2:
        return data  # both: the same as no choices (and the same fingerprint as before)
    return {**data, "type": "categorical", "choices": unique}


def hicache_problem(server: dict[str, Any]) -> str | None:
    """A fixed hicache-size that contradicts a fixed enable-hierarchical-cache. In a study the
    size decides (0 off, positive on: sglang.flags.effective_flags); SGLang itself reads `0` with the
    flag on as "size the host pool by hicache-ratio", so either reading would surprise."""
    from tuner.sglang.flags import full_name

    names = {full_name(k): k for k in server}
    size_key, on_key = names.get("hicache-size"), names.get("enable-hierarchical-cache")
    if size_key is None or on_key is None:
        return None
    size, on = server[size_key], server[on_key]
    if isinstance(size, bool) or not isinstance(size, int | float) or not isinstance(on, bool):
        return None  # a wrong type: the flag check names it
    if on and size == 0:
        return (
            f"server: {size_key}: 0 means HiCache off, but {on_key} is true (SGLang would size "
            "the host pool by hicache-ratio): drop one of them"
        )
    if not on and size > 0:
        return (
            f"server: {size_key}: a positive size turns HiCache on, but {on_key} is false: "
            "drop one of them"
        )
    return None


def port_problem(cfg: Any, port: int) -> str | None:
    """A server.port other than target.port, or a searched port: server.launch.build_launch puts
    target.port on the command line (where the tuner connects), so either would be lost."""
    if cfg.server.get("port", port) != port:
        section = "server"
    elif "port" in cfg.space:
        section = "space"
    else:
        return None
    return (
        f"{section}: port: the server listens on target.port ({port}), where the tuner "
        "connects: set the port there"
    )
