"""`tuner check` of a fleet file checks every worker's target, each line naming its worker: here
the port check against this machine, one worker's port held by this test's socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import yaml

from tests.helpers.net import free_port
from tests.helpers.studies import study_dict
from tuner.check.plan import run_checks


def test_every_workers_target_is_checked(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port_a, port_b = free_port(), held.getsockname()[1]
        fleet = [
            {"worker": "gpu-a", "port": port_a, "gpus": "0"},
            {"worker": "gpu-b", "port": port_b, "gpus": "1"},
        ]
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump(study_dict(fleet=fleet)))
        lines = run_checks(path, keys={"ssh", "port"}, runs_dir=tmp_path / "runs")
    got = [(line.status, line.name) for line in lines]
    assert got == [
        ("ok", "study"),
        ("ok", "gpu-a: host"),
        ("ok", "gpu-a: port"),
        ("ok", "gpu-b: host"),
        ("FAIL", "gpu-b: port"),
    ]
    assert f"{port_a} is free" in lines[2].detail
    assert f"port {port_b} is held by PID {os.getpid()}" in lines[4].detail
