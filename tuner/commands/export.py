"""`tuner export`: the best configuration as SGLang `--config` YAML, a command line, or JSON;
every trial as CSV."""

from __future__ import annotations

import argparse
import sys

from tuner.commands.common import add_study_args, guard_output, load, output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write the best launch config (SGLang --config YAML), or every trial as CSV"
    )
    add_study_args(p)
    p.add_argument(
        "-o", "--output", type=output_file, help="file to write (default: standard output)"
    )
    p.add_argument(
        "--format",
        choices=["yaml", "cmd", "json", "csv"],
        default="yaml",
        help="yaml, cmd, json: the winner; csv: every trial (params, state, status, reason, "
        "main metrics) with a header row",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuner.study.storage import existing_study

    cfg = load(args)
    guard_output(args, cfg, own="best.yaml")
    study = existing_study(cfg, args.runs_dir, args.storage)
    if args.format == "csv":
        from tuner.report.rows import trial_rows, trials_csv

        text = trials_csv(cfg, trial_rows(cfg, study))
    else:
        from tuner.report.export import export_data, render

        data = export_data(cfg, study)
        for warning in data.get("warnings", ()):  # also in the YAML header and the JSON
            print(f"tuner export: warning: {warning}", file=sys.stderr)
        text = render(data, args.format)
    if args.output:
        from tuner.report.export import write_text

        # newline="": the CSV's CRLF line ends stay as RFC 4180 has them
        write_text(args.output, text, newline="")
    else:
        sys.stdout.write(text)
    return 0
