"""`tuner export`: the best configuration as SGLang `--config` YAML, a command line, or JSON."""

from __future__ import annotations

import argparse
import sys

from tuner.commands.common import add_study_args, load, output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write the best launch config (SGLang --config YAML)")
    add_study_args(p)
    p.add_argument(
        "-o", "--output", type=output_file, help="file to write (default: standard output)"
    )
    p.add_argument("--format", choices=["yaml", "cmd", "json"], default="yaml")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuner.export import export_data, render
    from tuner.study import existing_study

    cfg = load(args)
    text = render(export_data(cfg, existing_study(cfg, args.runs_dir, args.storage)), args.format)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
