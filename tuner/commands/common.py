"""Arguments and loading shared by the commands that work on a study file."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.config import StudyConfig, load_study


def add_study_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study file")
    p.add_argument(
        "--runs-dir",
        default="runs",
        type=Path,
        help="outputs, one folder per study (default ./runs)",
    )
    p.add_argument("--storage", help="optuna storage URL (default: sqlite runs/<study>/study.db)")


def load(args: argparse.Namespace) -> StudyConfig:
    """The study file, validated; optuna's own INFO chatter silenced (our lines say more)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return load_study(args.study_file)
