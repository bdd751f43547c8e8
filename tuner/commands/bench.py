"""`tuner bench`: one load run against a running server."""

from __future__ import annotations

import argparse

from tuner.cli import not_built


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="one load run against a running server")
    p.set_defaults(run=not_built("bench", "the load run, issue 5"))
