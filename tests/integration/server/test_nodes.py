"""A server across two "nodes": two real sshd on 127.0.0.1 (their own ports and keys), one
simulated rank on each (`--nnodes 2 --node-rank 0|1 --dist-init-addr 127.0.0.1:P`).

Launch, readiness and verification through rank 0, a stop of both ranks. (A follower killed
mid-load, the next trial clean, a resumed run finding both ranks of a server it never started:
tests/integration/study/test_nodes_study.py.)
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import REPO
from tests.helpers.procs import marked_groups
from tests.helpers.sshd import Sshd, assert_group_gone
from tuner.config.load import parse_study
from tuner.server.launch import build_launch
from tuner.server.nodes import NodesServer, nodes_server, rank_path
from tuner.server.probes import server_info

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

SIM = [sys.executable, "-m", "tuner.sim", "--sim-startup-seconds", "0.3"]


def node(server: Sshd) -> dict:
    """A target.nodes entry for one test sshd (its own port, key and known_hosts)."""
    ssh = {
        "port": server.port,
        "identity_file": str(server.client_key),
        "known_hosts": str(server.known_hosts),
    }
    return {"host": "127.0.0.1", "ssh": ssh}


def target(tmp: Path, first: Sshd, second: Sshd, port: int):
    data = {
        "study": "nodes",
        "server": {"model-path": "m", "tp": 2},
        "space": {"concurrency": {"low": 1, "high": 8}},
        "target": {
            "nodes": [node(first), node(second)],
            "dist_init_port": free_port(),
            "port": port,
            "workdir": str(tmp),
            "ssh": {"user": "root", "use_agent": False, "look_for_keys": False, "ssh_config": ""},
            "timeouts": {"ready_s": 20, "stop_s": 5, "poll_s": 0.05, "http_s": 2},
        },
    }
    return parse_study(data, "nodes.yaml").target


@pytest.fixture
def two_nodes(
    tmp_path: Path, sshd_server: Sshd, second_sshd: Sshd
) -> Iterator[tuple[NodesServer, object]]:
    port = free_port()
    tgt = target(tmp_path, sshd_server, second_sshd, port)
    marker = f"nodes-test-{os.getpid()}-{time.monotonic_ns()}"
    servers = nodes_server(tgt, marker=marker)
    spec = build_launch(SIM, {"model-path": "m", "tp": 2}, port, {"PYTHONPATH": str(REPO)})
    try:
        yield servers, spec, marker
    finally:
        try:
            servers.stop()
        finally:
            for pgid in marked_groups(marker):  # whatever a failing test left
                os.killpg(pgid, signal.SIGKILL)
            servers.rank0.endpoint.close()
            servers.rank0.host.close()
            servers.close()


def test_two_ranks_start_verify_stop(two_nodes, tmp_path: Path) -> None:
    servers, spec, marker = two_nodes
    log = str(tmp_path / "trial0.log")
    res = servers.restart(spec, log)
    assert res.ok, (res.reason, res.evidence)
    rank1 = servers.servers[1]
    pgids = [servers.pgid, rank1.pgid]
    assert set(marked_groups(marker)) == set(pgids)  # both ranks carry the marker
    # rank 0 answers for the server, as SGLang's server_args report the layout
    info = server_info(servers.rank0.endpoint.url(spec.port), None, 5)
    assert info is not None
    assert (info["nnodes"], info["node_rank"], info["tp_size"]) == (2, 0, 2)
    assert info["dist_init_addr"] == servers.dist_init_addr
    follower_log = Path(rank_path(log, 1)).read_text()
    assert " TP1] Init torch distributed ends." in follower_log
    assert "fired up" not in follower_log  # a follower serves no API
    assert servers.check() is None and servers.responsive(2)
    assert res.timings.total_s >= res.timings.start_to_ready_s > 0

    servers.stop()  # rank 0 first: its goodbye ends the follower gracefully
    for pgid in pgids:
        assert_group_gone(pgid)
    assert not marked_groups(marker) and servers.pgid is None and rank1.pgid is None
    assert "Process group watchdog" not in Path(rank_path(log, 1)).read_text()
