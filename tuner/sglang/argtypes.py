"""The argparse types and actions SGLang's launch flags use, rewritten from their documented
behaviour (not SGLang's code) so a flag parses and fails as it does in SGLang. Pure.

A type keeps SGLang's function name: argparse names it in "invalid <name> value: 'x'".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

BOOLEAN_OPTIONAL = "BooleanOptionalAction"
DEPRECATED_SWITCH = "DeprecatedStoreTrueAction"
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def nullable_str(value: str) -> str | None:
    """`None`, `""` -> None (python/sglang/srt/utils/common.py)."""
    return None if not value or value == "None" else value


def human_readable_int(value: str) -> int:
    """`32k` -> 32000, `1Ki` -> 1024, `25.6k` -> 25600, `4096` -> 4096 (0.5.23's
    --context-length, --max-total-tokens, --max-prefill-tokens, --chunked-prefill-size)."""
    value = value.strip()
    match = _SUFFIXED.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), "
            "or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
        ) from None


def json_list_type(value: str) -> Any:
    """A JSON value given on the command line."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


def parse_cuda_graph_backend_arg(value: str) -> str:
    """0.5.23 --cuda-graph-backend-decode/-prefill: the retired backend is refused by name."""
    if value == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return value


def parse_cuda_graph_config_arg(value: str) -> dict[str, Any]:
    """0.5.23 --cuda-graph-config: a JSON object of phase -> settings (not validated further)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}"
        )
    return parsed


_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "json.loads": json.loads,  # argparse says "invalid loads value", as SGLang's does
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
    "json_list_type": json_list_type,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}


def type_parser(name: str) -> Callable[[str], Any]:
    """The parser for a type as SGLang's source names it; str for one not known here (the
    value is then accepted as given, as a string)."""
    return _TYPES.get(name, str)


def known_type(name: str) -> bool:
    return name in _TYPES


def _warn(option: str, new_flag: str | None) -> None:
    replacement = f" Use '{new_flag}' instead." if new_flag else ""
    print(
        f"'{option}' is deprecated and will be removed in a future release.{replacement}",
        file=sys.stderr,
    )


class LoRAPathAction(argparse.Action):
    """--lora-paths: each value a path, `name=path`, or a JSON object, kept as a list."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        paths: list[Any] = []
        for value in values or []:
            value = value.strip()
            paths.append(json.loads(value) if value.startswith("{") else value)
        setattr(namespace, self.dest, paths)


class DeprecatedStoreTrueAction(argparse.Action):
    """A deprecated boolean: stores True and warns, naming the replacement (0.5.23)."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        new_flag: str | None = None,
        nargs: int = 0,
        const: Any = True,
        default: Any = False,
        **kwargs: Any,
    ):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        _warn(option_string, self.new_flag)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """A deprecated spelling of one value of another flag: stores `const_value` (0.5.23)."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        new_flag: str | None = None,
        const_value: Any = None,
        nargs: int | None = 0,
        default: Any = None,
        **kwargs: Any,
    ):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        _warn(option_string, self.new_flag)
        setattr(namespace, self.dest, self.const_value)


ACTIONS: dict[str, type[argparse.Action]] = {
    BOOLEAN_OPTIONAL: argparse.BooleanOptionalAction,
    "LoRAPathAction": LoRAPathAction,
    DEPRECATED_SWITCH: DeprecatedStoreTrueAction,
    "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
}
