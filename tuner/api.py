"""The library entry point: `tune(cfg, ...)` runs a study the way `tuner tune` does.

This is the composition root: it builds the real seams from the validated study file (host,
server lifecycle, load run, pre-check facts, storage, sampler) and runs the loop. A test, a
notebook or another tool calls it with a `StudyConfig`; the command only parses arguments,
calls it and prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.capacity.calculus import GB
from tuner.capacity.models import hardware_of
from tuner.capacity.precheck import parse_meminfo, with_available_ram
from tuner.check.plan import before_night
from tuner.config.schema import StudyConfig
from tuner.config.validate import request_pool
from tuner.errors import ConfigError, HostUnreachable, InfraError
from tuner.loadgen.plan import refill_for, short_list_problem, study_load_options, unset_concurrency
from tuner.loadgen.result import Cut, LoadProgress, LoadResult
from tuner.loadgen.run import run_load_sync
from tuner.loadgen.workload import Request, requests_for
from tuner.outcome import Attr
from tuner.report.export import write_best
from tuner.search.mode import trial_time_problem
from tuner.search.sampler import make_sampler, reseed_on_resume
from tuner.server.endpoint import Endpoint
from tuner.server.kubeforward import kube_parts
from tuner.server.launch import server_log_path
from tuner.server.lifecycle import SCRIPT_SUFFIX, SECRETS_SUFFIX, Server
from tuner.server.nodes import NodesServer, nodes_server
from tuner.server.runtime import ContainerRuntime, Runtime
from tuner.server.startlog import StartupLog
from tuner.server.steps import following, slurm_parts
from tuner.server.target import Launch, endpoint_for, env_secret, host_for
from tuner.study.loop import Tuning, default_worker
from tuner.study.notices import trial_notices
from tuner.study.states import TuneStats
from tuner.study.storage import (
    DefaultURL,
    check_study_dir,
    make_storage,
    open_study,
    storage_url,
    study_dir,
)
from tuner.study.worklock import WorkerLock, home_of, lock_path, marker_for, others_alive
from tuner.trial.runner import TrialRunner
from tuner.verdict.trials import feasible_trials
from tuner.watch.events import ProgressEvent, RunStarted, TrialStarted

#: a trial is discarded when the client lags; 50 ms p99 flags healthy runs on a shared 2-core
#: machine, while a client that is really the bottleneck lags by far more
STUDY_MAX_LOOP_LAG_MS = 250.0
#: seconds /proc/meminfo may take to read on the target (the study's first command there)
MEMINFO_TIMEOUT_S = 30.0


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
    #: the live display's feed: tuner.watch.events events (run and trial starts, phases, the
    #: server's start-up milestones, the load run's progress)
    on_progress: Callable[[ProgressEvent], None] | None = None

    def say(self, text: str) -> None:
        if self.on_message:
            self.on_message(text)

    def progress(self, event: ProgressEvent) -> None:
        if self.on_progress:
            self.on_progress(event)


@dataclass
class Seams:
    """A study's real I/O, built from its file: host, server, the way to its port, runner."""

    host: Any
    server: Server | NodesServer
    runner: TrialRunner
    launch: Launch
    endpoint: Endpoint | None = None
    n_requests: int | None = None  # the study's request list's size (a warning reads it)
    #: what the study holds for the night (a Slurm allocation): taken when the run starts
    #: (`hold(say)`, once lost servers are stopped), given back when it ends (`release()`)
    hold: Callable[[Callable[[str], None]], None] | None = None
    release: Callable[[], None] | None = None
    meminfo: Callable[[], dict[str, int]] | None = None  # a simulated host's /proc/meminfo

    def stop_group(self, pgid: int, port: int) -> None:
        """Stop a server an earlier run of this worker left behind (by its process group)."""
        self.server.adopt(pgid, self.launch.marker, "", port)
        self.server.stop()

    def close(self, quiet: bool = False) -> None:
        """Stop the last server and close the host; `quiet`: the run is ending on an error
        already, which a host that is down (and so cannot stop the server) must not hide: the
        next run stops that server (its process group stays recorded)."""
        try:
            with contextlib.suppress(*((InfraError,) if quiet else ())):
                self.runner.stop()
                logs = getattr(self.server, "logs", None)  # a host's (a virtual server: none)
                if logs is not None:
                    logs.sweep()  # the last server's log was fetched when its trial ended
        finally:
            try:
                if self.release is not None:  # also after a failed stop: it ends the server too
                    with contextlib.suppress(*((InfraError,) if quiet else ())):
                        self.release()
            finally:
                try:
                    if self.endpoint is not None:
                        self.endpoint.close()
                finally:
                    if isinstance(self.server, NodesServer):
                        self.server.close()  # the other nodes' hosts
                    self.host.close()


def build_seams(cfg: StudyConfig, api_key: str | None, marker: str | None = None) -> Seams:
    """Host, server lifecycle, load run and trial runner for this study file; `marker` goes
    into every server's environment so a later run can find the ones this run loses."""
    requests = study_requests(cfg)
    hardware = hardware_of(cfg)
    host = host_for(cfg.target)
    launch = Launch.of(cfg.target)
    endpoint: Endpoint = endpoint_for(cfg.target, host)
    box = cfg.target.container  # the server in a container, stopped by name, found by label
    runtime: Runtime | None = None
    # a Slurm study's allocation: taken when the run starts, given back when it ends
    hold: Callable[[Callable[[str], None]], None] | None = None
    release: Callable[[], None] | None = None
    if box is not None:
        runtime = ContainerRuntime(host, box, launch.env, marker)
    elif cfg.target.slurm is not None:  # each server a step of the study's allocation
        slurm, endpoint = slurm_parts(cfg.target, host, launch.env, marker)
        runtime, hold, release = slurm, slurm.hold, slurm.release
    elif cfg.target.kubernetes is not None:  # each server a pod, reached by port-forward
        kube, endpoint = kube_parts(cfg.target, host, launch.env, marker)
        runtime, release = kube, kube.release  # no pod of the study outlives it
    server: Server | NodesServer = Server(
        host,
        cfg.target.timeouts,
        endpoint=endpoint,
        nvidia_smi=launch.nvidia_smi(cfg.target.port),  # the simulator's host: its own
        api_key=api_key,
        marker=marker,
        runtime=runtime,
        keep_logs=cfg.target.workdir is not None,  # else in the host's /tmp: removed when read
    )
    if cfg.target.nodes is not None:  # one server across nodes, rank 0 on nodes[0]
        host.close()
        server = nodes_server(cfg.target, api_key, marker)
        host, endpoint = server.host, server.rank0.endpoint
    run_load = load_runner(cfg, requests, api_key, endpoint)
    if release is not None:  # the server's node (a pod's forward) is known once it runs
        run_load = following(run_load, endpoint, cfg.target.port)
    runner = TrialRunner(
        cfg,
        server,
        run_load,
        endpoint.url(cfg.target.port),
        hardware,
        env=launch.env,
        secret_flags={"api-key": api_key} if api_key else None,
        launch_template=launch.template,
    )
    return Seams(host, server, runner, launch, endpoint, len(requests), hold, release)


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
    make_seams: Callable[[StudyConfig, str | None, str | None], Seams] | None = None,
    export: bool = True,
) -> TuneResult:
    """Create or resume the study, run it to its budget, confirm the best, write best.yaml.

    `make_seams(cfg, api_key, marker)` replaces `build_seams` (and the host checks before it):
    e.g. `tuner.sim.virtual.study.virtual_seams(seed)`, the study in virtual time. `export`
    False: no best.yaml (a fleet's worker: the fleet writes it once, when every worker ended).

    Raises TunerError for the user's mistakes (before anything is written), StudyBusyError when
    this study and worker already run elsewhere on this machine, HaltError when the world stops
    the study (resumable by calling again).
    """
    events = events or Events()
    worker = worker or default_worker(cfg.target.host)
    # everything a user can get wrong is checked before the first byte is written
    api_key = env_secret(cfg.target.api_key_env, "target.api_key_env", cfg.source)
    if (unset := unset_concurrency(cfg)) is not None:
        raise ConfigError(unset, file=cfg.source, key="workload.concurrency")
    sampler = make_sampler(cfg, seed)
    url = storage_url(cfg, runs_dir, storage)
    if make_seams is None:
        # SSH, the remote shell, the flags on the host's SGLang: nothing created yet
        before_night(cfg)
    out_dir = study_dir(cfg, runs_dir)
    check_study_dir(out_dir)
    seams = (make_seams or build_seams)(cfg, api_key, marker_for(cfg.study, worker, out_dir))
    ended = False
    try:
        study = open_study(cfg, make_storage(url, cfg.budget.infra_retries), sampler)
        reseed_on_resume(cfg, study, seed, worker)
        what = f"study '{cfg.study}' as worker '{worker}'"
        lock = lock_path(out_dir, worker)
        with WorkerLock(lock, what):
            tuning = Tuning(
                cfg,
                study,
                seams.runner,
                out_dir / "trials",
                worker,
                trial_notices(cfg, events.say, events.on_trial),
                lambda pgid: seams.stop_group(pgid, cfg.target.port),
                # the study's own file: every worker that can write it locks under out_dir;
                # a storage named by --storage or the file's storage: may be shared
                claim_unowned=(
                    (lambda: not others_alive(lock)) if isinstance(url, DefaultURL) else None
                ),
                on_progress=events.on_progress,
                say=events.say,
                home=home_of(out_dir),
            )
            watch_seams(seams, events)
            result = TuneResult(study, tuning.stats)
            _run(cfg, tuning, seams, result, events, n_trials or cfg.budget.n_trials, timeout_s)
            result.reuses = seams.runner.reuses
            if export and feasible_trials(study):
                result.best_path, result.best_yaml = write_best(cfg, study, out_dir)
                say_others_running(study, worker, events)
        ended = True
    finally:
        seams.close(quiet=not ended)
    return result


def say_others_running(study: optuna.Study, worker: str, events: Events) -> None:
    """A worker that ends while others of its study still run exports the study's best so far:
    say so, and how to get the final answer."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    others = sorted({str(t.user_attrs.get(Attr.WORKER)) for t in running} - {worker, "None"})
    if others:
        events.say(
            f"note: worker(s) {', '.join(others)} still run this study: this best.yaml is its "
            "best so far; `tuner export` with the same --storage once they end gives the final"
        )


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
    if seams.hold is not None:  # before the first trial: not in its time
        seams.hold(events.say)
    # read after the strays are gone: a lost server's pinned HiCache is not a tenant's
    judge_by_available_ram(seams, events)
    if (problem := trial_time_problem(cfg)) is not None:
        events.say(f"warning: {problem}")
    if seams.n_requests and (short := short_list_problem(cfg, seams.n_requests)) is not None:
        events.say(f"warning: {short}")
    result.recovered = tuning.recover()
    if result.recovered:
        events.say(
            f"resumed: trials {result.recovered} were left running; their params are queued again"
        )
        sweep_lost_logs(cfg, seams, tuning)
    tuning.enqueue_baseline(cfg.hardware.gpu_mem_mib)
    budget = cfg.budget
    timeout_s = timeout_s or budget.timeout
    events.progress(
        RunStarted(
            cfg.study,
            n_trials,
            timeout_s,
            cfg.objective.metric,
            budget.confirm_top * budget.confirm_repeats,
            tuple(tuning.study.get_trials(deepcopy=False)),
        )
    )
    tuning.optimize(n_trials, timeout_s)
    if budget.confirm_top and feasible_trials(tuning.study):
        n = budget.confirm_repeats
        started = tuning.on_progress
        header = [confirming(budget.confirm_top, n)]

        def on_confirm_run(event: TrialStarted) -> None:
            if header:  # said before the first run (a finished study's re-run starts none)
                events.say(header.pop())
            if started is not None:
                started(event)

        tuning.on_progress = on_confirm_run
        try:
            tuning.confirm(budget.confirm_top, n)
        finally:
            tuning.on_progress = started
        result.confirm_error = tuning.confirm_error


def sweep_lost_logs(cfg: StudyConfig, seams: Seams, tuning: Tuning) -> None:
    """A killed run never removed its servers' files from the host's /tmp (server/logs.py): its
    servers are stopped by now, so this worker's trials' files go (none of them is running)."""
    logs = getattr(seams.server, "logs", None)  # a virtual server writes none
    if logs is None or logs.keep or not tuning.trials_dir.is_dir():
        return
    trials = tuning.study.get_trials(deepcopy=False)
    # every start has a folder (trials/<n>, trials/<n>-confirm<k>), its log's name a hash of it
    for folder in tuning.trials_dir.iterdir():
        number = folder.name.split("-", 1)[0]
        if not number.isdigit() or int(number) >= len(trials):
            continue
        if trials[int(number)].user_attrs.get(Attr.WORKER) in (None, tuning.worker):
            log_path = server_log_path(None, cfg.study, int(number), str(folder.resolve()))
            logs.gone(log_path, also=(SCRIPT_SUFFIX, SECRETS_SUFFIX))
    logs.sweep()


def judge_by_available_ram(seams: Seams, events: Events) -> None:
    """Let the pre-check judge HiCache sizes by the host RAM available now (/proc/meminfo on
    the target; a simulator's, its profile's host), not only the total the study file states:
    another tenant's memory is not the server's. Unreadable: the study file's figure stands."""
    if seams.release is not None:
        return  # a Slurm study's host is the login node, a pod's this machine: not the server's
    if seams.launch.simulated:
        info = seams.meminfo() if seams.meminfo is not None else {}
    else:
        try:
            res = seams.host.run(["cat", "/proc/meminfo"], timeout=MEMINFO_TIMEOUT_S)
        except InfraError:
            return
        info = parse_meminfo(res.stdout) if res.ok else {}
    if "MemTotal" not in info or "MemAvailable" not in info:
        return
    runner = seams.runner
    before = runner.hardware.host_ram_gb
    runner.hardware = with_available_ram(runner.hardware, info["MemTotal"], info["MemAvailable"])
    now = runner.hardware.host_ram_gb
    if now is not None and now != before:
        said = (
            f"hardware.host_ram_gb {before:g}" if before is not None else "no hardware.host_ram_gb"
        )
        events.say(
            f"{'simulated ' * seams.launch.simulated}host RAM: {info['MemAvailable'] / GB:.1f} "
            f"GB of {info['MemTotal'] / GB:.1f} GB available now; HiCache sizes are judged by "
            f"{now:.1f} GB ({said})"
        )


def confirming(top: int, repeats: int) -> str:
    """`confirming the best config (1 more run)`, `... best 3 configs (2 more runs each)`."""
    runs = f"{repeats} more run{'s' if repeats != 1 else ''}"
    if top == 1:
        return f"confirming the best config ({runs})"
    return f"confirming the best {top} configs ({runs} each)"


def watch_seams(seams: Seams, events: Events) -> None:
    """Feed the live display: the runner's phases and load progress, and the starting
    server's log milestones read at each readiness poll (a lifecycle that has the hook)."""
    if events.on_progress is None:
        return
    seams.runner.on_progress = events.on_progress
    if hasattr(seams.server, "on_poll"):
        seams.server.on_poll = StartupLog(seams.server, seams.host, events.on_progress)


def study_requests(cfg: StudyConfig) -> list[Request]:
    """The study's one fixed request list (every trial sends the same requests; a window's run
    of a random or multi-turn kind tops it up, loadgen.plan.refill_for); its size is the one
    config.validate bounded. A dataset with fewer records than workload.num_requests is refused."""
    w = cfg.workload
    requests = requests_for(w, num_requests=request_pool(cfg))
    if w.num_requests is not None and len(requests) < w.num_requests:
        raise ConfigError(
            f"({w.num_requests:,}) asks for more requests than {w.dataset} holds "
            f"({len(requests):,} usable records); each is sent once: lower it",
            file=cfg.source,
            key="workload.num_requests",
        )
    return requests


def load_runner(
    cfg: StudyConfig, requests: list[Request], api_key: str | None, endpoint: Endpoint | None = None
) -> Callable[[str, Mapping[str, Any]], LoadResult]:
    """(base_url, client params) -> LoadResult, with the study's one fixed request list.

    A run during which the way to the server broke (an SSH tunnel dropped, or fell silent:
    found by opening one channel after the run) is the world's: HostUnreachable, not a
    measurement of the configuration."""

    def run(
        url: str,
        client: Mapping[str, Any],
        *,
        time_limit_s: float | None = None,
        on_phase: Callable[[str], None] | None = None,
        on_progress: Callable[[LoadProgress], None] | None = None,
        cut: Cut | None = None,
    ) -> LoadResult:
        options = study_load_options(
            cfg, client, api_key=api_key, max_loop_lag_ms=STUDY_MAX_LOOP_LAG_MS
        )
        breaks = endpoint.breaks() if endpoint is not None else 0
        result = run_load_sync(
            url,
            requests,
            options,
            time_limit_s=time_limit_s,
            on_phase=on_phase,
            on_progress=on_progress,
            more=refill_for(cfg.workload),
            cut=cut,
        )
        if endpoint is not None:
            # a link that fell silent mid-run (no reset) shows only when a channel is next
            # opened through it: open one now, so the run is judged on the way it was measured
            # through, not on one repaired before the next request (its requests hung, cut by
            # the window: a TTFT "miss" that was the world's)
            endpoint.connects(cfg.target.port, cfg.target.ssh.channel_timeout_s)
            if endpoint.breaks() != breaks:
                errors = result.metrics().errors
                raise HostUnreachable(
                    f"{endpoint.describe(cfg.target.port)} broke during the load run "
                    + (f"({errors} requests failed)" if errors else "(it went silent)")
                )
        return result

    return run
