"""`tuner status`: the trials of a study, as a table that fits the terminal, or JSON."""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from tuner.commands.common import add_study_args, load

#: the table's width when the output is not a terminal and COLUMNS is unset
DEFAULT_WIDTH = 100


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show a study's trials (state, params, throughput, reasons)")
    add_study_args(p)
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print JSON instead of a table")
    shown.add_argument(
        "--wide",
        action="store_true",
        help="every figure (TPOT, ITL, errors, KV pool, worker) and whole params and reasons",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tuner.report.rows import metric_unit, param_text, table_width, trial_rows, trials_table
    from tuner.study.storage import existing_study
    from tuner.verdict.gpuhours import gpu_time
    from tuner.verdict.winner import best_trial, held_note

    cfg = load(args)
    study = existing_study(cfg, args.runs_dir, args.storage)
    best, summary = best_trial(study)
    rows = trial_rows(cfg, study)
    spent = gpu_time(study.get_trials(deepcopy=False), study.user_attrs, summary.get("mean"))
    if args.json:
        out = {
            "study": cfg.study,
            "metric": cfg.objective.metric,
            "trials": rows,
            "best": None
            if best is None
            else {"trial": best.number, "params": rows[best.number]["params"], **summary},
            "gpu_hours": spent.as_json(),
        }
        json.dump(out, sys.stdout, indent=2, default=str)
        print()
        return 0
    width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    table = trials_table(cfg, rows, width, wide=args.wide)
    if args.wide:  # everything whole, however wide: `| less -S` scrolls it
        width = max(width, table_width(table))
    console = Console(width=width, soft_wrap=False)
    console.print(table)
    if best is not None:
        runs = summary["runs"]
        spread = f", spread {summary['spread_pct']:.1f}%" if len(runs) > 1 else ""
        console.print(
            f"best: trial #{best.number} {param_text(rows[best.number]['params'], short=False)}"
            f" -> {summary['mean']:,.1f} {metric_unit(cfg.objective.metric)} "
            f"{cfg.objective.metric} (mean of {len(runs)} run{'s' if len(runs) != 1 else ''}"
            f"{spread}{held_note(summary)})",
            highlight=False,
            markup=False,
        )
    else:
        console.print("no feasible trial yet: the table says why", highlight=False)
    console.print(spent.text(), highlight=False, markup=False)
    return 0
