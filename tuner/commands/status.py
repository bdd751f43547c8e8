"""`tuner status`: the trials of a study, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from tuner.commands.common import add_study_args, load


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show a study's trials (state, params, throughput, reasons)")
    add_study_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tuner.report import trial_rows, trials_table
    from tuner.results import best_trial
    from tuner.study import existing_study

    cfg = load(args)
    study = existing_study(cfg, args.runs_dir, args.storage)
    best, summary = best_trial(study)
    if args.json:
        out = {
            "study": cfg.study,
            "trials": trial_rows(study),
            "best": None
            if best is None
            else {"trial": best.number, "params": best.params, **summary},
        }
        json.dump(out, sys.stdout, indent=2, default=str)
        print()
        return 0
    console = Console()
    console.print(trials_table(cfg, study))
    if best is not None:
        console.print(
            f"best: trial {best.number} {dict(best.params)} -> {summary['mean']:,.1f} {cfg.objective.metric}"
        )
    return 0
