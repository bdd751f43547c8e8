"""`tuner tune` of a study file with `fleet:` (and no `--worker`): one worker process per entry
(study/fleet.py), one display for all (watch/fleet.py), one best.yaml when every worker ended.

The study is opened (created, its fingerprint checked) here before any worker starts: a study
file that cannot resume is one line and exit 2, once, not once per worker. Each worker is
`tuner tune STUDY --worker NAME` with this run's options, so its failures, limits and halts are
its own; the command ends when all ended, with a line per worker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError

#: the hidden option that makes `tuner tune --worker NAME` a fleet's worker (events on stdout,
#: no best.yaml, no notification, dies with the fleet)
FLEET_OF = "--fleet-of"


def worker_argv(args: argparse.Namespace, runs_dir: Path, worker: str) -> list[str]:
    """A worker's command line: this run's study, storage, budget and seed, as the user gave
    them (a worker resolves the defaults as this run did)."""
    # `--flag=value`: a value that starts with '-' is still a value; the path made absolute
    study = os.path.abspath(args.study_file)
    argv = [sys.executable, "-m", "tuner", "tune", study, f"--worker={worker}"]
    argv += [f"--runs-dir={runs_dir}", f"{FLEET_OF}={os.getpid()}"]
    for flag, value in (
        ("--storage", args.storage),
        ("--n-trials", args.n_trials),
        ("--timeout", args.timeout),
        ("--seed", args.seed),
    ):
        if value is not None:
            argv.append(f"{flag}={value}")
    return argv


def run_fleet(
    args: argparse.Namespace,
    cfg: StudyConfig,
    interrupts: Callable[[], contextlib.AbstractContextManager[None]],
    notify: Callable[..., None] | None = None,
) -> int:
    """Run every worker of `cfg.fleet` against the one study; write best.yaml once at the end.
    `notify(exit_code=, study=, best_yaml=)` sends the run's summary (tune's --notify)."""
    import optuna
    import sqlalchemy.exc
    from rich.console import Console

    from tuner.report.export import write_best
    from tuner.search.sampler import make_sampler
    from tuner.study.fleet import FleetRun, ended_line, fleet_exit_code
    from tuner.study.storage import (
        check_study_dir,
        make_storage,
        open_study,
        storage_url,
        study_dir,
    )
    from tuner.verdict.trials import feasible_trials
    from tuner.watch.fleet import fleet_display_for

    assert cfg.fleet is not None
    if args.virtual:
        raise ConfigError(
            "runs one worker: add --worker NAME (one of the fleet's)", key="--virtual"
        )
    runs_dir = Path(args.runs_dir).absolute()
    url = storage_url(cfg, runs_dir, args.storage)
    out_dir = study_dir(cfg, runs_dir)
    check_study_dir(out_dir)

    def opened() -> optuna.Study:
        storage = make_storage(url, cfg.budget.infra_retries)
        return open_study(cfg, storage, make_sampler(cfg, args.seed))

    study = opened()  # created, or its fingerprint checked, before any worker starts

    def read_trial(number: int) -> Any:
        storage = study._storage
        try:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
            return storage.get_trial(trial_id)
        except (KeyError, optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError):
            return None  # the display misses a line; the study is not affected

    def read_trials() -> tuple[Any, ...]:
        try:
            return tuple(study.get_trials(deepcopy=False))
        except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError):
            return ()  # the display counts from zero; the study is not affected

    workers = cfg.fleet.names()
    console = Console(stderr=True, soft_wrap=True)
    display = fleet_display_for(cfg, workers, console, plain=args.no_progress)
    fleet = FleetRun(
        workers,
        lambda w: worker_argv(args, runs_dir, w),
        display,
        read_trial,
        read_trials=read_trials,
    )
    with interrupts(), display:
        display.message(
            None,
            f"study {cfg.study}: {len(workers)} workers, one process each: {', '.join(workers)}",
        )
        ends = fleet.run()
    code = fleet_exit_code(ends, fleet.interrupted)
    for end in ends:
        display.message(None, f"worker {end.worker}: {ended_line(end)}")
    best_path = None
    if not fleet.interrupted and any(e.code == 0 for e in ends):
        study = opened()  # afresh: the workers' last confirmations are in the storage now
        if feasible_trials(study):
            best_path, best_yaml = write_best(cfg, study, out_dir)
            display.message(None, f"best launch config written to {best_path}:")
            sys.stdout.write(best_yaml)
            sys.stdout.flush()
        else:
            display.message(None, f"no feasible configuration yet: see `tuner status {cfg.source}`")
            code = code or 1
    if notify is not None:
        notify(
            exc=ending(ends, fleet.interrupted), exit_code=code, study=study, best_yaml=best_path
        )
    return code


def ending(ends: list[Any], interrupted: bool) -> BaseException | None:
    """The fleet's end as the notify summary words one run's (report/summary.py): interrupted,
    stopped (a worker halted: each such worker's line), failed (every worker refused the same
    mistake), or None (every worker ended well)."""
    from tuner.errors import HaltError, TunerError
    from tuner.study.fleet import ended_line

    if interrupted:
        return KeyboardInterrupt()
    bad = [e for e in ends if e.code != 0]
    if not bad:
        return None
    why = "; ".join(f"worker {e.worker}: {ended_line(e)}" for e in bad)
    return (
        TunerError(why)
        if len(bad) == len(ends) and {e.code for e in bad} == {2}
        else HaltError(why)
    )
