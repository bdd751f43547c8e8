"""`tuner export`: write the best launch config."""

from __future__ import annotations

import argparse

from tuner.cli import not_built


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write the best launch config")
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study file")
    p.set_defaults(run=not_built("export", "the study, issue 6"))
