"""What every section of the study file shares: the strict base model, durations and the
bounds on numbers (a study file's value must not overflow the arithmetic it feeds)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

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


def parse_duration(value: str | float | int) -> float:
    """`90`, `90s`, `15m`, `8h`, `1d` -> seconds."""
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
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive and finite, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be at most 7d ({MAX_DURATION_S:g} s), got {value!r}")
    return seconds


Duration = Annotated[float, Field(gt=0, le=MAX_DURATION_S)]


class Model(BaseModel):
    """Strict, immutable base: unknown keys are errors, `true` is not 1, floats are finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _kind(value: Any) -> str:
    return f"a {type(value).__name__}" if isinstance(value, list | dict) else repr(value)


def number_problem(data: Any) -> tuple[list[str], str] | None:
    """The key path and the problem of the first whole number beyond `MAX_INT` in parsed YAML,
    or None. Containers are visited once each: an alias bomb is 10**9 items by reference."""
    seen: set[int] = set()
    stack: list[tuple[list[str], Any]] = [([], data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict | list):
            if id(node) in seen:
                continue
            seen.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend(([*path, str(k)], v) for k, v in reversed(list(items)))
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_INT:
            return (
                path,
                f"expected a number of at most 2**53, got one of {len(str(abs(node)))} digits",
            )
    return None
