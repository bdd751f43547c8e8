"""tuner.sglang.extract on small made-up SGLang trees of both layouts (no SGLang needed)."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.sglang.extract import extract, main

CLASSIC = """
import argparse
from dataclasses import dataclass, field
from sglang.srt.choices import POLICIES

@dataclass
class ServerArgs:
    model_path: str
    tp_size: int = 1
    policy: str = "fcfs"
    buckets: list = field(default_factory=list)

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", "--model", type=str, required=True)
        parser.add_argument(
            "--tensor-parallel-size", "--tp-size", type=int, default=ServerArgs.tp_size
        )
        choices = list(POLICIES) + ["x"]
        parser.add_argument("--policy", type=str, choices=choices, default=ServerArgs.policy)
        parser.add_argument("--on", action="store_true")
        parser.add_argument("--parsers", type=json.loads, choices=registry(1), nargs="+")
"""

FIELDS_SERVER_ARGS = """
from sglang.srt.arg_groups.fields.mem import Mem

_INPUT_NAMESPACES = [Mem]

class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--config", type=str)
"""

FIELDS_MEM = """
import argparse
from typing import List, Literal, Optional
import msgspec
from sglang.srt.arg_groups.arg_utils import A, Arg

class Mem(msgspec.Struct):
    _NS_PATH = "mem"
    a: A[bool, "a switch"] = False
    b: A[Optional[int], Arg(help="b", aliases=["--bee"], type_parser=human_readable_int)] = None
    c: A[Literal["x", "y"], "c"] = "x"
    d: A[List[int], "d"] = msgspec.field(default_factory=list)
    e: A[Optional[bool], Arg(help="e", action=argparse.BooleanOptionalAction)] = None
    f: A[int, Arg(no_cli=True)] = 0
    g: A[str, "required: no default"]
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_add_argument_calls_become_records(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "sglang/srt/server_args.py": CLASSIC,
            "sglang/srt/choices.py": 'POLICIES = ("fcfs", "lpm")\n',
        },
    )
    data = extract(root)
    flags = {f["dest"]: f for f in data["flags"]}
    assert flags["model_path"] == {
        "opts": ["--model-path", "--model"],
        "dest": "model_path",
        "src": "python/sglang/srt/server_args.py:15",
        "type": "str",
        "required": True,
    }
    assert flags["tensor_parallel_size"]["default"] == 1
    assert flags["policy"]["choices"] == ["fcfs", "lpm", "x"]  # a local, from an import
    assert flags["on"]["action"] == "store_true" and "default" not in flags["on"]
    assert flags["parsers"]["type"] == "json.loads" and "choices" not in flags["parsers"]
    assert data["unresolved"] == ["--parsers choices: registry(1)"]
    assert [(f["name"], f.get("default")) for f in data["fields"]] == [
        ("model_path", None),
        ("tp_size", 1),
        ("policy", "fcfs"),
        ("buckets", []),
    ]


def test_annotated_fields_become_arguments_in_field_order(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "sglang/srt/server_args.py": FIELDS_SERVER_ARGS,
            "sglang/srt/arg_groups/fields/mem.py": FIELDS_MEM,
            "sglang/srt/arg_groups/field_order.py": 'POSITIONAL_FIELD_ORDER = ("b",)\n',
        },
    )
    data = extract(root)
    flags = [{k: v for k, v in f.items() if k != "src"} for f in data["flags"]]
    assert flags == [
        {"opts": ["--b", "--bee"], "dest": "b", "type": "human_readable_int"},
        {"opts": ["--a"], "dest": "a", "default": False, "action": "store_true"},
        {"opts": ["--c"], "dest": "c", "default": "x", "type": "str", "choices": ["x", "y"]},
        {"opts": ["--d"], "dest": "d", "default": [], "type": "int", "nargs": "+"},
        {"opts": ["--e"], "dest": "e", "action": "BooleanOptionalAction"},
        {"opts": ["--g"], "dest": "g", "type": "str", "required": True},
        {"opts": ["--config"], "dest": "config", "type": "str"},
    ]
    assert [f["name"] for f in data["fields"]] == ["b", "a", "c", "d", "e", "f", "g"]


def test_main_writes_one_record_per_line(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "src",
        {
            "sglang/srt/server_args.py": CLASSIC,
            "sglang/srt/choices.py": 'POLICIES = ("fcfs",)\n',
        },
    )
    out = tmp_path / "flags-9.9.json"
    assert main([str(root), "9.9", str(out)]) == 0
    text = out.read_text()
    data = json.loads(text)
    assert data["version"] == "9.9" and len(data["flags"]) == 5
    assert sum(line.startswith('  {"opts"') for line in text.splitlines()) == 5
    assert main([]) == 2
