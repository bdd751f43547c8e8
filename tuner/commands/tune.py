"""`tuner tune`: create or resume a study, run it to its budget, export the winner."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from tuner.commands.common import add_study_args, load
from tuner.config.base import MAX_TRIALS, parse_duration
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
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="plain timestamped lines, one per event, instead of the live display (the default "
        "when stderr is not a terminal)",
    )
    p.add_argument(
        "--notify",
        metavar="CMD",
        type=_command,
        help="shell command run with a JSON summary on stdin when the run ends, fails or stops "
        "early (overrides the study file's notify.command)",
    )
    p.add_argument(
        "--virtual",
        action="store_true",
        help="run the study against the simulator's engine in virtual time (the launch must be "
        "`{python} -m tuner.sim --sim-profile NAME`): no processes, no HTTP, seconds per study",
    )
    # a fleet's worker (commands/tune_fleet.py): the fleet's process id; not for users
    p.add_argument("--fleet-of", type=int, help=argparse.SUPPRESS)
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


def _command(value: str) -> str:
    # "" would silently fall back to the study file's notify.command, or to none
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a shell command, got an empty one")
    return value


def _worker(value: str) -> str:
    from tuner.config.fleet import worker_problem  # a fleet's names follow the same rule

    if (problem := worker_problem(value)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (the trial's cleanup runs); a second Ctrl-C exits at once.

    The handler raises KeyboardInterrupt wherever the main thread is; inside a finalizer or a
    weakref callback Python only prints it ("Exception ignored in") and the run went on, with
    the next press then quitting without cleanup. So a swallowed one is delivered again.
    """
    pressed = {"n": 0}
    hook = sys.unraisablehook

    def on_signal(signum: int, frame: Any) -> None:
        pressed["n"] += 1
        if pressed["n"] > 1:
            os._exit(130)
        if not pressed.get("told"):
            pressed["told"] = 1
            print(
                "tuner: stopping after cleanup (press Ctrl-C again to quit at once)",
                file=sys.stderr,
            )
        raise KeyboardInterrupt

    def on_unraisable(u: Any) -> None:
        if u.exc_type is not KeyboardInterrupt or pressed["n"] != 1:
            return hook(u)
        pressed["n"] = 0  # not delivered: the next delivery is still the first press
        # from another thread, a moment later: outside the finalizer that swallowed it
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    sys.unraisablehook = on_unraisable
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for s, h in old.items():
            signal.signal(s, h)


def _budget(args: argparse.Namespace, cfg: Any) -> tuple[int, float | None]:
    if args.n_trials is not None and not 1 <= args.n_trials <= MAX_TRIALS:
        raise ConfigError(
            f"expected 1..{MAX_TRIALS:,} trials, got {args.n_trials}", key="--n-trials"
        )
    try:
        timeout = parse_duration(args.timeout) if args.timeout else cfg.budget.timeout
    except ValueError as exc:
        raise ConfigError(str(exc), key="--timeout") from None
    return args.n_trials or cfg.budget.n_trials, timeout


def run(args: argparse.Namespace) -> int:
    import optuna
    from rich.console import Console

    from tuner.api import Events, tune
    from tuner.watch.live import display_for
    from tuner.watch.notify import notify_for

    cfg = load(args)
    n_trials, timeout = _budget(args, cfg)
    console = Console(stderr=True, soft_wrap=True)
    # our own line per trial says more, and a failed trial is not a traceback the user must read
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if cfg.fleet is not None and args.worker is None:
        return _fleet(args, cfg, console, n_trials)
    if cfg.fleet is not None:  # one worker of the fleet: its own target
        from tuner.config.fleet import member_config

        cfg = member_config(cfg, args.worker)
    worker_of_fleet = args.fleet_of is not None
    if worker_of_fleet:
        from tuner.study.fleet import pdeathsig
        from tuner.watch.pipe import EventPipe

        pdeathsig(args.fleet_of)
    notify = None if worker_of_fleet else notify_for(args.notify, cfg.notify)
    display: Any = (
        EventPipe(sys.stdout) if worker_of_fleet else display_for(cfg, console, args.no_progress)
    )
    started = time.time()
    make_seams = None
    if args.virtual:
        from tuner.sim.virtual.study import virtual_seams

        make_seams = virtual_seams(cfg.sampler.seed if args.seed is None else args.seed)
    try:
        with interrupts(), display:
            result = tune(
                cfg,
                runs_dir=args.runs_dir,
                storage=args.storage,
                worker=args.worker,
                n_trials=n_trials,
                timeout_s=timeout,
                seed=args.seed,
                events=Events(display.trial, display.message, display.progress),
                make_seams=make_seams,
                export=not worker_of_fleet,  # the fleet writes best.yaml once
            )
    except BaseException as exc:
        if notify is not None:
            _notify(args, cfg, notify, display, started, exc=exc, n_trials=n_trials)
        raise
    say = display.message
    if result.confirm_error:
        say(f"confirmation stopped early: {result.confirm_error}")
    s = result.stats
    say(
        f"this run: {s.launched} launched, {s.rejected} rejected before launch, {result.reuses} "
        f"server reuses, {s.duplicates} duplicates answered, {s.infra_failures} infrastructure failures"
    )
    code = 0
    if worker_of_fleet:
        return code
    if result.best_path is None or result.best_yaml is None:
        say(f"no feasible configuration yet: see `tuner status {cfg.source}`")
        code = 1
    else:
        say(f"best launch config written to {result.best_path}:")
        sys.stdout.write(result.best_yaml)
        sys.stdout.flush()
    if notify is not None:
        this_run = {**asdict(s), "server_reuses": result.reuses}
        _notify(
            args,
            cfg,
            notify,
            display,
            started,
            exit_code=code,
            study=result.study,
            n_trials=n_trials,
            best_yaml=result.best_path,
            this_run=this_run,
        )
    return code


def _fleet(args: argparse.Namespace, cfg: Any, console: Any, n_trials: int) -> int:
    """A fleet file without --worker: every worker at once (commands/tune_fleet.py)."""
    from types import SimpleNamespace

    from tuner.commands.tune_fleet import run_fleet
    from tuner.watch.notify import notify_for

    notify = notify_for(args.notify, cfg.notify)
    started = time.time()
    say = SimpleNamespace(message=lambda text: console.print(text, markup=False, highlight=False))

    def send(**kw: Any) -> None:
        _notify(args, cfg, notify, say, started, n_trials=n_trials, **kw)

    return run_fleet(args, cfg, interrupts, send if notify is not None else None)


def _notify(
    args: argparse.Namespace,
    cfg: Any,
    notify: Any,
    display: Any,
    started: float,
    *,
    exc: BaseException | None = None,
    exit_code: int | None = None,
    study: Any = None,
    **kw: Any,
) -> None:
    """Send the run's summary; a notification that fails is one line, never the run's fate."""
    from tuner.report.summary import exit_code_of, message_of, readable_study, run_summary
    from tuner.watch.notify import send

    if exc is not None:
        study = readable_study(cfg, args.runs_dir, args.storage)
        exit_code = exit_code_of(exc)
    summary = run_summary(
        cfg,
        exc=exc,
        exit_code=exit_code if exit_code is not None else 0,
        message=None if exc is None else message_of(exc),
        started=started,
        ended=time.time(),
        study=study,
        **kw,
    )
    why = send(notify, summary)
    if why is not None:
        display.message(f"tuner: notify command failed ({why}); the study is not affected")
