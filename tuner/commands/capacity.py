"""`tuner capacity`: the KV-cache calculus of a deployment, with the naive reading beside it."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, InputFileError

EPILOG = """example (the motivating case):
  tuner capacity --model-config kimi-k2.5 --tp 8 --gpu-mem-mib 97887 \\
      --observed-tokens 116171 --observed-mfs 0.85 --mfs 0.90 --mfs 0.95 \\
      --hicache-size 300 --hicache-size 50 --host-ram-gb 449 --avg-len 4000 --avg-len 2000 \\
      --naive --observed-kv-gb 14.8
the same GPUs with DP attention and an EAGLE-3 draft, from that plain TP server's pool:
  tuner capacity --model-config kimi-k2.5 --tp 8 --dp 8 --dp-attention --gpu-mem-mib 97887 \\
      --observed-tokens 116171 --observed-mfs 0.85 --plain-basis --mfs 0.95 \\
      --draft-layers 1 --draft-weights-gib 0.5 --speculative-num-steps 3 \\
      --speculative-eagle-topk 1 --hicache-size 40 --host-ram-gb 449 --avg-len 4000
"""

#: the speculative algorithms with a draft model (`--speculative-algorithm`)
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


#: TP, DP and page sizes beyond this are typos (and the KV arithmetic would overflow)
MAX_PARALLEL = 4096
#: MiB, GB or GiB: any figure beyond this is beyond any machine
MAX_SIZE = 1e8


def register(sub: argparse._SubParsersAction) -> None:
    # fmt: off
    p = sub.add_parser(
        "capacity",
        help="KV pool, mfs projection, HiCache feasibility and admission, from SGLang's formulas",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-config", required=True, metavar="PATH|NAME",
                   help="Hugging Face config.json (or its folder), or a shipped name such as kimi-k2.5")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size (default 1)")
    p.add_argument("--dp", type=int, default=1,
                   help="data parallel size (default 1): replicas, or with --dp-attention groups")
    p.add_argument("--dp-attention", action="store_true",
                   help="SGLang --enable-dp-attention: the TP GPUs run attention in --dp groups "
                        "(attention TP = tp / dp), each group its own requests and pool")
    p.add_argument("--max-running-requests", type=int, metavar="N",
                   help="SGLang --max-running-requests (default: SGLang's; 48 under speculation)")
    p.add_argument("--kv-dtype", default="auto",
                   choices=["auto", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"], help="KV cache dtype")
    p.add_argument("--page-size", type=int, default=1, help="SGLang --page-size (default 1)")
    p.add_argument("--context-len", type=int, help="default: the model's max_position_embeddings")
    p.add_argument("--gpu-mem-mib", type=float, metavar="M",
                   help="GPU memory in MiB (nvidia-smi memory.total; read as free at init)")
    p.add_argument("--weights-gib", type=float, metavar="W", help="weights per GPU in GiB")
    p.add_argument("--observed-tokens", type=int, metavar="T",
                   help="max_total_num_tokens a real server reported (calibrates the projection)")
    p.add_argument("--observed-mfs", type=float, metavar="F", help="the mfs it was observed at")
    p.add_argument("--observed-kv-gb", type=float, metavar="G",
                   help="the rough KV size people quote (naive mode only)")
    p.add_argument("--mfs", type=float, action="append", default=[], metavar="F",
                   help="project the pool at this --mem-fraction-static (repeatable)")
    p.add_argument("--hicache-size", type=float, action="append", default=[], metavar="GB",
                   help="--hicache-size to judge, GB per rank as SGLang reads it (repeatable)")
    p.add_argument("--host-ram-gb", type=float, metavar="R", help="host RAM available, GB")
    p.add_argument("--avg-len", type=float, action="append", default=[], metavar="L",
                   help="average request length, prompt + output tokens (repeatable)")
    p.add_argument("--speculative-algorithm", choices=ALGORITHMS, metavar="ALGO",
                   help=f"speculative decoding with a draft: {', '.join(ALGORITHMS)} "
                        "(default EAGLE3 when a draft is described)")
    p.add_argument("--draft-layers", type=int, metavar="N", help="the draft's KV layers")
    p.add_argument("--draft-model-config", metavar="PATH|NAME",
                   help="the draft's config.json: its num_nextn_predict_layers or "
                        "num_hidden_layers give --draft-layers, its attention the 0.5.6.post2 "
                        "pool (an MTP draft: --speculative-algorithm NEXTN and the model's own)")
    p.add_argument("--draft-weights-gib", type=float, metavar="W",
                   help="the draft's weights per GPU in GiB (default 0)")
    for flag in ("num-steps", "eagle-topk", "num-draft-tokens"):
        p.add_argument(f"--speculative-{flag}", type=int, metavar="N",
                       help=f"SGLang --speculative-{flag} (default: SGLang's choice)")
    p.add_argument("--plain-basis", action="store_true",
                   help="--observed-tokens (or --weights-gib) are a plain TP server's, without "
                        "DP attention or the draft: add the draft's weights and what DP "
                        "attention replicates")
    p.add_argument("--dp-attention-extra-gib", type=float, metavar="G",
                   help="weights per GPU DP attention adds (default: estimated from the config)")
    p.add_argument("--naive", action="store_true",
                   help="also show the back-of-envelope reading (needs --observed-kv-gb)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(run=run)
    # fmt: on


def _check(args: argparse.Namespace) -> None:
    """Cross-flag rules argparse cannot express; each failure is one line naming the flag."""

    def bad(flag: str, msg: str) -> None:
        raise ConfigError(msg, key=flag)

    floats = (
        *("gpu_mem_mib", "weights_gib", "observed_mfs", "observed_kv_gb", "host_ram_gb"),
        *("draft_weights_gib", "dp_attention_extra_gib"),
    )
    for name in (*floats, "mfs", "hicache_size", "avg_len"):
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and not math.isfinite(value):
                bad("--" + name.replace("_", "-"), f"must be a finite number, got {value}")
    for flag, value in (("--tp", args.tp), ("--dp", args.dp), ("--page-size", args.page_size)):
        if not 1 <= value <= MAX_PARALLEL:
            bad(flag, f"must be an integer in 1..{MAX_PARALLEL:,}, got {value}")
    for name in ("gpu_mem_mib", "host_ram_gb", "weights_gib", "observed_kv_gb", "hicache_size"):
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and value > MAX_SIZE:
                # far beyond any machine: a typo, and its arithmetic would overflow
                bad("--" + name.replace("_", "-"), f"must be at most {MAX_SIZE:g}, got {value:g}")
    for flag, value in (
        ("--gpu-mem-mib", args.gpu_mem_mib),
        ("--host-ram-gb", args.host_ram_gb),
        ("--observed-kv-gb", args.observed_kv_gb),
        ("--context-len", args.context_len),
        ("--observed-tokens", args.observed_tokens),
    ):
        if value is not None and value <= 0:
            bad(flag, f"must be positive, got {value:g}")
    if args.weights_gib is not None and args.weights_gib < 0:
        bad("--weights-gib", f"must not be negative, got {args.weights_gib:g}")
    if (
        args.weights_gib is not None
        and args.gpu_mem_mib
        and args.weights_gib * 1024 >= args.gpu_mem_mib
    ):
        bad(
            "--weights-gib",
            f"{args.weights_gib:g} GiB of weights per GPU do not fit in --gpu-mem-mib "
            f"{args.gpu_mem_mib:g} ({args.gpu_mem_mib / 1024:.1f} GiB)",
        )
    for value in [*args.mfs, *([args.observed_mfs] if args.observed_mfs is not None else [])]:
        if not 0 < value < 1:
            bad(
                "--mfs" if value in args.mfs else "--observed-mfs",
                f"a fraction between 0 and 1 is expected, got {value:g}",
            )
    for value in args.hicache_size:
        if value < 0 or value != int(value):
            bad(
                "--hicache-size",
                f"SGLang takes a whole number of GB per rank (int >= 0), got {value:g}",
            )
    for value in args.avg_len:
        if value <= 0:
            bad("--avg-len", f"must be positive, got {value:g}")
    if (args.observed_mfs is None) != (args.observed_tokens is None):
        bad("--observed-mfs", "--observed-tokens and --observed-mfs go together")
    if args.observed_tokens is not None and args.gpu_mem_mib is None and args.mfs:
        bad("--gpu-mem-mib", "projecting --mfs from an observation needs the GPU memory")
    if args.naive and (args.observed_kv_gb is None or args.observed_tokens is None):
        bad(
            "--naive",
            "needs --observed-kv-gb and --observed-tokens (the figures people start from)",
        )
    if args.observed_kv_gb is not None and not args.naive:
        bad("--observed-kv-gb", "is the naive mode's rough figure: add --naive")
    _check_layout(args, bad)


def _speculative(args: argparse.Namespace) -> bool:
    """Is a draft described (an algorithm, its layers or its config)?"""
    return any(
        v is not None
        for v in (args.speculative_algorithm, args.draft_layers, args.draft_model_config)
    )


def _check_layout(args: argparse.Namespace, bad: Callable[[str, str], None]) -> None:
    """DP attention, the draft and the plain basis: what SGLang or the reading refuses."""
    from tuner.capacity.calculus import Parallel

    if args.dp_attention and (problem := Parallel(args.tp, args.dp, 1, True).problem()):
        bad("--dp", f"{problem} (SGLang asserts tp % dp == 0)")
    for flag in ("max_running_requests", "draft_layers", "speculative_num_steps",
                 "speculative_eagle_topk", "speculative_num_draft_tokens"):  # fmt: skip
        value = getattr(args, flag)
        if value is not None and not 1 <= value <= 10**6:
            bad("--" + flag.replace("_", "-"), f"must be an integer in 1..1,000,000, got {value}")
    for flag in ("draft_weights_gib", "dp_attention_extra_gib"):
        value = getattr(args, flag)
        if value is not None and not 0 <= value <= MAX_SIZE:
            bad("--" + flag.replace("_", "-"), f"must be in 0..{MAX_SIZE:g} GiB, got {value:g}")
    spec = _speculative(args)
    steps = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    if not spec and (args.draft_weights_gib is not None or any(getattr(args, f) for f in steps)):
        bad(
            "--speculative-algorithm",
            "the draft's weights and steps need a draft: --speculative-algorithm, "
            "--draft-layers or --draft-model-config",
        )
    if args.speculative_algorithm == "STANDALONE" and args.dp_attention and args.dp > 1:
        bad(
            "--speculative-algorithm",
            "STANDALONE does not support DP attention (SGLang refuses it)",
        )
    if args.draft_layers is not None and args.draft_model_config is not None:
        bad("--draft-layers", "give the draft's layers or its config, not both")
    if args.dp_attention_extra_gib is not None and not args.dp_attention:
        bad("--dp-attention-extra-gib", "is what DP attention adds: add --dp-attention")
    if args.plain_basis and not (spec or (args.dp_attention and args.dp > 1)):
        bad("--plain-basis", "needs --dp-attention or a draft: what the plain server lacked")
    if args.plain_basis and args.observed_tokens is None and args.weights_gib is None:
        bad("--plain-basis", "reads --observed-tokens or --weights-gib: give one of them")


def _check_observed(args: argparse.Namespace, observed: dict | None) -> None:
    """An observed pool must fit in its share of the GPU: else the numbers are not one server's."""
    if observed is None or args.observed_mfs is None or not args.gpu_mem_mib:
        return
    kv_gib = observed["kv_gib"]
    bytes_per_token = round(kv_gib * 2**30 / args.observed_tokens)
    share_gib = args.observed_mfs * args.gpu_mem_mib / 1024
    if kv_gib > share_gib:
        raise ConfigError(
            f"{args.observed_tokens:,} tokens x {bytes_per_token:,} B = {kv_gib:,.1f} GiB of KV "
            f"cannot fit in mfs {args.observed_mfs:g} x {args.gpu_mem_mib:g} MiB "
            f"({share_gib:,.1f} GiB): check the model config, --tp and --kv-dtype",
            key="--observed-tokens",
        )


def _load(name: str, flag: str) -> dict[str, Any]:
    """A config.json by path or shipped name, every failure one line naming the flag."""
    from tuner.capacity.models import load_model_config
    from tuner.config.yamlfile import special_file

    path = Path(name).expanduser()
    for candidate in (path / "config.json",) if path.is_dir() else (path,):
        if problem := special_file(candidate):  # a FIFO blocks, /dev/zero never ends
            raise ConfigError(problem, file=str(candidate), key=flag)
    try:
        return load_model_config(name)
    except InputFileError as exc:  # it names the file: the line names the flag that gave it
        raise ConfigError(str(exc), key=flag) from None
    except UnicodeDecodeError:  # capacity.models reads text without catching it
        raise ConfigError("not UTF-8 text", file=name) from None


def _draft(args: argparse.Namespace) -> Any:
    """The draft `--speculative-*` and `--draft-*` describe, or None."""
    from tuner.capacity.draftreading import DraftInputs

    if not _speculative(args):
        return None
    return DraftInputs(
        algorithm=args.speculative_algorithm or "EAGLE3",
        layers=args.draft_layers,
        config=(
            None
            if args.draft_model_config is None
            else _load(args.draft_model_config, "--draft-model-config")
        ),
        weights_gib=args.draft_weights_gib,
        num_steps=args.speculative_num_steps,
        eagle_topk=args.speculative_eagle_topk,
        num_draft_tokens=args.speculative_num_draft_tokens,
    )


def run(args: argparse.Namespace) -> int:
    from tuner.capacity.analysis import CapacityInputs, analyze
    from tuner.errors import ModelConfigError

    _check(args)
    config = _load(args.model_config, "--model-config")
    inputs = CapacityInputs(
        model_config=config,
        tp=args.tp,
        dp=args.dp,
        dp_attention=args.dp_attention,
        max_running_requests=args.max_running_requests,
        draft=_draft(args),
        plain_basis=args.plain_basis,
        dp_attention_extra_gib=args.dp_attention_extra_gib,
        kv_dtype=args.kv_dtype,
        page_size=args.page_size,
        gpu_mem_mib=args.gpu_mem_mib,
        weights_gib=args.weights_gib,
        observed_tokens=args.observed_tokens,
        observed_mfs=args.observed_mfs,
        observed_kv_gb=args.observed_kv_gb,
        mfs=tuple(args.mfs),
        hicache_sizes_gb=tuple(int(v) for v in args.hicache_size),
        host_ram_gb=args.host_ram_gb,
        avg_lens=tuple(args.avg_len),
        context_len=args.context_len,
        naive=args.naive,
    )
    try:
        report = analyze(inputs)
    except ModelConfigError as exc:
        where = args.draft_model_config if "draft" in str(exc) else args.model_config
        raise ConfigError(str(exc), file=where) from None
    except ValueError as exc:  # a draft's steps SGLang refuses
        raise ConfigError(str(exc), key="--speculative-num-steps") from None
    _check_observed(args, report.get("observed"))
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        from tuner.capacity.tables import render_capacity

        render_capacity(report, inputs)
    return 0
