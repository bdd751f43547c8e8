"""The optuna study object: storage (SQLite or any URL), sampler, create or resume, fingerprint.

Resuming is refused when the study file changed what makes trials comparable (the fingerprint:
space, server flags, workload, objective, target). What is done with the study lives elsewhere:
the loop in tuning.py, the queries over its trials in results.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from tuner.config import StudyConfig
from tuner.errors import ConfigError, StudyMismatchError
from tuner.space import distributions, fingerprint

HEARTBEAT_S = 30
GRACE_S = 120
FINGERPRINT_ATTR = "tuner:fingerprint"


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

    @retry(
        retry=retry_if_exception_type(schema_race),
        stop=stop_after_attempt(5),
        wait=wait_random(0.2, 1.0),
        reraise=True,
    )
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
        study_name=cfg.study,
        storage=storage,
        sampler=sampler,
        directions=directions(cfg),
        load_if_exists=True,
    )
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
