"""One SGLang server across nodes (`target.nodes`): one `Server` per node, rank i on nodes[i].

Each rank runs the trial's flags plus `--nnodes N --node-rank i --dist-init-addr H:P`
(H: nodes[0]'s address, P: target.dist_init_port; `rank_spec`). Followers (ranks > 0) start
first and wait for rank 0's rendezvous, as torch's store clients do; rank 0 then starts, is
awaited and verified as a one-node server is (its /get_server_info names nnodes, node_rank).
Every rank carries the study's marker, so a resumed run stops all of them on every node
(`stop_strays`). A stop ends rank 0 first (SGLang's ShutdownReq goes from rank 0 to the
others), then each follower, each by its process group, waiting until its GPUs are free.

Whose failure (lifecycle.py's evidence rule, over all ranks): an OOM or any other of SGLang's
configuration messages on any rank is the configuration's, named by that rank's node; a rank
lost to the world (killed, its connection gone, no such message anywhere: rank 0 then shows
only NCCL's watchdog lines) is the world's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tuner.config.nodes import DEFAULT_DIST_INIT_PORT, node_ssh
from tuner.config.target import TargetSection
from tuner.hosts.ssh import SSHHost, SSHOptions, _resolve
from tuner.server.endpoint import TunnelEndpoint
from tuner.server.launch import LaunchSpec, flag_args
from tuner.server.lifecycle import Server
from tuner.server.records import GpuInfo, ServerDeath, StartResult, Timings
from tuner.sglang.failures import FailureClass, is_config_failure


def rank_spec(spec: LaunchSpec, nnodes: int, rank: int, dist_init_addr: str) -> LaunchSpec:
    """`spec` for rank `rank` of `nnodes`: SGLang's three flags appended to argv and to the
    flags /get_server_info is checked against."""
    own = {"nnodes": nnodes, "node-rank": rank, "dist-init-addr": dist_init_addr}
    return replace(spec, argv=(*spec.argv, *flag_args(own)), flags={**spec.flags, **own})


def rank_path(path: str, rank: int) -> str:
    """Rank 0 keeps `path` (`server.log`); rank i writes `server.rank<i>.log`."""
    if rank == 0:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.rank{rank}.{ext}" if dot and "/" not in ext else f"{path}.rank{rank}"


class NodeLogs:
    """The logs of every rank (HostLogs per node), addressed by rank 0's path."""

    def __init__(self, servers: Sequence[Server]):
        self._logs = [s.logs for s in servers]

    @property
    def keep(self) -> bool:
        return self._logs[0].keep

    @property
    def last(self) -> str | None:
        return self._logs[0].last

    def gone(self, log_path: str, also: Sequence[str] = ()) -> None:
        for rank, logs in enumerate(self._logs):
            logs.gone(rank_path(log_path, rank) if log_path else log_path, also)

    def sweep(self) -> None:
        for logs in self._logs:
            logs.sweep()


class NodesServer:
    """A server across `servers` (rank order; `names`: each node's name for messages), with
    what the trial runner and `api.Seams` use of a one-node `Server`."""

    def __init__(self, servers: Sequence[Server], names: Sequence[str], dist_init_addr: str):
        assert len(servers) >= 2 and len(names) == len(servers)
        self.servers = list(servers)
        self.names = list(names)
        self.dist_init_addr = dist_init_addr
        self.logs = NodeLogs(self.servers)
        self._hook: Callable[..., None] = lambda last=False: None
        self.servers[0].on_poll = self._poll

    # -- what a one-node Server offers ---------------------------------------------------

    @property
    def rank0(self) -> Server:
        return self.servers[0]

    @property
    def host(self) -> Any:
        return self.rank0.host

    @property
    def runtime(self) -> Any:
        return self.rank0.runtime

    @property
    def pgid(self) -> int | None:
        return self.rank0.pgid

    @property
    def log_path(self) -> str | None:
        return self.rank0.log_path

    @property
    def on_poll(self) -> Callable[..., None]:
        return self._hook

    @on_poll.setter
    def on_poll(self, hook: Callable[..., None]) -> None:
        """Rank 0's readiness-poll hook (the start-up log's milestones: server/startlog.py)."""
        self._hook = hook

    def adopt(self, pgid: int, command: str, log_path: str, port: int) -> None:
        """Rank 0 of an earlier run (its followers are found by the marker: stop_strays)."""
        self.rank0.adopt(pgid, command, log_path, port)

    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every node's GPUs, rank order."""
        return tuple(g for s in self.servers for g in s.gpus())

    def restart(
        self, spec: LaunchSpec, log_path: str, on_launch: Callable[[int], None] | None = None
    ) -> StartResult:
        """Stop every rank; start the followers, then rank 0; wait for rank 0 and verify it."""
        clock = self.rank0._clock
        t0 = clock()
        stop_s = self.stop()
        n = len(self.servers)
        for rank in range(1, n):
            self.servers[rank].restart(
                rank_spec(spec, n, rank, self.dist_init_addr),
                rank_path(log_path, rank),
                follower=True,
            )
        result = self.rank0.restart(rank_spec(spec, n, 0, self.dist_init_addr), log_path, on_launch)
        for server in self.servers[1:]:
            server.drop_secrets()  # every rank has read its flags by now
        t = result.timings
        timings = Timings(stop_s, t.prepare_s, t.launch_s, t.start_to_ready_s, t.verify_s)
        timings = replace(timings, total_s=clock() - t0)
        deaths = self._deaths()
        if not deaths and result.ok:
            return replace(result, timings=timings, gpus=self.gpus())
        return replace(self._judge_start(result, deaths), timings=timings, gpus=self.gpus())

    def stop(self) -> float:
        """Rank 0 first, then each follower; each waits until its group is gone and its GPUs
        are free. Returns the seconds it took."""
        return sum(server.stop() for server in self.servers)

    def stop_strays(self) -> list[tuple[int, str]]:
        """Every node's groups with our marker (an earlier run's ranks)."""
        return [found for server in self.servers for found in server.stop_strays()]

    def responsive(self, timeout_s: float) -> bool:
        return self.rank0.responsive(timeout_s)

    def check(self) -> ServerDeath | None:
        """None while every rank runs; else why the server died, judged over all ranks."""
        deaths = self._deaths(include_rank0=True)
        if not deaths:
            return None
        rank, death = self._worst(deaths)
        if is_config_failure(death.failure):
            return replace(death, reason=f"{self._who(rank)}: {death.reason}")
        first = _first_lost(deaths)  # the world's: the rank that went first explains the rest
        return ServerDeath(
            FailureClass.CRASHED,
            self._lost(first, deaths[first]),
            deaths[first].evidence,
            deaths[first].exit_code,
        )

    def fetch_log(self, local_path: str) -> bool:
        """Rank 0's log to `local_path`, rank i's next to it (`server.rank<i>.log`)."""
        ok = self.rank0.fetch_log(local_path)
        for rank, server in enumerate(self.servers[1:], 1):
            server.fetch_log(rank_path(local_path, rank))
        return ok

    def close(self) -> None:
        """Close the followers' hosts (rank 0's is the study's `Seams.host`)."""
        for server in self.servers[1:]:
            server.host.close()

    # -- helpers -------------------------------------------------------------------------

    def _poll(self, last: bool = False) -> None:
        """At each readiness poll of rank 0: its hook, and a follower that died ends rank 0's
        wait (rank 0 would otherwise wait out its rendezvous or NCCL timeout)."""
        self._hook(last=last)
        if last or rank0_missing(self.rank0):
            return
        if any(not s.host.group_alive(s.pgid) for s in self.servers[1:] if s.pgid):
            self.rank0._kill_group(self.rank0.pgid)  # type: ignore[arg-type]

    def _deaths(self, include_rank0: bool = False) -> dict[int, ServerDeath]:
        start = 0 if include_rank0 else 1
        out = {}
        for rank in range(start, len(self.servers)):
            death = self.servers[rank].check()
            if death is not None:
                out[rank] = death
        return out

    def _judge_start(self, result: StartResult, deaths: dict[int, ServerDeath]) -> StartResult:
        """A failed start over all ranks: a follower's own evidence of the configuration wins,
        then rank 0's; else the world's, named by the follower that went."""
        if deaths:
            rank, death = self._worst(deaths)
            if is_config_failure(death.failure):
                reason = f"{self._who(rank)}: {death.reason}"
                return replace(
                    result,
                    ok=False,
                    failure=death.failure,
                    reason=reason,
                    evidence=death.evidence,
                    exit_code=death.exit_code,
                )
        if not result.ok and is_config_failure(result.failure):
            return result
        if not deaths:
            return result  # rank 0's own failure, the world's (a timeout, a crash)
        first = _first_lost(deaths)
        return replace(
            result,
            ok=False,
            failure=FailureClass.CRASHED,
            reason=self._lost(first, deaths[first]),
            evidence=deaths[first].evidence,
            exit_code=deaths[first].exit_code,
        )

    @staticmethod
    def _worst(deaths: dict[int, ServerDeath]) -> tuple[int, ServerDeath]:
        """The first rank with the configuration's evidence, else the lowest rank."""
        for rank in sorted(deaths):
            if is_config_failure(deaths[rank].failure):
                return rank, deaths[rank]
        first = min(deaths)
        return first, deaths[first]

    def _who(self, rank: int) -> str:
        return f"node-rank {rank} ({self.names[rank]})"

    def _lost(self, rank: int, death: ServerDeath) -> str:
        code = f"exit {death.exit_code}" if death.exit_code is not None else "no exit code"
        return (
            f"{self._who(rank)} lost without SGLang's evidence of the configuration "
            f"({code}: {death.reason})"
        )


#: NCCL's watchdog line of a rank that ended because another went (sim/nodes.py)
WATCHDOG_LINE = "Process group watchdog thread terminated with exception"


def _first_lost(deaths: dict[int, ServerDeath]) -> int:
    """The rank that went first: one without NCCL's watchdog line (which a rank prints when
    another is gone), else the lowest."""
    for rank in sorted(deaths):
        if not any(WATCHDOG_LINE in line for line in deaths[rank].evidence):
            return rank
    return min(deaths)


def rank0_missing(server: Server) -> bool:
    return server.pgid is None


def nodes_server(
    target: TargetSection, api_key: str | None = None, marker: str | None = None
) -> NodesServer:
    """The study's server across `target.nodes`: one SSH host and `Server` per node (each with
    the target's SSH settings and its own overrides, the same marker), rank 0's reached
    through an SSH tunnel, the rendezvous at nodes[0]'s address (as ssh_config resolves it:
    the other nodes reach it there) and `target.dist_init_port`."""
    assert target.nodes is not None
    servers = []
    for node in target.nodes:
        host = SSHHost(SSHOptions.from_section(node.host, node_ssh(target, node)))
        servers.append(
            Server(
                host,
                target.timeouts,
                # the tuner reaches rank 0 only (followers serve a dummy /health at most)
                endpoint=TunnelEndpoint(host) if not servers else None,
                api_key=api_key,
                marker=marker,
                keep_logs=target.workdir is not None,
            )
        )
    first = target.nodes[0]
    address = _resolve(SSHOptions.from_section(first.host, node_ssh(target, first))).hostname
    port = target.dist_init_port or DEFAULT_DIST_INIT_PORT
    return NodesServer(servers, [n.host for n in target.nodes], f"{address}:{port}")
