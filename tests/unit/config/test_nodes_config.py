"""`target.nodes` in the study file (config/nodes.py): its forms, its default host, and one
clear line for every combination the tuner does not run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.config.nodes import DEFAULT_DIST_INIT_PORT
from tuner.errors import ConfigError
from tuner.server.nodes import nodes_server
from tuner.server.target import host_for


def _parse(target: dict[str, Any], **over: Any):
    server = over.pop("server", {"model-path": "m", "tp": 2})
    return parse_study(study_dict(target=target, server=server, **over), "s.yaml")


def test_nodes_as_hosts_or_mappings_with_their_own_ssh() -> None:
    cfg = _parse(
        {"nodes": ["gpu-a", {"host": "gpu-b", "ssh": {"port": 2222}}], "ssh": {"user": "me"}}
    )
    target = cfg.target
    assert target.host == "gpu-a"  # no target.host: it is nodes[0]
    assert [n.host for n in target.nodes] == ["gpu-a", "gpu-b"]
    assert target.dist_init_port is None
    assert host_for(target).options.port is None  # nodes[0]: the target's own ssh
    server = nodes_server(target)
    (a, b) = (s.host.options for s in server.servers)
    assert (a.host, a.port, a.user) == ("gpu-a", None, "me")
    assert (b.host, b.port, b.user) == ("gpu-b", 2222, "me")  # overridden, the rest inherited
    assert server.dist_init_addr == f"gpu-a:{DEFAULT_DIST_INIT_PORT}"
    assert server.servers[1].marker == server.servers[0].marker


@pytest.mark.parametrize(
    ("target", "server", "key", "says"),
    [
        ({"nodes": ["a"]}, None, "target.nodes", "at least 2 items"),
        ({"nodes": ["a", "a"]}, None, "target.nodes[1]", "the same node as target.nodes[0]"),
        ({"nodes": ["a", "local"]}, None, "target.nodes.1.host", "'local' cannot be a node"),
        (
            {"nodes": ["a", {"host": "b", "ssh": {"timeout": 1}}]},
            None,
            "target.nodes.1.ssh.timeout",
            "unknown key",
        ),
        ({"nodes": ["a", "b"], "host": "c"}, None, "target.host", "differs from target.nodes[0]"),
        (
            {"nodes": ["a", "b"], "dist_init_port": 29998, "port": 30000},
            None,
            "target.dist_init_port",
            "target.port 30000 among them",
        ),
        (
            {"nodes": ["a", "b"], "container": {"image": "x"}},
            None,
            "target.container",
            "not supported",
        ),
        ({"nodes": ["a", "b"], "http_host": "h"}, None, "target.http_host", "cannot be combined"),
        (
            {"nodes": ["a", "b"]},
            {"model-path": "m", "tp": 3},
            "server.tp",
            "not divisible by the 2 nodes",
        ),
        ({"nodes": ["a", "b"]}, {"model-path": "m"}, "server.tp-size", "(not set: 1)"),
        (
            {"nodes": ["a", "b"]},
            {"model-path": "m", "tp": 2, "nnodes": 2},
            "server.nnodes",
            "the tuner sets --nnodes",
        ),
        ({}, {"model-path": "m", "node-rank": 1}, "server.node-rank", "the tuner sets --node-rank"),
        (
            {},
            {"model-path": "m", "nccl-init-addr": "h:1"},
            "server.nccl-init-addr",
            "--dist-init-addr",
        ),
    ],
)
def test_what_the_tuner_does_not_run_is_one_line(target, server, key, says) -> None:
    with pytest.raises(ConfigError) as err:
        _parse(target, **({"server": server} if server else {}))
    text = str(err.value)
    assert text.startswith(f"s.yaml: {key}: "), text
    assert says in text and "\n" not in text


def test_a_searched_tp_is_checked_by_its_choices() -> None:
    space = {"concurrency": {"low": 1, "high": 8}, "tp": {"choices": [2, 3]}}
    with pytest.raises(ConfigError, match=r"space\.tp: 3 is not divisible"):
        _parse({"nodes": ["a", "b"]}, server={"model-path": "m"}, space=space)
    space["tp"] = {"choices": [2, 4]}
    assert _parse({"nodes": ["a", "b"]}, server={"model-path": "m"}, space=space).target.nodes
