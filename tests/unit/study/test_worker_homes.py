"""A worker name live in another runs folder or on another machine (a shared storage, which the
per-folder lock cannot see): its running trial is not this run's zombie to fail. The run is
refused with one line, and nothing in the study changes; a dead twin's trial, once its
heartbeat is stale, is recovered as before."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from tests.helpers.loop import STUDY, FakeServer, make_runner
from tuner.config.load import parse_study
from tuner.errors import StudyBusyError
from tuner.outcome import Attr
from tuner.search.sampler import make_sampler
from tuner.study.loop import Tuning
from tuner.study.storage import open_study
from tuner.study.worklock import home_of


def _storage(path: Path, grace_s: int) -> RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RDBStorage(f"sqlite:///{path}", heartbeat_interval=1, grace_period=grace_s)


def _twin_running(tmp_path: Path, grace_s: int) -> tuple[optuna.Study, int, object]:
    """A study whose trial 0 runs under worker w1 from folder a/, its heartbeat just beaten."""
    cfg = parse_study(STUDY, "unit.yaml")
    storage = _storage(tmp_path / "study.db", grace_s)
    study = open_study(cfg, storage, make_sampler(cfg))
    trial = study.ask()
    trial.set_user_attr(Attr.WORKER, "w1")
    trial.set_user_attr(Attr.HOME, home_of(tmp_path / "a"))
    storage.record_heartbeat(trial._trial_id)
    return study, trial.number, cfg


def _tuning(cfg, study: optuna.Study, tmp_path: Path, folder: str) -> Tuning:
    runner = make_runner(cfg, FakeServer())
    home = home_of(tmp_path / folder)
    return Tuning(cfg, study, runner, tmp_path / folder / "trials", worker="w1", home=home)


def test_a_same_named_worker_live_in_another_folder_is_refused(tmp_path: Path) -> None:
    study, number, cfg = _twin_running(tmp_path, grace_s=600)
    before = study.user_attrs
    with pytest.raises(
        StudyBusyError, match=r"worker 'w1' is already running .*a.*another --worker"
    ):
        _tuning(cfg, study, tmp_path, "b").recover()
    assert study.trials[number].state == TrialState.RUNNING  # untouched
    assert len(study.trials) == 1 and study.user_attrs == before  # nothing enqueued or written


def test_the_same_folder_recovers_its_own_dead_trial(tmp_path: Path) -> None:
    # the folder's lock is held by this run, so a trial of this home is a dead run's
    study, number, cfg = _twin_running(tmp_path, grace_s=600)
    assert _tuning(cfg, study, tmp_path, "a").recover() == [number]
    assert study.trials[number].state == TrialState.FAIL


def test_a_twin_whose_heartbeat_went_stale_is_recovered(tmp_path: Path) -> None:
    study, number, cfg = _twin_running(tmp_path, grace_s=1)
    time.sleep(2.5)  # the twin died: no heartbeat for longer than the grace period
    assert _tuning(cfg, study, tmp_path, "b").recover() == [number]
    assert study.trials[number].state == TrialState.FAIL


def test_trials_record_where_their_worker_ran(tmp_path: Path) -> None:
    cfg = parse_study(STUDY, "unit.yaml")
    study = open_study(cfg, _storage(tmp_path / "study.db", 600), make_sampler(cfg))
    tuning = _tuning(cfg, study, tmp_path, "a")
    tuning.optimize(2, None)
    homes = {t.user_attrs.get(Attr.HOME) for t in study.trials}
    assert homes == {home_of(tmp_path / "a")}


def test_a_worker_ending_before_the_others_says_its_best_is_so_far(tmp_path: Path) -> None:
    from tuner.api import Events, say_others_running

    study, number, cfg = _twin_running(tmp_path, grace_s=600)  # w1's trial runs
    said: list[str] = []
    say_others_running(study, "w1", Events(on_message=said.append))
    assert said == []  # only this worker's own trial runs
    say_others_running(study, "w2", Events(on_message=said.append))
    assert len(said) == 1 and "w1 still run" in said[0] and "tuner export" in said[0]
