"""`sampler: grid` on ranges without a step: points on the log scale for a log range."""

from __future__ import annotations

import itertools
import math

import optuna
import pytest

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.errors import ConfigError
from tuner.search.sampler import grid as _grid
from tuner.search.sampler import make_sampler, range_points
from tuner.search.space import sample

STUDY = study_dict(
    study="grid",
    space={
        "mem-fraction-static": {"low": 0.80, "high": 0.90, "step": 0.05},
        "concurrency": {"low": 8, "high": 256, "log": True, "search": "joint"},
    },
    sampler={"name": "grid", "seed": 1},
)


def test_log_points_are_evenly_spaced_on_the_log_scale() -> None:
    pts = range_points(8, 256, 6, log=True, integer=True)
    assert pts == [8, 16, 32, 64, 128, 256]
    floats = range_points(0.1, 1000.0, 5, log=True)
    assert floats[0] == 0.1 and floats[-1] == 1000.0
    ratios = [b / a for a, b in itertools.pairwise(floats)]
    assert all(math.isclose(r, 10.0, rel_tol=1e-6) for r in ratios)


def test_integer_points_are_rounded_and_unique_and_keep_the_ends() -> None:
    assert range_points(8, 256, 8, log=True, integer=True) == [8, 13, 22, 35, 58, 95, 156, 256]
    assert range_points(1, 3, 8, log=True, integer=True) == [1, 2, 3]  # a narrow range: fewer
    assert range_points(0.0, 1.0, 5) == [0.0, 0.25, 0.5, 0.75, 1.0]  # linear without a step


def test_grid_takes_log_concurrency_on_the_log_scale() -> None:
    cfg = parse_study({**STUDY, "sampler": {"name": "grid", "grid_points": 6}}, "g.yaml")
    grid = _grid(cfg)
    assert grid["concurrency"] == [8, 16, 32, 64, 128, 256]
    assert grid["mem-fraction-static"] == [0.8, 0.85, 0.9]


def test_a_grid_study_visits_every_cell_once_then_stops() -> None:
    cfg = parse_study({**STUDY, "sampler": {"name": "grid", "seed": 1, "grid_points": 4}}, "g.yaml")
    study = optuna.create_study(sampler=make_sampler(cfg), direction="maximize")
    seen = []

    def objective(trial: optuna.Trial) -> float:
        params = sample(trial, cfg.space)
        seen.append((params["mem-fraction-static"], params["concurrency"]))
        return float(params["concurrency"])

    study.optimize(objective, n_trials=100)  # the grid sampler stops the study when exhausted
    assert sorted(seen) == sorted((m, c) for m in (0.8, 0.85, 0.9) for c in (8, 25, 81, 256))


def test_grid_points_below_two_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"sampler\.grid_points"):
        parse_study({**STUDY, "sampler": {"name": "grid", "grid_points": 1}}, "g.yaml")
