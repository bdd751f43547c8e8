"""`tuner check` of a server across two "nodes" (two real sshd on 127.0.0.1): every node
reached, one SGLang version, the dist-init port on nodes[0] reached from the other node (a
listener started and stopped by its process group), and a port already held there refused."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import yaml

from tests.helpers.net import free_port
from tests.helpers.paths import REPO
from tests.helpers.sshd import Sshd
from tests.helpers.studies import study_file
from tests.integration.check.test_check import FAKE_NVIDIA_SMI
from tuner.check.plan import run_checks

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

KEYS = {"ssh", "shell", "gpus", "nodes", "node sglang", "node gpus", "dist init"}


def _node(server: Sshd) -> dict:
    ssh = {"port": server.port, "identity_file": str(server.client_key)}
    return {"host": "127.0.0.1", "ssh": {**ssh, "known_hosts": str(server.known_hosts)}}


def fake_smi(tmp: Path) -> Path:
    d = tmp / "bin"
    d.mkdir()
    (d / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (d / "nvidia-smi").chmod(0o755)
    return d


def _study(tmp: Path, first: Sshd, second: Sshd, dist_port: int) -> Path:
    path = study_file(tmp, name="nodes-check")
    data = yaml.safe_load(path.read_text())
    del data["target"]["host"]
    data["target"].update(
        nodes=[_node(first), _node(second)],
        dist_init_port=dist_port,
        # a fake nvidia-smi with one GPU on each "node": tp 2 over 2 nodes needs one each
        env={"PYTHONPATH": str(REPO), "PATH": f"{fake_smi(tmp)}:{os.environ['PATH']}"},
        ssh={"user": "root", "use_agent": False, "look_for_keys": False, "ssh_config": ""},
    )
    data["server"]["tp"] = 2
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_check_across_two_nodes(tmp_path: Path, sshd_server: Sshd, second_sshd: Sshd) -> None:
    port = free_port()
    study = _study(tmp_path, sshd_server, second_sshd, port)
    lines = {line.name: line for line in run_checks(study, keys=KEYS)}
    assert lines["nodes"].status == "ok", lines["nodes"]
    assert lines["node sglang"].status == "ok" and "on every node" in lines["node sglang"].detail
    assert lines["gpus"].status != "FAIL" and "(need 1)" in lines["gpus"].detail  # nodes[0]'s
    assert lines["node gpus"].status == "ok", lines["node gpus"]
    gpus = lines["node gpus"].detail
    assert gpus.startswith("1 needed per node; ") and gpus.count("127.0.0.1:") == 2, gpus
    assert lines["dist init"].status == "ok", lines["dist init"]
    assert lines["dist init"].detail == f"127.0.0.1:{port} reached from every node"
    with socket.socket() as held:  # the listener was stopped: the port is free again
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its connection's TIME_WAIT
        held.bind(("127.0.0.1", port))
        held.listen()
        lines = {
            line.name: line
            for line in run_checks(study, keys={"ssh", "shell", "nodes", "dist init"})
        }
    dist = lines["dist init"]
    assert dist.failed and f"port {port} is held on nodes[0]" in dist.detail
