"""`tuner report`: an HTML report of a study (plots of the landscape, the trials table)."""

from __future__ import annotations

import argparse

from tuner.commands.common import add_study_args, guard_output, load, output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML report of a study")
    add_study_args(p)
    p.add_argument("-o", "--output", type=output_file, help="default: runs/<study>/report.html")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuner.report.page import write_html
    from tuner.study.storage import existing_study

    cfg = load(args)
    guard_output(args, cfg, own="report.html")
    study = existing_study(cfg, args.runs_dir, args.storage)
    path = write_html(cfg, study, args.output or args.runs_dir / cfg.study / "report.html")
    print(path)
    return 0
