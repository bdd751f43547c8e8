"""`tuner report`: write an HTML report of a study."""

from __future__ import annotations

import argparse

from tuner.cli import not_built


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML report of a study")
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study file")
    p.set_defaults(run=not_built("report", "the study, issue 6"))
