"""`tuner sim`: the simulated SGLang server (its arguments are SGLang's launch flags)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    # Listed for --help only: cli.main hands `tuner sim ...` to tuner.sim before argparse runs.
    sub.add_parser(
        "sim", help="run the simulated SGLang server (SGLang's flags; see `tuner sim --help`)"
    )
