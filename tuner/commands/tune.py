"""`tuner tune`: run an Optuna study (create or resume)."""

from __future__ import annotations

import argparse

from tuner.cli import not_built


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="run an Optuna study (create or resume)")
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study file")
    p.set_defaults(run=not_built("tune", "the study, issue 6"))
