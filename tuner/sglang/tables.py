"""SGLang's launch flags as records, per version. Pure data.

Each version's complete table is `data/flags-<version>.json`, generated from that release's
`server_args.py` by `tuner.sglang.extract` (its docstring says how to regenerate it or add a
release): every argument `ServerArgs.add_cli_args` registers (option strings, dest, type,
default, choices, nargs, action, required, the source line) and every ServerArgs field with its
default (what `/server_info` reports). What the source does not say is kept here by hand:
which flags replaced one a release dropped (`REPLACED`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from tuner.sglang.argtypes import ACTIONS, BOOLEAN_OPTIONAL, type_parser

STORE_TRUE = "store_true"
#: actions whose default, when SGLang declares none, is False (argparse's, and SGLang's own)
_FALSE_BY_DEFAULT = (STORE_TRUE, "DeprecatedStoreTrueAction")

#: the versions with a table, oldest first (a test checks each has its data file)
VERSIONS: tuple[str, ...] = ("0.5.6.post2", "0.5.23")
BASE_VERSION = VERSIONS[0]

#: version -> flag it dropped -> the flags that replaced it (sglang-reference.md section 9; the
#: 0.5.23 fields `cuda_graph_max_bs_decode`/`_prefill`, `cuda_graph_bs_decode`/`_prefill`).
#: The first replacement takes the old flag's role (0.5.6.post2 captured decode graphs only:
#: `cuda_graph_runner.py`; 0.5.23 folds `cuda_graph_max_bs_decode` into the decode phase's
#: graphs, `arg_groups/cuda_graph_hook.py:72-73`). A dropped flag not listed here is reported
#: as gone; a renamed one (same ServerArgs field under a new option string) is found in the
#: tables themselves.
REPLACED: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.23": {
        "cuda-graph-max-bs": ("cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill"),
        "cuda-graph-bs": ("cuda-graph-bs-decode", "cuda-graph-bs-prefill"),
    },
}


@dataclass(frozen=True)
class Flag:
    """One launch flag as SGLang's argparse declares it.

    `name` is the canonical dashed name without `--` (SGLang's first option string); `aliases`
    are its other declared option strings; `dest` is the argparse dest (SGLang's field name,
    except 0.5.6.post2's `tensor_parallel_size` & co., which `from_cli_args` copies to
    `tp_size`). A store_true flag has `action="store_true"`, no type. `type_name` is the parser
    as SGLang's source names it (`int`, `json.loads`, `human_readable_int`); `src` is where the
    flag is declared (`python/sglang/srt/server_args.py:2125`).
    """

    name: str
    aliases: tuple[str, ...] = ()
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: tuple[Any, ...] | None = None
    nargs: str | int | None = None
    action: str | None = None
    help: str = ""
    required: bool = False
    dest: str = ""
    const: Any = None
    type_name: str = ""
    src: str = ""
    #: keyword arguments of SGLang's own actions (`new_flag`, `const_value`)
    action_kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.name.replace("-", "_"))

    @property
    def option_strings(self) -> tuple[str, ...]:
        """`--name` and every `--alias`, as declared."""
        return tuple(f"--{n}" for n in (self.name, *self.aliases))

    @property
    def registered(self) -> tuple[str, ...]:
        """Every option string argparse registers: BooleanOptionalAction adds `--no-NAME`."""
        if self.action != BOOLEAN_OPTIONAL:
            return self.option_strings
        return (*self.option_strings, *(f"--no-{n}" for n in (self.name, *self.aliases)))

    def add_to(self, parser: Any) -> None:
        """Register this flag on an argparse parser the way SGLang's `add_cli_args` does."""
        kwargs: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.default is not None or self.action is None:
            kwargs["default"] = self.default  # else the action's own default (argparse's None)
        if self.action == STORE_TRUE:
            kwargs["action"] = STORE_TRUE
        elif self.action is not None:
            kwargs["action"] = ACTIONS[self.action]
            kwargs.update(self.action_kwargs)
        if self.type is not None:
            kwargs["type"] = self.type
        for key in ("choices", "nargs", "const"):
            if (value := getattr(self, key)) is not None:
                kwargs[key] = list(value) if key == "choices" else value
        if self.required:
            kwargs["required"] = True
        parser.add_argument(*self.option_strings, **kwargs)


@dataclass(frozen=True)
class VersionTable:
    """One SGLang release: its flags in registration order, and ServerArgs' fields."""

    version: str
    flags: tuple[Flag, ...]
    #: ServerArgs field -> its declared default, in SGLang's field order
    fields: dict[str, Any]
    #: what the extractor could not evaluate statically (left open: any value is accepted)
    unresolved: tuple[str, ...]


def _flag(rec: dict[str, Any]) -> Flag:
    names = [o.removeprefix("--") for o in rec["opts"]]
    type_name = rec.get("type", "")
    choices = rec.get("choices")
    kwargs = tuple((k, rec[k]) for k in ("new_flag", "const_value") if k in rec)
    if rec.get("action") and "nargs" in rec and rec["nargs"] is None:
        kwargs += (("nargs", None),)  # SGLang's own action, told to take one value
    return Flag(
        names[0],
        tuple(names[1:]),
        type=type_parser(type_name) if type_name else None,
        # argparse's own default where SGLang gives none: False for a store_true
        default=rec.get("default", False if rec.get("action") in _FALSE_BY_DEFAULT else None),
        choices=tuple(choices) if choices is not None else None,
        nargs=rec.get("nargs"),
        action=rec.get("action"),
        required=bool(rec.get("required")),
        dest=rec["dest"],
        const=rec.get("const"),
        type_name=type_name,
        src=rec["src"],
        action_kwargs=kwargs,
    )


@cache
def load(version: str) -> VersionTable | None:
    """The table of one version (None when there is none); read once per process."""
    if version not in VERSIONS:
        return None
    # package data, read as such (this package does no I/O of its own)
    data = json.loads(files("tuner.sglang").joinpath("data", f"flags-{version}.json").read_text())
    return VersionTable(
        version,
        tuple(_flag(r) for r in data["flags"]),
        {f["name"]: f.get("default") for f in data["fields"]},
        tuple(data["unresolved"]),
    )
