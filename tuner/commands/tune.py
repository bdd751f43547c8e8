"""`tuner tune`: create or resume a study, run it to its budget, export the winner."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
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
    add_study_args(p)
    p.add_argument(
        "--n-trials", type=int, help="completed trials wanted in the study, across resumes"
    )
    p.add_argument("--timeout", help="wall clock for this run: 8h, 90m, 3600")
    p.add_argument("--worker", help="this worker's name (default: host name and target)")
    p.add_argument("--seed", type=int, help="sampler seed (default: the study file's)")
    p.add_argument("--no-progress", action="store_true", help="no per-trial lines")
    p.set_defaults(run=run)


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

    from tuner import runtime
    from tuner.export import export_data, render_yaml
    from tuner.objective import TrialRunner
    from tuner.lifecycle import Server
    from tuner.study import (
        Tuning,
        feasible_trials,
        make_sampler,
        make_storage,
        open_study,
        storage_url,
    )  # fmt: skip

    cfg = load(args)
    n_trials, timeout = _budget(args, cfg)
    console = Console(stderr=True, soft_wrap=True)
    # our own line per trial says more, and a failed trial is not a traceback the user must read
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    # everything a user can get wrong is checked before the first byte is written
    api_key = runtime.secret(cfg.target.api_key_env, "target.api_key_env")
    requests = runtime.requests_for(cfg)
    hardware = runtime.hardware(cfg)
    sampler = make_sampler(cfg, args.seed)
    host = runtime.build_host(cfg.target)
    url = storage_url(cfg, args.runs_dir, args.storage)
    study = open_study(cfg, make_storage(url, cfg.budget.infra_retries), sampler)
    out_dir = args.runs_dir / cfg.study
    worker = args.worker or f"{socket.gethostname()}:{cfg.target.host}"

    server = Server(host, runtime.server_timeouts(cfg.target), http_host=runtime.http_host(cfg.target),
                    api_key=api_key)  # fmt: skip
    runner = TrialRunner(
        cfg, runtime.ServerSeam(server, [api_key] if api_key else []),
        runtime.load_runner(cfg, requests, api_key),
        runtime.scorer(cfg), runtime.base_url(cfg.target), hardware,
        env=runtime.launch_env(cfg.target), secret_flags={"api-key": api_key} if api_key else None,
        launch_template=runtime.launch_template(cfg.target),
    )  # fmt: skip

    def stop_group(pgid: int) -> None:
        server.adopt(pgid, runtime.launch_marker(cfg.target), "", cfg.target.port)
        server.stop()

    def progress(trial: Any) -> None:
        if not args.no_progress:
            console.print(runtime.trial_line(cfg, trial), highlight=False)

    tuning = Tuning(cfg, study, runner, out_dir / "trials", worker, progress, stop_group)
    recovered = tuning.recover()
    if recovered:
        console.print(
            f"resumed: trials {recovered} were left running; their params are queued again"
        )
    tuning.enqueue_baseline(cfg.hardware.gpu_mem_mib)
    with interrupts():
        try:
            tuning.optimize(n_trials, timeout)
            if cfg.budget.confirm_top and feasible_trials(study):
                console.print(f"confirming the best {cfg.budget.confirm_top} configs "
                              f"({cfg.budget.confirm_repeats} more runs each)")  # fmt: skip
                tuning.confirm(cfg.budget.confirm_top, cfg.budget.confirm_repeats)
                if tuning.confirm_error:
                    console.print(f"confirmation stopped early: {tuning.confirm_error}")
        finally:
            runner.stop()
            host.close()
    s = tuning.stats
    console.print(
        f"this run: {s.launched} launched, {s.rejected} rejected before launch, {runner.reuses} "
        f"server reuses, {s.duplicates} duplicates answered, {s.infra_failures} infrastructure failures"
    )
    if not feasible_trials(study):
        console.print(f"no feasible configuration yet: see `tuner status {cfg.source}`")
        return 1
    text = render_yaml(export_data(cfg, study))
    best_path = out_dir / "best.yaml"
    best_path.write_text(text)
    console.print(f"best launch config written to {best_path}:")
    sys.stdout.write(text)
    return 0
