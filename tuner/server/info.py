"""What a running SGLang server reports about itself (/get_server_info, /server_info). Pure.

The lifecycle verifies a fresh server through this: that it resolved the flags it was asked for,
and what it resolved (pool size, mfs). Newer SGLang versions move some fields into
`internal_states[0]`; both places are read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def values_match(asked: object, got: object) -> bool:
    """Compare a flag value with a resolved server arg: numbers with tolerance, lists by item."""
    if isinstance(asked, bool) or isinstance(got, bool):
        return bool(asked) == bool(got) if got is not None else asked is False
    if isinstance(asked, (list, tuple)):
        items = got if isinstance(got, (list, tuple)) else [got]
        return len(asked) == len(items) and all(
            values_match(a, b) for a, b in zip(asked, items, strict=True)
        )
    try:
        a, b = float(asked), float(got)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(asked) == str(got)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def mismatches(flags: Mapping[str, object], info: Mapping[str, Any]) -> list[str]:
    """`name: asked X, server has Y` for every asked flag the server resolved differently.

    Flags are dashed (`mem-fraction-static`), server args underscored; flags the server does
    not report are not checked.
    """
    out = []
    for name, asked in flags.items():
        key = name.lstrip("-").replace("-", "_")
        if asked is None or key not in info:
            continue
        if not values_match(asked, info[key]):
            out.append(f"{name}: asked {asked!r}, server has {info[key]!r}")
    return out


def internal(info: Mapping[str, Any], key: str) -> Any:
    """A field from the top level or from internal_states[0] (where newer versions put it)."""
    if info.get(key) is not None:
        return info[key]
    states = info.get("internal_states") or []
    if states and isinstance(states[0], Mapping):
        return states[0].get(key)
    return None


def as_int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def as_float(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None
