"""A simulated server across nodes: SGLang's `--nnodes N --node-rank i --dist-init-addr H:P`.

What SGLang does, and the simulator plays:
- the flags (0.5.6.post2 server_args.py:2845-2856: `--nnodes` 1, `--node-rank` 0,
  `--dist-init-addr`/`--nccl-init-addr` None) and their check (:4081-4084, an AssertionError in
  the main process: "tp_size must be divisible by number of nodes"; :4093-4095 multi-node DP
  needs DP attention). `--tp-size` is the total over the nodes: each node runs tp / nnodes
  scheduler ranks (entrypoints/engine.py:819-824), each holding 1/tp of the weights, so the
  per-GPU memory plan is the one-node plan of the same tp.
- the rendezvous: every scheduler calls init_distributed_environment with
  `tcp://<dist-init-addr>` (model_executor/model_runner.py:649-650); rank 0's TCPStore listens
  there and waits for the world's ranks (a timeout: torch's `DistStoreError: Timed out after ...
  waiting for clients. k/n clients joined.`, TCPStore.cpp waitForWorkers, pytorch#65478).
  The simulator: rank 0 listens on the port; each rank > 0 connects (retrying, as torch's client
  does) and holds the connection; rank 0 goes on only once all nnodes - 1 joined.
- a non-zero rank runs only its schedulers, then `launch_dummy_health_check_server` on its
  --host/--port (/health, /ping, /health_generate: 200; engine.py:868-889, utils/common.py:2400)
  in a daemon thread whose bind failure is logged and ignored; it never logs "fired up".
- a peer lost while running: NCCL's watchdog aborts the others' schedulers with
  `Process group watchdog thread terminated with exception: NCCL error: remote process exited
  or there was a network error` (ProcessGroupNCCL.cpp checkForNCCLErrorsInternal; the text as
  in pytorch#150916). ASSUMPTION: SGLang's parent then ends the tree (exit 137); a real one may
  also hang until its watchdog timeout (sglang#3099): both are the world's failure to the tuner.
A rank that stops on SIGTERM tells its peers it is leaving (the simulator's stand-in for rank
0's ShutdownReq broadcast): they exit 0 instead of reporting a lost peer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable

#: torch.distributed's default timeout (torch/distributed/constants.py default_pg_timeout,
#: 30 min) when SGLang's --dist-timeout is None
DEFAULT_DIST_TIMEOUT_S = 1800
#: NCCL's version the lines name (the one pytorch 2.5-2.7 wheels ship)
NCCL_VERSION = "2.21.5"
#: what a leaving rank sends its peers before closing (graceful shutdown, not a lost peer)
BYE = b"bye\n"
#: a follower retries its connection to rank 0's store this often (torch backs off similarly)
RETRY_S = 0.1


def nodes_refusal(ns: argparse.Namespace) -> tuple[str, int] | None:
    """(line, exit code) when SGLang (exit 1) or the simulator (exit 2) refuses the layout."""
    nnodes, rank = ns.nnodes, ns.node_rank
    if nnodes < 1 or not 0 <= rank < nnodes:
        return f"launch_server.py: error: --node-rank {rank} is not in 0..{nnodes - 1}", 2
    if (ns.tp_size * ns.pp_size) % nnodes:
        return "AssertionError: tp_size must be divisible by number of nodes", 1
    if ns.dp_size > 1 and nnodes != 1 and not ns.enable_dp_attention:
        return "AssertionError: multi-node data parallel is not supported unless dp attention!", 1
    if nnodes > 1 and not (ns.dist_init_addr and _split(ns.dist_init_addr)):
        # SGLang would fall back to a port on 127.0.0.1 of each node and never meet: the
        # simulator says so at once instead of waiting out the timeout
        return (
            "launch_server.py: error: the simulator needs --dist-init-addr HOST:PORT "
            "with --nnodes > 1"
        ), 2
    return None


def _split(addr: str) -> tuple[str, int] | None:
    host, _, port = addr.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


class PeerLost(Exception):
    """A peer of the world is gone while this rank runs: NCCL's lines, then the tree ends."""

    def __init__(self, lines: tuple[str, ...]):
        super().__init__(lines[1] if len(lines) > 1 else "peer lost")
        self.lines = lines


class World:
    """This rank's view of the torch.distributed world: the store (rank 0) or a client."""

    def __init__(self, ns: argparse.Namespace, log: Callable[..., None]):
        addr = _split(ns.dist_init_addr)
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
