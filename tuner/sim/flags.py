"""SGLang's launch flags (server_args.py, v0.5.6.post2) as the simulator parses them. Pure.

Real names, types, choices and defaults, so a flag SGLang rejects is rejected here too (exit 2,
argparse's message). `--tp`/`--dp` work as in SGLang: argparse prefix matching (allow_abbrev).
`--config FILE.yaml` is expanded the way SGLang's ConfigArgumentMerger does it: each key becomes
`--KEY` verbatim, store_true keys emit the bare flag when true and nothing when false, lists
become several values, and flags on the command line override the file. The `--sim-*` flags are
the simulator's own.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tuner.capacity import KV_DTYPES
from tuner.errors import InputFileError

SCHEDULE_POLICIES = ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority")
HICACHE_WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
HICACHE_MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
HICACHE_STORAGE_BACKENDS = ("file", "mooncake", "hf3fs", "nixl", "aibrix", "dynamic")
ATTENTION_BACKENDS = (
    "aiter", "ascend", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla", "torch_native",
    "triton", "trtllm_mha", "trtllm_mla",
)  # fmt: skip
QUANTIZATIONS = (
    "awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf",
    "modelopt", "modelopt_fp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "compressed-tensors",
    "mxfp4",
)  # fmt: skip

DEFAULT_PROFILE = "llama-3.1-8b-h100"
DEFAULT_STARTUP_SECONDS = 1.5


class FlagError(Exception):
    """argparse rejected the command line; `usage` and `message` are what argparse prints."""

    def __init__(self, usage: str, message: str):
        self.usage = usage
        self.message = message
        super().__init__(message)


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting so `main` returns the exit code (no sys.exit below the CLI)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise FlagError(self.format_usage(), f"{self.prog}: error: {message}")


def _fault_spec(value: str) -> str:
    # Reserved for injected faults; only the empty spec exists so far.
    if value.strip():
        raise argparse.ArgumentTypeError(f"unknown fault spec {value!r} (none are defined yet)")
    return ""


def _non_negative_float(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The launch_server parser: SGLang's flags plus the simulator's `--sim-*` flags."""
    p = _Parser(prog="launch_server.py", description="Simulated SGLang server (no GPU).")
    a = p.add_argument
    # model and tokenizer
    a("--model-path", "--model", type=str, required=True, help="model dir or hub id")
    a("--tokenizer-path", type=str, default=None)
    a("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow"])
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", type=str, default="auto",
      choices=["auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf",
               "bitsandbytes", "layered", "remote"])  # fmt: skip
    a("--trust-remote-code", action="store_true")
    a("--context-length", type=int, default=None)
    a("--is-embedding", action="store_true")
    a("--revision", type=str, default=None)
    a("--dtype", type=str, default="auto",
      choices=["auto", "half", "float16", "bfloat16", "float", "float32"])  # fmt: skip
    a("--quantization", type=str, default=None, choices=QUANTIZATIONS)
    a("--kv-cache-dtype", type=str, default="auto", choices=KV_DTYPES)
    a("--served-model-name", type=str, default=None)
    a("--chat-template", type=str, default=None)
    a("--device", type=str, default="cuda")
    # HTTP server
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--api-key", type=str, default=None)
    a("--skip-server-warmup", action="store_true")
    a("--watchdog-timeout", type=float, default=300)
    # memory and scheduling
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-queued-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", type=str, default="fcfs", choices=SCHEDULE_POLICIES)
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=1)
    a("--cuda-graph-max-bs", type=int, default=None)
    a("--cuda-graph-bs", type=int, nargs="+", default=None)
    a("--disable-cuda-graph", action="store_true")
    a("--enable-piecewise-cuda-graph", action="store_true")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--num-continuous-decode-steps", type=int, default=1)
    a("--attention-backend", type=str, default=None, choices=ATTENTION_BACKENDS)
    a("--stream-interval", type=int, default=1)
    a("--stream-output", action="store_true")
    a("--random-seed", type=int, default=None)
    # parallelism (no other flag starts with --tp / --dp, so those prefixes stay unambiguous)
    a("--tensor-parallel-size", "--tp-size", dest="tp_size", type=int, default=1)
    a("--pipeline-parallel-size", "--pp-size", dest="pp_size", type=int, default=1)
    a("--data-parallel-size", "--dp-size", dest="dp_size", type=int, default=1)
    a("--expert-parallel-size", "--ep-size", dest="ep_size", type=int, default=1)
    a("--enable-dp-attention", action="store_true")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", type=str, default=None)
    a("--base-gpu-id", type=int, default=0)
    a("--disable-custom-all-reduce", action="store_true")
    # logging and metrics
    a("--log-level", type=str, default="info")
    a("--log-requests", action="store_true")
    a("--show-time-cost", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--tool-call-parser", type=str, default=None)
    a("--reasoning-parser", type=str, default=None)
    # prefix cache and HiCache
    a("--disable-radix-cache", action="store_true")
    a("--enable-hierarchical-cache", action="store_true")
    a("--hicache-ratio", type=float, default=2.0)
    a("--hicache-size", type=int, default=0)
    a("--hicache-write-policy", type=str, default="write_through", choices=HICACHE_WRITE_POLICIES)
    a("--hicache-io-backend", type=str, default="kernel", choices=["direct", "kernel"])
    a("--hicache-mem-layout", type=str, default="layer_first", choices=HICACHE_MEM_LAYOUTS)
    a("--hicache-storage-backend", type=str, default=None, choices=HICACHE_STORAGE_BACKENDS)
    a("--hicache-storage-prefetch-policy", type=str, default="best_effort",
      choices=["best_effort", "wait_complete", "timeout"])  # fmt: skip
    # the simulator's own
    a("--config", type=str, default=None, help="SGLang YAML launch config (flat, dashed keys)")
    a("--sim-profile", type=str, default=DEFAULT_PROFILE, help="profile name or YAML path")
    a("--sim-startup-seconds", type=_non_negative_float, default=DEFAULT_STARTUP_SECONDS)
    a("--sim-seed", type=int, default=None,
      help="noise seed (default: a fresh one per start, so runs differ as on real hardware)")  # fmt: skip
    a("--sim-fault", type=_fault_spec, default="", help="reserved: injected faults")
    return p


def _config_path(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Find `--config X` / `--config=X` and return it with the remaining arguments."""
    rest: list[str] = []
    path: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return path, rest


def config_to_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """SGLang's YAML launch config as command-line arguments (see module docstring)."""
    if not path.endswith((".yaml", ".yml")):
        raise InputFileError(path, "config file must be YAML (.yaml or .yml)")
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise InputFileError(path, f"cannot read config file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputFileError(path, f"not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise InputFileError(path, "config file must hold a mapping at its root")
    store_true = {
        s
        for act in parser._actions
        if isinstance(act, argparse._StoreTrueAction)
        for s in act.option_strings
    }
    out: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if flag in store_true:
            if not isinstance(value, bool):
                raise InputFileError(path, f"{key}: expected true or false, got {value!r}")
            if value:
                out.append(flag)
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
        elif value is None:
            raise InputFileError(path, f"{key}: has no value")
        else:
            out += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return out


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a launch command line (with `--config` expanded); raises FlagError or InputFileError."""
    parser = build_parser()
    path, rest = _config_path(list(argv))
    if path is not None:
        # Config first so that flags given on the command line override the file.
        rest = config_to_argv(path, parser) + rest
    ns = parser.parse_args(rest)
    ns.config = path
    if ns.sim_seed is None:
        ns.sim_seed = random.SystemRandom().randrange(2**31)
    return ns


def server_args_dict(ns: argparse.Namespace) -> dict[str, Any]:
    """Every server arg by SGLang's field name (what /get_server_info reports), sim flags left out."""
    return {k: v for k, v in vars(ns).items() if not k.startswith("sim_") and k != "config"}
