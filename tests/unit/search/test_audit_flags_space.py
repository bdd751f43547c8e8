"""Audit findings 13, 14 and 17: an int log range with a step is refused by the study check;
the fingerprint covers target.env and the container's options (only when set, so older studies
resume) without storing a value; `{type: bool, choices: [...]}` samples only its choices."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.errors import ConfigError, StudyMismatchError
from tuner.search.space import distributions, fingerprint, hosted_target_hash
from tuner.study.storage import FINGERPRINT_ATTR, open_study

LAUNCH = ["python", "-m", "sglang.launch_server"]


def study(space: dict[str, Any] | None = None, **kw: Any):
    space = space or {"mem-fraction-static": {"low": 0.8, "high": 0.9, "step": 0.01}}
    return parse_study(study_dict(space=space, **kw))


@pytest.mark.parametrize("name", ["concurrency", "chunked-prefill-size"])
def test_an_int_log_range_with_a_step_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as exc:
        study({name: {"low": 8, "high": 256, "step": 2, "log": True}})
    text = str(exc.value)
    assert f"space.{name}" in text and "step" in text and "log" in text and "\n" not in text


def test_an_int_log_range_with_step_one_is_fine() -> None:
    d = distributions(study({"concurrency": {"low": 8, "high": 256, "step": 1, "log": True}}).space)
    assert d["concurrency"].log


def test_target_env_changes_the_fingerprint_without_holding_its_values() -> None:
    plain = study()
    a = study(target={"env": {"SGLANG_ENABLE_TORCH_COMPILE": "1"}})
    b = study(target={"env": {"SGLANG_ENABLE_TORCH_COMPILE": "0"}})
    assert len({fingerprint(x)["target"] for x in (plain, a, b)}) == 3
    assert "SGLANG_ENABLE_TORCH_COMPILE" not in json.dumps(fingerprint(a))


def test_a_study_without_env_keeps_the_fingerprint_it_was_created_with() -> None:
    old = {"host": "local", "launch": LAUNCH, "gpus": None}  # what older versions hashed
    digest = hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()
    assert hosted_target_hash(study()) == digest[:16]


def test_container_options_change_the_fingerprint_only_when_set() -> None:
    image = {"image": "lmsysorg/sglang:v1"}
    base = study(target={"container": image})
    old = {"host": "local", "launch": LAUNCH, "gpus": None, "image": "lmsysorg/sglang:v1"}
    digest = hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()
    assert hosted_target_hash(base) == digest[:16]
    mounted = study(target={"container": {**image, "mounts": ["/data:/models:ro"]}})
    opts = study(target={"container": {**image, "run_options": ["--gpus", "all"]}})
    assert len({fingerprint(x)["target"] for x in (base, mounted, opts)}) == 3


def test_workers_on_other_hosts_share_a_study_and_an_old_one_resumes() -> None:
    """Each worker drives its own host: the host is not part of what makes trials comparable
    (the identity check compares GPU and SGLang). A study stored with the host in its
    fingerprint (before) resumes and is brought up to date; another launch is still refused."""
    storage = optuna.storages.InMemoryStorage()
    here, there = study(), study(target={"host": "gpu-b"})
    old = {**fingerprint(here), "target": hosted_target_hash(here)}
    made = optuna.create_study(study_name=here.study, storage=storage)
    made.set_user_attr(FINGERPRINT_ATTR, old)
    open_study(here, storage, optuna.samplers.RandomSampler())
    assert made.user_attrs[FINGERPRINT_ATTR] == fingerprint(here)  # brought up to date
    open_study(there, storage, optuna.samplers.RandomSampler())  # another host: the same study
    other = study(target={"launch": [*LAUNCH, "--model-path", "other"]})
    with pytest.raises(StudyMismatchError, match="target"):
        open_study(other, storage, optuna.samplers.RandomSampler())


def test_bool_choices_are_sampled_as_given() -> None:
    cfg = study({"enable-mixed-chunk": {"type": "bool", "choices": [True]}})
    assert distributions(cfg.space)["enable-mixed-chunk"] == CategoricalDistribution([True])
    both = study({"enable-mixed-chunk": {"type": "bool", "choices": [True, False]}})
    assert distributions(both.space)["enable-mixed-chunk"] == CategoricalDistribution([False, True])


def test_bool_choices_that_are_not_true_or_false_are_refused() -> None:
    with pytest.raises(ConfigError) as exc:
        study({"enable-mixed-chunk": {"type": "bool", "choices": [1]}})
    assert "space.enable-mixed-chunk" in str(exc.value) and "true and/or false" in str(exc.value)
