"""`tuner status`: show a study's trials."""

from __future__ import annotations

import argparse

from tuner.cli import not_built


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show a study's trials")
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study file")
    p.set_defaults(run=not_built("status", "the study, issue 6"))
