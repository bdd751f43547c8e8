"""The torch.distributed world of a simulated server across nodes: rank 0's store, the other
ranks' connections to it, a lost peer (what SGLang does and why: sim/nodes.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from tuner.sim.nodes import split_addr
from tuner.sim.startup import EXIT_CHILD_FAILED, SIGQUIT_LINE

#: torch.distributed's default timeout (torch/distributed/constants.py default_pg_timeout,
#: 30 min) when SGLang's --dist-timeout is None
DEFAULT_DIST_TIMEOUT_S = 1800
#: NCCL's version the lines name (the one pytorch 2.5-2.7 wheels ship)
NCCL_VERSION = "2.21.5"
#: what a leaving rank sends its peers before closing (graceful shutdown, not a lost peer)
BYE = b"bye\n"
#: a follower retries its connection to rank 0's store this often (torch backs off similarly)
RETRY_S = 0.1


class PeerLost(Exception):
    """A peer of the world is gone while this rank runs: NCCL's lines, then the tree ends."""

    def __init__(self, lines: tuple[str, ...]):
        super().__init__(lines[1] if len(lines) > 1 else "peer lost")
        self.lines = lines


class World:
    """This rank's view of the torch.distributed world: the store (rank 0) or a client."""

    def __init__(self, ns: argparse.Namespace, log: Callable[..., None]):
        addr = split_addr(ns.dist_init_addr)
        assert addr is not None
        self.host, self.port = addr
        self.nnodes, self.rank = ns.nnodes, ns.node_rank
        self.per_node = ns.tp_size * ns.pp_size // ns.nnodes
        self.world = ns.tp_size * ns.pp_size
        self.timeout_s = float(ns.dist_timeout or DEFAULT_DIST_TIMEOUT_S)
        self.log = log
        self.lost = asyncio.Event()
        self.leaving = False  # a peer said bye, or we did
        self.lost_peer = ""
        self._peers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task] = []
        self._server: asyncio.Server | None = None

    @property
    def first_rank(self) -> int:
        """This node's first TP rank (SGLang's ` TP<k>` log tag)."""
        return self.per_node * self.rank

    async def join(self, stop: asyncio.Event) -> tuple[str, ...] | None:
        """Meet the other ranks; None once joined, else the exception lines (or () when
        SIGTERM came first)."""
        self.log("Init torch distributed begin.", scheduler=True)
        if self.rank == 0:
            lines = await self._serve_store(stop)
        else:
            lines = await self._connect(stop)
        if lines is None:
            self.log("Init torch distributed ends.", scheduler=True)
        return lines

    async def _serve_store(self, stop: asyncio.Event) -> tuple[str, ...] | None:
        joined = asyncio.Event()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._peers.append(writer)
            if len(self._peers) >= self.nnodes - 1:
                joined.set()
            peer = writer.get_extra_info("peername") or ("?", 0)
            self._watch(reader, f"{peer[0]}<{peer[1]}>")

        try:
            self._server = await asyncio.start_server(on_client, self.host, self.port)
        except OSError as exc:
            return (
                "torch.distributed.DistNetworkError: The server socket has failed to listen on "
                f"any local network address. port: {self.port}, useIpv6: false, code: "
                f"-{exc.errno}, name: {exc.strerror}",
            )
        if await self._wait(joined, stop):
            return ()
        if joined.is_set():
            return None
        self._failed = True
        clients = self.per_node * (1 + len(self._peers))
        return (
            f"torch.distributed.DistStoreError: Timed out after {self.timeout_s + 1:g} seconds "
            f"waiting for clients. {clients}/{self.world} clients joined.",
        )

    async def _connect(self, stop: asyncio.Event) -> tuple[str, ...] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                if loop.time() > deadline:
                    ms = int(self.timeout_s * 1000)
                    return (
                        "torch.distributed.DistNetworkError: The client socket has timed out "
                        f"after {ms}ms while trying to connect to ({self.host}, {self.port}).",
                    )
                await asyncio.sleep(RETRY_S)
                continue
            self._peers.append(writer)
            self._watch(reader, f"{self.host}<{self.port}>")
            return None
        return ()

    async def _wait(self, event: asyncio.Event, stop: asyncio.Event) -> bool:
        """Wait for `event` up to the timeout; True when SIGTERM (`stop`) came first."""
        waiters = {asyncio.create_task(event.wait()), asyncio.create_task(stop.wait())}
        _, pending = await asyncio.wait(
            waiters, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        return stop.is_set() and not event.is_set()

    def _watch(self, reader: asyncio.StreamReader, peer: str) -> None:
        async def watch() -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(64):
                    if BYE in data:
                        self.leaving = True
            if not self.lost.is_set():
                self.lost_peer = peer
                self.lost.set()

        self._tasks.append(asyncio.create_task(watch()))

    def lost_lines(self) -> tuple[str, ...]:
        """NCCL's watchdog on this rank once a peer is gone (pytorch#150916's wording)."""
        rank = self.first_rank
        return (
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog "
            "thread terminated with exception: NCCL error: remote process exited or there was "
            f"a network error, NCCL version {NCCL_VERSION}",
            "ncclRemoteError: A call failed possibly due to a network error or a remote "
            "process exiting prematurely.",
            "Last error:",
            f"socketProgress: Connection closed by remote peer {self.lost_peer}",
            "Exception raised from checkForNCCLErrorsInternal at "
            "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2363 (most recent call "
            "first):",
            "Fatal Python error: Aborted",
        )

    async def leave(self) -> None:
        """A graceful stop: tell the peers, then close (they exit 0, not on a lost peer)."""
        self.leaving = True
        for writer in self._peers:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(BYE)
                await asyncio.wait_for(writer.drain(), 1.0)
        await self.close()

    async def close(self) -> None:
        for writer in self._peers:
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()


def print_join_failure(log: Callable[..., None], lines: tuple[str, ...]) -> int:
    """The rendezvous failed in a scheduler: its exception, then the parent's sigquit."""
    log("Scheduler hit an exception: Traceback (most recent call last):", scheduler=True)
    for line in lines:
        log(line, raw=True)
    log("", raw=True)
    log(SIGQUIT_LINE)
    return EXIT_CHILD_FAILED


async def watch_world(srv: Any, world: World) -> None:
    """A peer gone while this rank (`srv`, its SimServer) runs: NCCL's watchdog ends it; rank
    0's goodbye is a graceful stop for its followers."""
    await world.lost.wait()
    if world.leaving and world.rank > 0:
        srv.stop.set()
        return
    if not srv.stop.is_set() or srv.state != "draining":
        srv.crash = PeerLost(world.lost_lines())
        srv.stop.set()
