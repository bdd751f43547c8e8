"""`tuner check`: everything that can be known before the night, one line per check."""

from __future__ import annotations

import argparse
import sys

from tuner.commands.common import writable_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="check a study file, its host, SGLang, GPUs, RAM, port and HTTP path before the night",
    )
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study file")
    p.add_argument(
        "--runs-dir",
        default="runs",
        type=writable_dir,  # as `tuner tune` takes it: a check must not pass what tune refuses
        help="the runs folder `tuner tune` will use (which leftover servers are its own)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print one line per check; exit 0 without a FAIL, 2 with one."""
    from tuner.check.lines import render
    from tuner.check.plan import run_checks

    lines = run_checks(args.study_file, runs_dir=args.runs_dir)
    sys.stdout.write(render(lines))
    return 2 if any(line.failed for line in lines) else 0
