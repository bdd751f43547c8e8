"""`tuner tune`: create or resume a study, run it to its budget, export the winner."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from tuner.commands.common import add_study_args, load
from tuner.config import parse_duration
from tuner.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="run an Optuna study (creates it, or resumes it when it exists)"
    )
    add_study_args(p, writes=True)
    p.add_argument(
        "--n-trials",
        type=_positive_int,
        help="completed trials wanted in the study, across resumes",
    )
    p.add_argument("--timeout", type=_duration, help="wall clock for this run: 8h, 90m, 3600")
    p.add_argument(
        "--worker", type=_worker, help="this worker's name (default: host name and target)"
    )
    p.add_argument("--seed", type=_seed, help="sampler seed (default: the study file's)")
    p.add_argument("--no-progress", action="store_true", help="no per-trial lines")
    p.set_defaults(run=run)


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _seed(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if not 0 <= n < 2**32:
        raise argparse.ArgumentTypeError(f"must be in 0..{2**32 - 1} (numpy's seeds), got {n}")
    return n


def _duration(value: str) -> str:
    # kept as text: _budget parses it (one parser for the file's and the flag's durations)
    try:
        parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _worker(value: str) -> str:
    if not value.strip() or len(value) > 200 or not value.isprintable():
        raise argparse.ArgumentTypeError(
            f"expected a printable name of 1 to 200 characters, got {value!r}"
        )
    return value


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (the trial's cleanup runs); a second Ctrl-C exits at once."""
    pressed = {"n": 0}

    def on_signal(signum: int, frame: Any) -> None:
        pressed["n"] += 1
        if pressed["n"] > 1:
            os._exit(130)
        print("tuner: stopping after cleanup (press Ctrl-C again to quit at once)", file=sys.stderr)
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _budget(args: argparse.Namespace, cfg: Any) -> tuple[int, float | None]:
    if args.n_trials is not None and args.n_trials < 1:
        raise ConfigError(f"must be at least 1, got {args.n_trials}", key="--n-trials")
    try:
        timeout = parse_duration(args.timeout) if args.timeout else cfg.budget.timeout
    except ValueError as exc:
        raise ConfigError(str(exc), key="--timeout") from None
    return args.n_trials or cfg.budget.n_trials, timeout


def run(args: argparse.Namespace) -> int:
    import optuna
    from rich.console import Console

    from tuner.api import Events, tune
    from tuner.progress import trial_line

    cfg = load(args)
    n_trials, timeout = _budget(args, cfg)
    console = Console(stderr=True, soft_wrap=True)
    # our own line per trial says more, and a failed trial is not a traceback the user must read
    optuna.logging.set_verbosity(optuna.logging.ERROR)

    def on_trial(trial: Any) -> None:
        if not args.no_progress:
            console.print(trial_line(cfg, trial), highlight=False)

    def on_message(text: str) -> None:
        console.print(text, highlight=False)

    with interrupts():
        result = tune(
            cfg,
            runs_dir=args.runs_dir,
            storage=args.storage,
            worker=args.worker,
            n_trials=n_trials,
            timeout_s=timeout,
            seed=args.seed,
            events=Events(on_trial, on_message),
        )
    if result.confirm_error:
        console.print(f"confirmation stopped early: {result.confirm_error}")
    s = result.stats
    console.print(
        f"this run: {s.launched} launched, {s.rejected} rejected before launch, {result.reuses} "
        f"server reuses, {s.duplicates} duplicates answered, {s.infra_failures} infrastructure failures"
    )
    if result.best_path is None or result.best_yaml is None:
        console.print(f"no feasible configuration yet: see `tuner status {cfg.source}`")
        return 1
    console.print(f"best launch config written to {result.best_path}:")
    sys.stdout.write(result.best_yaml)
    return 0
