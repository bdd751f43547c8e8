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
Pure: the refusals; the rendezvous itself (sockets, asyncio) is sim/http/world.py.
A rank that stops on SIGTERM tells its peers it is leaving (the simulator's stand-in for rank
0's ShutdownReq broadcast): they exit 0 instead of reporting a lost peer.
"""

from __future__ import annotations

import argparse


def nodes_refusal(ns: argparse.Namespace) -> tuple[str, int] | None:
    """(line, exit code) when SGLang (exit 1) or the simulator (exit 2) refuses the layout."""
    nnodes, rank = ns.nnodes, ns.node_rank
    if nnodes < 1 or not 0 <= rank < nnodes:
        return f"launch_server.py: error: --node-rank {rank} is not in 0..{nnodes - 1}", 2
    if (ns.tp_size * ns.pp_size) % nnodes:
        return "AssertionError: tp_size must be divisible by number of nodes", 1
    if ns.dp_size > 1 and nnodes != 1 and not ns.enable_dp_attention:
        return "AssertionError: multi-node data parallel is not supported unless dp attention!", 1
    if nnodes > 1 and not (ns.dist_init_addr and split_addr(ns.dist_init_addr)):
        # SGLang would fall back to a port on 127.0.0.1 of each node and never meet: the
        # simulator says so at once instead of waiting out the timeout
        return (
            "launch_server.py: error: the simulator needs --dist-init-addr HOST:PORT "
            "with --nnodes > 1"
        ), 2
    return None


def split_addr(addr: str) -> tuple[str, int] | None:
    host, _, port = addr.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None
