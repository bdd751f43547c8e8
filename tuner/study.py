"""The optuna study: storage, resume, fingerprint, zombies, retries, dedupe, budgets, confirmation.

Outcomes map to optuna states in one place (`Tuning.objective`, per library-notes.md):

    measured (feasible or SLO missed), rejected by the pre-check,
    failed to start or died for the config's sake   -> COMPLETE, constraints say feasible or not
    infrastructure failure, or a load run not trusted -> FAIL, params re-enqueued (bounded)
    interrupted (Ctrl-C / SIGTERM)                   -> FAIL, server stopped, exit 130
    a config already measured                        -> COMPLETE, copied from the earlier trial
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.config import StudyConfig
from tuner.errors import ConfigError, InfraError, StudyMismatchError
from tuner.objective import CONSTRAINT_KEYS, TrialOutcome, TrialRunner
from tuner.space import (
    active_params,
    canonical,
    distributions,
    fingerprint,
    sample,
    sglang_defaults,
)

HEARTBEAT_S = 30
GRACE_S = 120
FINGERPRINT_ATTR = "tuner:fingerprint"
CONFIRM_ATTR = "tuner:confirmations"
IDENTITY_ATTR = "tuner:server_identity"
IDENTITY_KEYS = ("version", "gpu")
SERVER_ATTR = "tuner:server_pgid:"  # + worker: the live server a worker left running
PROBE_FACTOR = 1.5


def study_dir(cfg: StudyConfig, runs_dir: Path) -> Path:
    return runs_dir / cfg.study


def storage_url(cfg: StudyConfig, runs_dir: Path, override: str | None = None) -> str:
    """`--storage`, else the study file's `storage:`, else SQLite in runs/<study>/study.db."""
    url = override or cfg.storage
    if url:
        return url
    return f"sqlite:///{(study_dir(cfg, runs_dir) / 'study.db').resolve()}"


def make_storage(url: str, infra_retries: int) -> RDBStorage:
    """RDBStorage with a heartbeat, so a killed worker's trial becomes FAIL and is retried."""
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 20}}
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    import sqlalchemy.exc
    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random

    # workers started together on a fresh database race to create optuna's schema: the loser
    # sees "already exists" and simply tries again, finding the tables made
    schema_race = (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)

    @retry(retry=retry_if_exception_type(schema_race), stop=stop_after_attempt(5),
           wait=wait_random(0.2, 1.0), reraise=True)  # fmt: skip
    def create() -> RDBStorage:
        with warnings.catch_warnings():
            # the heartbeat is "experimental" since optuna 2.8; it is the documented way to resume
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                url,
                engine_kwargs=kwargs,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                    max_retry=infra_retries
                ),
            )

    return create()


def make_sampler(cfg: StudyConfig, seed: int | None = None) -> BaseSampler:
    s = cfg.sampler
    seed = s.seed if seed is None else seed
    if s.name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=s.n_startup_trials, multivariate=True, constant_liar=True
        )
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.name == "qmc":
        _require("scipy", "qmc")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(seed=seed, scramble=True)
    if s.name == "gp":
        _require("scipy", "gp")
        _require("torch", "gp")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=s.n_startup_trials)
    return optuna.samplers.GridSampler(_grid(cfg), seed=seed)


def _require(module: str, sampler: str) -> None:
    """Optional samplers need optional packages: say which, in one line, before anything runs."""
    try:
        __import__(module)
    except ImportError:
        raise ConfigError(
            f"sampler {sampler} needs the {module} package (pip install {module})",
            key="sampler.name",
        ) from None


def _grid(cfg: StudyConfig) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for name, dist in distributions(cfg.space).items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            grid[name] = list(dist.choices)
        elif getattr(dist, "step", None) and not getattr(dist, "log", False):
            n = round((dist.high - dist.low) / dist.step)
            grid[name] = [type(dist.low)(round(dist.low + i * dist.step, 10)) for i in range(n + 1)]
        else:
            raise ConfigError("grid search needs a step (or choices)", key=f"space.{name}")
    return grid


def directions(cfg: StudyConfig) -> list[str]:
    return ["maximize", "minimize"] if cfg.objective.pareto_latency else ["maximize"]


def open_study(
    cfg: StudyConfig, storage: optuna.storages.BaseStorage, sampler: BaseSampler
) -> optuna.Study:
    """Create the study, or load it after checking it was made from an equivalent study file."""
    study = optuna.create_study(
        study_name=cfg.study, storage=storage, sampler=sampler, directions=directions(cfg),
        load_if_exists=True,
    )  # fmt: skip
    mine = fingerprint(cfg)
    theirs = study.user_attrs.get(FINGERPRINT_ATTR)
    if theirs is None:
        study.set_user_attr(FINGERPRINT_ATTR, mine)
    elif theirs != mine:
        changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise StudyMismatchError(
            f"{cfg.source}: study '{cfg.study}' exists with a different {', '.join(changed)}; "
            "its trials would not be comparable. Give the study a new `study:` name "
            "(or another --runs-dir / --storage) to start afresh"
        )
    return study


def completed(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


@dataclass
class TuneStats:
    launched: int = 0
    rejected: int = 0
    duplicates: int = 0
    infra_failures: int = 0
    reused: int = 0


class Tuning:
    """Drives one `tuner tune` run: optuna asks, the runner measures, outcomes become states."""

    def __init__(
        self,
        cfg: StudyConfig,
        study: optuna.Study,
        runner: TrialRunner,
        trials_dir: Path,
        worker: str | None = None,
        on_trial: Callable[[FrozenTrial], None] | None = None,
        stop_group: Callable[[int], None] | None = None,
    ):
        self.cfg = cfg
        self.study = study
        self.runner = runner
        self.trials_dir = trials_dir
        self.worker = worker or f"{socket.gethostname()}"
        self.on_trial = on_trial
        self.stop_group = stop_group
        self.stats = TuneStats()
        self.confirm_error: str | None = None
        self._n_trials: int | None = None

    # --- start-up ---------------------------------------------------------------------------

    def recover(self) -> list[int]:
        """Fail this worker's zombie trials, stop the servers they left, re-enqueue their params."""
        recovered = []
        left = self.study.user_attrs.get(SERVER_ATTR + self.worker)
        if left and self.stop_group:
            self.stop_group(int(left))
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get("worker") != self.worker:
                continue  # another worker's: its heartbeat decides
            pgid = t.user_attrs.get("server_pgid")
            if pgid and self.stop_group:
                self.stop_group(int(pgid))
            with warnings.catch_warnings():
                # optuna warns that heartbeats belong to optimize(): failing a dead trial is fine
                warnings.simplefilter("ignore", UserWarning)
                self.study.tell(t.number, state=TrialState.FAIL)
            self.study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
            recovered.append(t.number)
        self.study.set_user_attr(SERVER_ATTR + self.worker, None)
        return recovered

    def enqueue_baseline(self, gpu_mem_mib: float | None = None) -> None:
        """Trial 0 is what runs today: the study file's baseline, else SGLang's defaults (the
        sampler picks whatever neither gives, such as the client's concurrency)."""
        if self.study.trials:
            return
        if self.cfg.baseline:
            params = active_params(self.cfg.baseline, self.cfg.space)
        else:
            params = sglang_defaults(self.cfg, gpu_mem_mib)
        if params:
            self.study.enqueue_trial(params, user_attrs={"baseline": True})

    def remaining(self, n_trials: int) -> int:
        return max(0, n_trials - len(completed(self.study)))

    # --- the loop -------------------------------------------------------------------------

    def optimize(self, n_trials: int, timeout_s: float | None) -> None:
        """Run until `n_trials` trials are complete in the study (across resumes) or time is up."""
        self._n_trials = n_trials
        if self.remaining(n_trials) == 0:
            return
        try:
            self.study.optimize(
                self.objective,
                timeout=timeout_s,
                catch=(InfraError,),
                callbacks=[MaxTrialsCallback(n_trials, states=(TrialState.COMPLETE,)), self._after],
                gc_after_trial=False,
            )
        finally:
            self.runner.stop()
            self.study.set_user_attr(SERVER_ATTR + self.worker, None)

    def objective(self, trial: Trial) -> float | tuple[float, ...]:
        """optuna's objective: sample, dedupe, run, and record."""
        params = sample(trial, self.cfg.space)
        trial.set_user_attr("worker", self.worker)
        earlier = self._measured(params, trial.number)
        if earlier is not None:
            self.stats.duplicates += 1
            trial.set_user_attr("duplicate_of", earlier.number)
            for k in ("status", "reason", "metrics", "server_info", "failure"):
                if k in earlier.user_attrs:
                    trial.set_user_attr(k, earlier.user_attrs[k])
            for key in CONSTRAINT_KEYS:
                trial.set_constraint(key, earlier.constraints.get(key, 1.0))
            return _ret(tuple(earlier.values))
        try:
            outcome = self.runner.run(
                trial.number,
                params,
                self.trials_dir / str(trial.number),
                on_start=self._started(trial),
            )
        except InfraError as exc:
            self.stats.infra_failures += 1
            trial.set_user_attr("infra_error", str(exc))
            raise
        self._check_identity(outcome.server_info)
        return self.record(trial, outcome)

    def _check_identity(self, info: Mapping[str, Any]) -> None:
        """SGLang version and GPU are part of what makes trials comparable: recorded when first
        seen, and a change (an upgraded SGLang, another GPU) stops the study."""
        seen_now = {k: str(info[k]) for k in IDENTITY_KEYS if info.get(k)}
        if not seen_now:
            return
        recorded = dict(self.study.user_attrs.get(IDENTITY_ATTR) or {})
        changed = [k for k in seen_now if k in recorded and recorded[k] != seen_now[k]]
        if changed:
            what = "; ".join(f"{k} was {recorded[k]}, now {seen_now[k]}" for k in changed)
            raise StudyMismatchError(
                f"{self.cfg.source}: the server changed under study '{self.cfg.study}' ({what}): "
                "its trials would not compare with the earlier ones; start a new study "
                "(a new `study:` name) for the new server"
            )
        if any(k not in recorded for k in seen_now):
            self.study.set_user_attr(IDENTITY_ATTR, {**recorded, **seen_now})

    def record(self, trial: Trial, outcome: TrialOutcome) -> float | tuple[float, ...]:
        attrs = outcome.attrs()
        for key in (
            "status",
            "reason",
            "failure",
            "metrics",
            "server_info",
            "restarted",
            "launched",
        ):
            trial.set_user_attr(key, attrs[key])
        if outcome.status == "rejected":
            self.stats.rejected += 1
        if outcome.launched:
            self.stats.launched += 1
        if outcome.status == "flagged":
            self.stats.infra_failures += 1
            trial.set_user_attr("infra_error", outcome.reason)
            raise _Untrusted(outcome.reason)
        for key in CONSTRAINT_KEYS:
            trial.set_constraint(key, outcome.constraints[key])
        return _ret(outcome.values)

    def _started(self, trial: Trial) -> Callable[[int], None]:
        def on_start(pgid: int) -> None:
            trial.set_user_attr("server_pgid", pgid)
            self.study.set_user_attr(SERVER_ATTR + self.worker, pgid)

        return on_start

    def _measured(self, params: Mapping[str, Any], number: int) -> FrozenTrial | None:
        key = canonical(params)
        for t in completed(self.study):
            if t.number != number and canonical(t.params) == key and t.values is not None:
                return t
        return None

    def _probe(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Queue the same server at a neighbouring concurrency: measuring it costs no restart."""
        spec = self.cfg.space.get("concurrency")
        probes_left = int(trial.user_attrs.get("probes_left", self.cfg.budget.concurrency_probes))
        status = trial.user_attrs.get("status")
        if spec is None or probes_left <= 0 or status not in ("ok", "slo_missed"):
            return
        if "concurrency" not in trial.params or trial.user_attrs.get("duplicate_of") is not None:
            return
        if self._n_trials is not None and self.remaining(self._n_trials) == 0:
            return
        c = int(trial.params["concurrency"])
        up = status == "ok"  # SLOs held: more load may still pay; missed: back off
        if spec.choices:
            ladder = sorted({int(x) for x in spec.choices})
            i = ladder.index(c) + (1 if up else -1) if c in ladder else -1
            if not 0 <= i < len(ladder):
                return
            target = ladder[i]
        else:
            target = round(c * PROBE_FACTOR) if up else round(c / PROBE_FACTOR)
            target = int(min(max(target, spec.low or 1), spec.high or target))
        if target == c:
            return
        params = {**trial.params, "concurrency": target}
        if self._measured(params, -1) is None:
            study.enqueue_trial(
                params, user_attrs={"probe_of": trial.number, "probes_left": probes_left - 1}
            )

    def _after(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Re-enqueue the params of a trial the infrastructure failed, a bounded number of times;
        probe concurrency on a server that just started."""
        if trial.state == TrialState.FAIL and "infra_error" in trial.user_attrs:
            retries = int(trial.user_attrs.get("retries", 0))
            if retries < self.cfg.budget.infra_retries:
                study.enqueue_trial(
                    dict(trial.params),
                    user_attrs={"retries": retries + 1, "retry_of": trial.number},
                )
        if trial.state == TrialState.COMPLETE and (
            trial.user_attrs.get("restarted") or "probe_of" in trial.user_attrs
        ):
            self._probe(study, trial)
        if self.on_trial:
            self.on_trial(trial)

    # --- confirmation -----------------------------------------------------------------------

    def confirm(self, top: int, repeats: int) -> dict[str, list[float]]:
        """Re-run the best few feasible configs `repeats` times; the study keeps every value."""
        # each worker writes its own record: workers sharing a study never overwrite each other
        key = f"{CONFIRM_ATTR}:{self.worker}"
        confirmations: dict[str, list[float]] = dict(self.study.user_attrs.get(key) or {})
        try:
            for t in top_trials(self.study, top):
                runs = confirmations.setdefault(str(t.number), [])
                while len(runs) < repeats:
                    outcome = self.runner.run(
                        t.number,
                        dict(t.params),
                        self.trials_dir / f"{t.number}-confirm{len(runs) + 1}",
                    )
                    runs.append(outcome.values[0] if outcome.feasible else 0.0)
                    self.study.set_user_attr(key, confirmations)
        except InfraError as exc:
            # the study itself is done: export what is confirmed so far rather than nothing
            self.stats.infra_failures += 1
            self.confirm_error = str(exc)
        finally:
            self.runner.stop()
        return confirmations


class _Untrusted(InfraError):
    """The load run flagged itself (client lag, error budget): discard, do not learn from it."""


def _ret(values: tuple[float, ...]) -> float | tuple[float, ...]:
    return values[0] if len(values) == 1 else values


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    return [
        t
        for t in completed(study)
        if t.values is not None and all(v <= 0 for v in t.constraints.values())
        and "duplicate_of" not in t.user_attrs
    ]  # fmt: skip


def top_trials(study: optuna.Study, top: int) -> list[FrozenTrial]:
    """The best `top` feasible trials by the first objective, one per distinct configuration."""
    seen: set[str] = set()
    out = []
    for t in sorted(feasible_trials(study), key=lambda t: t.values[0], reverse=True):
        key = canonical(t.params)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:top]


def all_confirmations(study: optuna.Study) -> dict[str, list[float]]:
    """Confirmation runs by trial number, merged over every worker's record."""
    merged: dict[str, list[float]] = {}
    for key, runs in study.user_attrs.items():
        if key.startswith(CONFIRM_ATTR + ":"):
            for trial, values in (runs or {}).items():
                merged.setdefault(trial, []).extend(values)
    return merged


def best_trial(study: optuna.Study) -> tuple[FrozenTrial | None, dict[str, Any]]:
    """The winner: highest mean of first measurement and confirmations; with the spread."""
    confirmations = all_confirmations(study)
    best, summary = None, {}
    for t in top_trials(study, max(len(confirmations), 1)):
        runs = [t.values[0], *confirmations.get(str(t.number), [])]
        mean = sum(runs) / len(runs)
        if best is None or mean > summary["mean"]:
            best = t
            summary = {
                "mean": mean,
                "runs": runs,
                "spread_pct": 100 * (max(runs) - min(runs)) / mean if mean else 0.0,
            }
    return best, summary


def existing_study(cfg: StudyConfig, runs_dir: Path, storage: str | None = None) -> optuna.Study:
    """Load a study that `tuner tune` made (never create one), checking its fingerprint."""
    url = storage_url(cfg, runs_dir, storage)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise ConfigError(
            f"no study '{cfg.study}' yet ({url.removeprefix('sqlite:///')} does not exist): "
            f"run `tuner tune {cfg.source}` first",
            file=cfg.source,
        )
    storage_obj = make_storage(url, cfg.budget.infra_retries)
    try:
        optuna.load_study(study_name=cfg.study, storage=storage_obj)
    except KeyError:
        raise ConfigError(f"no study named '{cfg.study}' in {url}", file=cfg.source) from None
    return open_study(cfg, storage_obj, make_sampler(cfg))
