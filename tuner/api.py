"""The library entry point: `tune(cfg, ...)` runs a study the way `tuner tune` does.

This is the composition root: it builds the real seams from the validated study file (host,
server lifecycle, load run, pre-check facts, storage, sampler) and runs the loop. A test, a
notebook or another tool calls it with a `StudyConfig`; the command only parses arguments,
calls it and prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner.capacity import kv_layout
from tuner.config import StudyConfig
from tuner.errors import ConfigError, ModelConfigError
from tuner.export import write_best
from tuner.lifecycle import Server
from tuner.loadgen import LoadResult, load_options, run_load_sync
from tuner.modelcfg import load_model_config
from tuner.precheck import Hardware, parallel_sizes
from tuner.results import feasible_trials
from tuner.runner import TrialRunner
from tuner.sglang.flags import normalize_flags
from tuner.study import make_sampler, make_storage, open_study, storage_url, study_dir
from tuner.studycheck import request_pool
from tuner.target import Launch, base_url, env_secret, host_for, http_host
from tuner.tuning import TuneStats, Tuning, default_worker
from tuner.workload import Request, requests_for
from tuner.worklock import WorkerLock, lock_path, marker_for, others_alive

#: a trial is discarded when the client lags; 50 ms p99 flags healthy runs on a shared 2-core
#: machine, while a client that is really the bottleneck lags by far more
STUDY_MAX_LOOP_LAG_MS = 250.0


@dataclass
class TuneResult:
    """What one `tune` call did, and where the winner was written (None: nothing feasible)."""

    study: optuna.Study
    stats: TuneStats
    reuses: int = 0
    recovered: list[int] = field(default_factory=list)
    confirm_error: str | None = None
    best_path: Path | None = None
    best_yaml: str | None = None


@dataclass(frozen=True)
class Events:
    """Optional presentation hooks (`tuner tune` prints them; a library caller may ignore them)."""

    on_trial: Callable[[FrozenTrial], None] | None = None
    on_message: Callable[[str], None] | None = None

    def say(self, text: str) -> None:
        if self.on_message:
            self.on_message(text)


@dataclass
class Seams:
    """The real I/O of a study, built from its file: the host, the server on it, the runner."""

    host: Any
    server: Server
    runner: TrialRunner
    launch: Launch

    def stop_group(self, pgid: int, port: int) -> None:
        """Stop a server an earlier run of this worker left behind (by its process group)."""
        self.server.adopt(pgid, self.launch.marker, "", port)
        self.server.stop()

    def close(self) -> None:
        try:
            self.runner.stop()
        finally:
            self.host.close()


def build_seams(cfg: StudyConfig, api_key: str | None, marker: str | None = None) -> Seams:
    """Host, server lifecycle, load run and trial runner for this study file; `marker` goes
    into every server's environment so a later run can find the ones this run loses."""
    requests = study_requests(cfg)
    hardware = hardware_of(cfg)
    host = host_for(cfg.target)
    launch = Launch.of(cfg.target)
    server = Server(
        host,
        cfg.target.timeouts,
        http_host=http_host(cfg.target),
        api_key=api_key,
        marker=marker,
    )
    runner = TrialRunner(
        cfg,
        server,
        load_runner(cfg, requests, api_key),
        base_url(cfg.target),
        hardware,
        env=launch.env,
        secret_flags={"api-key": api_key} if api_key else None,
        launch_template=launch.template,
    )
    return Seams(host, server, runner, launch)


def tune(
    cfg: StudyConfig,
    *,
    runs_dir: Path,
    storage: str | None = None,
    worker: str | None = None,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    seed: int | None = None,
    events: Events | None = None,
) -> TuneResult:
    """Create or resume the study, run it to its budget, confirm the best, write best.yaml.

    Raises TunerError for the user's mistakes (before anything is written), StudyBusyError when
    this study and worker already run elsewhere on this machine, HaltError when the world stops
    the study (resumable by calling again).
    """
    events = events or Events()
    worker = worker or default_worker(cfg.target.host)
    # everything a user can get wrong is checked before the first byte is written
    api_key = env_secret(cfg.target.api_key_env, "target.api_key_env")
    sampler = make_sampler(cfg, seed)
    url = storage_url(cfg, runs_dir, storage)
    seams = build_seams(cfg, api_key, marker_for(cfg.study, worker))
    try:
        study = open_study(cfg, make_storage(url, cfg.budget.infra_retries), sampler)
        out_dir = study_dir(cfg, runs_dir)
        what = f"study '{cfg.study}' as worker '{worker}'"
        lock = lock_path(out_dir, worker)
        with WorkerLock(lock, what):
            tuning = Tuning(
                cfg,
                study,
                seams.runner,
                out_dir / "trials",
                worker,
                events.on_trial,
                lambda pgid: seams.stop_group(pgid, cfg.target.port),
                # the study's own file: every worker that can write it locks under out_dir
                claim_unowned=None if storage else lambda: not others_alive(lock),
            )
            result = TuneResult(study, tuning.stats)
            _run(cfg, tuning, seams, result, events, n_trials or cfg.budget.n_trials, timeout_s)
            result.reuses = seams.runner.reuses
            if feasible_trials(study):
                result.best_path, result.best_yaml = write_best(cfg, study, out_dir)
    finally:
        seams.close()
    return result


def _run(
    cfg: StudyConfig,
    tuning: Tuning,
    seams: Seams,
    result: TuneResult,
    events: Events,
    n_trials: int,
    timeout_s: float | None,
) -> None:
    """Stop lost servers, recover zombies, seed trial 0, optimize, confirm the best."""
    for pgid, command in seams.server.stop_strays():
        events.say(f"stopped a server an earlier run left behind (pgid {pgid}: {command[:80]})")
    result.recovered = tuning.recover()
    if result.recovered:
        events.say(
            f"resumed: trials {result.recovered} were left running; their params are queued again"
        )
    tuning.enqueue_baseline(cfg.hardware.gpu_mem_mib)
    tuning.optimize(n_trials, timeout_s or cfg.budget.timeout)
    budget = cfg.budget
    if budget.confirm_top and feasible_trials(tuning.study):
        n = budget.confirm_repeats
        events.say(
            f"confirming the best {budget.confirm_top} configs "
            f"({n} more run{'s' if n != 1 else ''} each)"
        )
        tuning.confirm(budget.confirm_top, n)
        result.confirm_error = tuning.confirm_error


def study_requests(cfg: StudyConfig) -> list[Request]:
    """The study's one fixed request list (every trial sends the same requests); its size is
    the one studycheck bounded."""
    return requests_for(cfg.workload, num_requests=request_pool(cfg))


def load_runner(
    cfg: StudyConfig, requests: list[Request], api_key: str | None
) -> Callable[[str, Mapping[str, Any]], LoadResult]:
    """(base_url, client params) -> LoadResult, with the study's one fixed request list."""

    def run(
        url: str,
        client: Mapping[str, Any],
        *,
        time_limit_s: float | None = None,
        on_phase: Callable[[str], None] | None = None,
    ) -> LoadResult:
        rate = client.get("request-rate")
        options = load_options(
            cfg.workload,
            concurrency=int(client.get("concurrency", 1)),
            request_rate=None if rate is None else float(rate),
            api_key=api_key,
            max_loop_lag_ms=STUDY_MAX_LOOP_LAG_MS,
        )
        return run_load_sync(url, requests, options, time_limit_s=time_limit_s, on_phase=on_phase)

    return run


def hardware_of(cfg: StudyConfig) -> Hardware:
    """The pre-check's facts: bytes per token from the model config, GPU memory, host RAM."""
    hw = cfg.hardware
    bpt = None
    if hw.model_config_path:
        tp, _ = parallel_sizes(cfg.server)
        kv_dtype = str(normalize_flags(cfg.server).get("kv-cache-dtype", "auto"))
        if kv_dtype == "bfloat16":
            kv_dtype = "bf16"
        try:
            bpt = kv_layout(load_model_config(hw.model_config_path), tp, kv_dtype).bytes_per_token
        except ModelConfigError as exc:
            where = f"{hw.model_config_path}: {exc}"
            raise ConfigError(where, file=cfg.source, key="hardware.model_config") from None
    return Hardware(
        bytes_per_token=bpt,
        gpu_mem_mib=hw.gpu_mem_mib,
        host_ram_gb=hw.host_ram_gb,
        weights_gib=hw.weights_gib,
    )
