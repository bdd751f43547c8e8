"""Which keywords a seam takes (a test's fake may take fewer than the real one). Pure."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any


def takes_keywords(fn: Callable[..., Any], names: Sequence[str]) -> bool:
    """Does `fn` take every keyword in `names` (or **kwargs)?"""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(n in params for n in names)
