"""`fleet:` in the study file (tuner/config/fleet.py): the merge onto `target:`, each worker's
target validated as the study's (errors under `fleet[i]`), names and hosts kept apart, the
fingerprint the file's own `target:`, and the CLI's one line with exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.studies import study_dict
from tuner import cli
from tuner.config.fleet import deep_merge, member_config
from tuner.config.load import parse_study
from tuner.errors import ConfigError
from tuner.search.space import fingerprint

TARGET = {"host": "local", "env": {"A": "1"}, "ssh": {"user": "me", "port": 2222}}


def fleet_study(fleet: Any, **over: Any) -> dict[str, Any]:
    return study_dict(target=dict(TARGET), fleet=fleet, **over)


def test_deep_merge_merges_mappings_key_by_key_and_replaces_the_rest() -> None:
    base = {"ssh": {"user": "me", "port": 22}, "launch": ["a", "b"], "env": {"A": "1"}}
    over = {"ssh": {"port": 2222}, "launch": ["c"], "env": {"B": "2"}, "gpus": "0"}
    merged = deep_merge(base, over)
    assert merged == {
        "ssh": {"user": "me", "port": 2222},
        "launch": ["c"],
        "env": {"A": "1", "B": "2"},
        "gpus": "0",
    }
    assert base["ssh"] == {"user": "me", "port": 22} and "gpus" not in base  # untouched
    assert deep_merge({"container": {"image": "x"}}, {"container": None}) == {"container": None}


def test_each_worker_runs_the_target_with_its_own_keys_merged_in() -> None:
    cfg = parse_study(
        fleet_study(
            [
                {"worker": "gpu-a", "host": "gpu-a", "gpus": "0,1"},
                {"worker": "gpu-b", "host": "gpu-b", "ssh": {"port": 2200}, "env": {"B": "2"}},
            ]
        ),
        "f.yaml",
    )
    assert cfg.fleet is not None and cfg.fleet.names() == ["gpu-a", "gpu-b"]
    a, b = (member_config(cfg, n) for n in ("gpu-a", "gpu-b"))
    assert (a.target.host, a.target.gpus, a.target.ssh.port) == ("gpu-a", "0,1", 2222)
    assert (b.target.host, b.target.ssh.user, b.target.ssh.port) == ("gpu-b", "me", 2200)
    assert b.target.env == {"A": "1", "B": "2"}
    assert cfg.target.host == "local"  # the file's own target: is kept for the study
    # where a worker runs is not what the study measures: one fingerprint for all of them
    assert fingerprint(a) == fingerprint(b) == fingerprint(cfg)
    assert b.fleet is not None and b.fleet.worker == "gpu-b"
    with pytest.raises(ConfigError, match=r"^--worker: the fleet has no worker 'gpu-c' "):
        member_config(cfg, "gpu-c")


@pytest.mark.parametrize(
    ("fleet", "key", "message"),
    [
        ([], "fleet", "expected a list of workers"),
        ({"worker": "a"}, "fleet", "expected a list of workers"),
        (["a"], "fleet[0]", "expected a mapping"),
        ([{"host": "x"}], "fleet[0].worker", "required key is missing"),
        ([{"worker": " "}], "fleet[0].worker", "expected a printable name"),
        ([{"worker": "a", "hots": "x"}], "fleet[0].hots", "unknown key (a fleet entry takes"),
        ([{"worker": "a", "ssh": {"prot": 1}}], "fleet[0].ssh.prot", "unknown key"),
        (
            [{"worker": "a"}, {"worker": "b", "host": "y", "ssh": {"port": 70000}}],
            "fleet[1].ssh.port",
            "less than or equal to 65535",
        ),
        (
            [{"worker": "a", "host": "x"}, {"worker": "a", "host": "y"}],
            "fleet[1].worker",
            "worker 'a' is also fleet[0]",
        ),
        (
            [
                {"worker": "a", "port": 31000, "gpus": "0"},
                {"worker": "b", "port": 31000, "gpus": "1"},
            ],
            "fleet[1]",
            "port 31000 of host local is also fleet[0] (a)'s",
        ),
        (
            [
                {"worker": "a", "port": 31000, "gpus": "0,1"},
                {"worker": "b", "port": 31001, "gpus": "1,2"},
            ],
            "fleet[1]",
            "uses GPU 1 of host local, as fleet[0] (a) does",
        ),
        (
            [{"worker": "a", "port": 31000}, {"worker": "b", "port": 31001, "gpus": "1"}],
            "fleet[1]",
            "uses every GPU (no gpus:) of host local",
        ),
        # checked against the rest of the file as the study's target: is (config/validate.py)
        (
            [
                {
                    "worker": "a",
                    "host": "x",
                    "container": {"image": "i"},
                    "launch": ["{python}", "m"],
                }
            ],
            "fleet[0].launch",
            "{python} is the tuner's own Python",
        ),
    ],
)
def test_a_bad_entry_is_one_error_naming_its_key(fleet: Any, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_study(fleet_study(fleet), "f.yaml")
    assert err.value.key == key and err.value.file == "f.yaml"
    assert message in err.value.detail, err.value.detail


def test_workers_apart_on_hosts_ports_or_gpus_are_a_fleet() -> None:
    fleet = [
        {"worker": "a", "host": "h1"},
        {"worker": "b", "host": "h2"},  # same port, another host
        {"worker": "c", "host": "h1", "ssh": {"port": 2200}},  # another sshd: another machine
        {"worker": "d", "port": 31000, "gpus": "0"},
        {"worker": "e", "port": 31001, "gpus": "1"},
    ]
    assert parse_study(fleet_study(fleet), "f.yaml").fleet is not None


def test_the_cli_refuses_a_bad_fleet_in_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(fleet_study([{"worker": "a"}, {"worker": "a"}])))
    runs = str(tmp_path / "runs")
    assert cli.main(["tune", str(path), "--runs-dir", runs]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"tuner: error: {path}: fleet[1].worker: worker 'a' is also fleet[0]: each worker needs its "
        "own name"
    ]
    assert not (tmp_path / "runs").exists()  # nothing written
    path.write_text(yaml.safe_dump(fleet_study([{"worker": "a", "host": "x"}])))
    assert cli.main(["tune", str(path), "--runs-dir", runs, "--worker", "b"]) == 2
    assert "--worker: the fleet has no worker 'b' (its workers: a)" in capsys.readouterr().err
