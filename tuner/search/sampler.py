"""The study's sampler: built from `sampler:` (`make_sampler`), reseeded on resume so a resumed
run never replays its first proposals, and what a sampler needs before a study may start: its
optional packages, and for `grid` the grid itself (points of every searched parameter) and a
size the machine can enumerate. `config.validate` and `make_sampler` both ask it, so `tuner
check` refuses what `tuner tune` would."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import warnings
from typing import Any

import optuna
import optuna.distributions
from optuna.samplers import BaseSampler

from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError
from tuner.search.mode import sampled_space
from tuner.search.space import distributions

#: optuna's GridSampler lists every combination up front: beyond this the list alone is GBs,
#: and a night runs ~50 restarts of it anyway
MAX_GRID_POINTS = 100_000
#: the optional packages each sampler needs
PACKAGES = {"qmc": ("scipy",), "gp": ("scipy", "torch")}


def sampler_problem(cfg: StudyConfig) -> tuple[str, str] | None:
    """(key, problem) when the sampler cannot run this study here, else None."""
    name = cfg.sampler.name
    for module in PACKAGES.get(name, ()):
        if importlib.util.find_spec(module) is None:
            return (
                "sampler.name",
                f"sampler {name} needs the {module} package (pip install {module})",
            )
    if name == "grid":
        sizes = {p: len(points) for p, points in grid(cfg).items()}
        total = math.prod(sizes.values())
        if total > MAX_GRID_POINTS:
            parts = " x ".join(f"{n} ({p})" for p, n in sizes.items())
            return (
                "sampler.grid_points",
                f"the grid has {total:,} points ({parts}); at most {MAX_GRID_POINTS:,}: "
                "lower grid_points, widen steps or drop choices",
            )
    return None


def require_packages(cfg: StudyConfig) -> None:
    """Raise ConfigError (file and key) when the sampler cannot run here."""
    if (problem := sampler_problem(cfg)) is not None:
        raise ConfigError(problem[1], file=cfg.source or None, key=problem[0])


def grid(cfg: StudyConfig) -> dict[str, list[Any]]:
    """Every searched parameter's grid: its choices, its steps, or `sampler.grid_points` points
    spread over the range (on the log scale for a log range, e.g. a log-spaced concurrency)."""
    grid: dict[str, list[Any]] = {}
    for name, dist in distributions(sampled_space(cfg)).items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            grid[name] = list(dist.choices)
        elif getattr(dist, "step", None) and not getattr(dist, "log", False):
            n = round((dist.high - dist.low) / dist.step)
            grid[name] = [type(dist.low)(round(dist.low + i * dist.step, 10)) for i in range(n + 1)]
        else:
            integer = isinstance(dist, optuna.distributions.IntDistribution)
            grid[name] = range_points(
                dist.low, dist.high, cfg.sampler.grid_points, log=dist.log, integer=integer
            )
    return grid


def range_points(
    low: float, high: float, n: int, *, log: bool = False, integer: bool = False
) -> list[Any]:
    """`n` points from `low` to `high` (both included), evenly spaced on the log scale when
    `log`; integers are rounded and repeats dropped (a narrow int range gives fewer points)."""
    if n < 2 or low >= high:
        return [int(low) if integer else low]
    if log:
        raw = [low * (high / low) ** (i / (n - 1)) for i in range(n)]
    else:
        raw = [low + (high - low) * i / (n - 1) for i in range(n)]
    raw[0], raw[-1] = low, high  # exact ends: optuna checks the grid against the range
    if integer:
        return sorted({round(x) for x in raw})
    return [round(x, 10) for x in raw]


def make_sampler(cfg: StudyConfig, seed: int | None = None) -> BaseSampler:
    s = cfg.sampler
    seed = s.seed if seed is None else seed
    require_packages(cfg)
    if s.name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=s.n_startup_trials, multivariate=True, constant_liar=True
        )
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.name == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(seed=seed, scramble=True)
    if s.name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=s.n_startup_trials)
    return optuna.samplers.GridSampler(grid(cfg), seed=seed)


def reseed_on_resume(cfg: StudyConfig, study: optuna.Study, seed: int | None, worker: str) -> None:
    """A resumed run must not replay its seed's first draws: they proposed the study's first
    trials, and each replay is a duplicate that counts toward n_trials. Its sampler's seed is
    derived from the seed, the trials so far and the worker: still reproducible. A fresh
    study keeps the seed as given (the same seed, the same first proposals)."""
    base = cfg.sampler.seed if seed is None else seed
    n = len(study.get_trials(deepcopy=False))
    if base is None or n == 0:
        return
    digest = hashlib.sha256(f"{base}:{n}:{worker}".encode()).digest()
    study.sampler = make_sampler(cfg, int.from_bytes(digest[:4], "big"))
