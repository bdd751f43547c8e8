"""The study file's `target.nodes`: one SGLang server across several nodes (issue 37).

    target:
      nodes: [gpu-a, gpu-b]          # rank i runs on nodes[i]; rank 0 serves HTTP
      dist_init_port: 20000          # torch.distributed's rendezvous on nodes[0]

An entry is a host (an ssh_config alias or a name) or a mapping `{host: ..., ssh: {port: ...}}`
whose `ssh:` overrides the target's for that node (who and where: user, port, keys, files).
The tuner launches rank i on nodes[i] with the trial's flags plus `--nnodes N --node-rank i
--dist-init-addr <nodes[0]>:<dist_init_port>` (SGLang 0.5.6.post2 server_args.py:2845-2856):
those three flags are the tuner's, never the study's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from tuner.config.base import Model, host_problem
from tuner.sglang.flags import canonical_flag

#: torch.distributed's rendezvous port on nodes[0] when the study names none. 20000 is below
#: Linux's ephemeral range (32768-60999), so no outgoing connection of the node holds it by
#: chance, and far from SGLang's own ports around --port (30000: its NCCL port is --port +
#: 100..1000, server_args.py:4530, and DP attention's ZMQ ports --port + 233.., :4562)
DEFAULT_DIST_INIT_PORT = 20000
#: ports SGLang takes from --dist-init-addr's port on (DP attention: port + 1 .. + 5,
#: 0.5.6.post2 server_args.py:4575-4584): the server's HTTP port must not be among them
DIST_PORT_SPAN = 6
#: flags the tuner sets per rank from target.nodes (SGLang's dests)
OWNED_DESTS = {
    "nnodes": "target.nodes",
    "node-rank": "target.nodes (rank i runs on nodes[i])",
    "dist-init-addr": "nodes[0] and target.dist_init_port",
}


class NodeSSH(Model):
    """What one node overrides of `target.ssh` (who logs in where; timeouts stay the target's)."""

    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None
    password_env: str | None = None


class Node(Model):
    """One node of the server: its host and, optionally, its own SSH settings."""

    host: str
    ssh: NodeSSH = NodeSSH()

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if v != "local" and (problem := host_problem(v, "the node's ssh.port")):
            raise ValueError(problem)
        if v == "local":
            raise ValueError(
                "'local' cannot be a node: the other nodes reach nodes[0] by its address; "
                "name this machine by a host the others resolve (over SSH)"
            )
        return v


def as_node(entry: Any) -> Any:
    """A bare host string is `{host: STRING}`."""
    return {"host": entry} if isinstance(entry, str) else entry


def rank0_host(data: Any) -> Any:
    """A `target:` mapping with `nodes` and no `host`: its host is nodes[0]'s (the one the
    tuner reaches, names the worker, and checks), as if written."""
    if isinstance(data, dict) and "host" not in data and isinstance(data.get("nodes"), list):
        first = as_node(data["nodes"][0]) if data["nodes"] else None
        if isinstance(first, dict) and isinstance(first.get("host"), str):
            return {**data, "host": first["host"]}
    return data


def node_count(target: Any) -> int:
    """How many nodes the server spans (1 without target.nodes): each holds tp / this GPUs."""
    return len(target.nodes) if target.nodes else 1


def node_ssh(target: Any, node: Node) -> Any:
    """The target's `ssh:` section with what `node` overrides laid over it."""
    update = {k: getattr(node.ssh, k) for k in node.ssh.model_fields_set}
    return target.ssh.model_copy(update=update)


def nodes_problem(
    target: Any, server: Mapping[str, Any], space: Mapping[str, Any]
) -> tuple[str, str | None]:
    """(key, why not) when the rest of the study cannot run across `target.nodes` (`target`:
    its TargetSection, untyped: config.target imports this module), else (key, None)."""
    nodes: list[Node] = target.nodes
    if target.host != nodes[0].host:
        return "target.host", (
            f"{target.host!r} differs from target.nodes[0] ({nodes[0].host!r}): rank 0's node "
            "is the one the tuner reaches; remove target.host or make it nodes[0]"
        )
    seen: dict[tuple[str, int | None, str | None], int] = {}
    for i, node in enumerate(nodes):
        key = (node.host, node.ssh.port or target.ssh.port, node.ssh.user or target.ssh.user)
        if key in seen:
            return f"target.nodes[{i}]", f"the same node as target.nodes[{seen[key]}]"
        seen[key] = i
    for key, why in (
        ("target.slurm", "Slurm places a multi-node server itself (not supported yet)"),
        ("target.container", "containers per node are not supported yet"),
        ("target.kubernetes", "a server across pods is target.kubernetes.nodes"),
        ("target.http_host", "the tuner reaches rank 0 through nodes[0] (its SSH tunnel)"),
    ):
        if getattr(target, key.split(".")[1]):
            return key, f"cannot be combined with target.nodes: {why}"
    port = target.dist_init_port or DEFAULT_DIST_INIT_PORT
    if port <= target.port < port + DIST_PORT_SPAN:
        return "target.dist_init_port", (
            f"{port} takes ports {port}..{port + DIST_PORT_SPAN - 1} on nodes[0] "
            f"(torch.distributed, DP attention), target.port {target.port} among them: pick "
            "another"
        )
    tp_key = "tensor-parallel-size"
    searched = [(k, spec) for k, spec in space.items() if canonical_flag(k) == tp_key]
    fixed = [(k, v) for k, v in server.items() if canonical_flag(k) == tp_key]
    for key, spec in searched:
        for tp in spec.choices or ():
            if isinstance(tp, int) and tp % len(nodes):
                return f"space.{key}", _tp_problem(tp, len(nodes))
    if not searched:
        key, tp = fixed[0] if fixed else ("tp-size", 1)
        if isinstance(tp, int) and tp % len(nodes):
            return f"server.{key}", _tp_problem(tp, len(nodes)) + ("" if fixed else " (not set: 1)")
    return "target.nodes", None


def _tp_problem(tp: int, n: int) -> str:
    return (
        f"{tp} is not divisible by the {n} nodes of target.nodes: SGLang asserts 'tp_size must "
        "be divisible by number of nodes' (0.5.6.post2 server_args.py:4082); tp is the total "
        "over the nodes (GPUs per node = tp / nodes)"
    )


def owned_flag(name: str) -> str | None:
    """Why a `server:`/`space:` flag is the tuner's to set (nnodes, node-rank,
    dist-init-addr and their aliases), or None."""
    canonical = canonical_flag(name) or name
    owner = OWNED_DESTS.get(canonical)
    if owner is None:
        return None
    return (
        f"the tuner sets --{canonical} for each rank from {owner} (on Kubernetes, from "
        "target.kubernetes.nodes); remove it here"
    )
