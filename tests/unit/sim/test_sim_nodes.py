"""The simulator across nodes (sim/nodes.py): SGLang's refusals of a layout, and the
rendezvous of two ranks in one event loop (join, a timeout's torch message, a lost peer's NCCL
lines, rank 0's graceful leave)."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.net import free_port
from tuner.sim.flags import parse_flags
from tuner.sim.http.world import World
from tuner.sim.nodes import nodes_refusal
from tuner.sim.profile import load_profile
from tuner.sim.startup import build_script


def _ns(*extra: str):
    return parse_flags(["--model-path", "m", *extra])


@pytest.mark.parametrize(
    ("flags", "line", "code"),
    [
        (
            ["--tp", "3", "--nnodes", "2"],
            "AssertionError: tp_size must be divisible by number of nodes",
            1,
        ),
        (["--tp", "2", "--nnodes", "2", "--node-rank", "2"], "--node-rank 2 is not in 0..1", 2),
        (["--tp", "2", "--nnodes", "2"], "needs --dist-init-addr", 2),
        (
            ["--tp", "2", "--dp", "2", "--nnodes", "2", "--dist-init-addr", "h:1"],
            "multi-node data parallel",
            1,
        ),
    ],
)
def test_sglang_refuses_a_layout_before_loading(flags, line, code) -> None:
    ns = _ns(*flags)
    refused = nodes_refusal(ns)
    assert refused is not None and line in refused[0] and refused[1] == code
    script = build_script(ns, load_profile(ns.sim_profile))
    assert script.failure is not None and script.failure.exit_code == code
    assert line in script.failure.lines[0].text


def test_a_two_node_layout_plays_like_one_node_of_the_same_tp() -> None:
    one = _ns("--tp", "2")
    two = _ns("--tp", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "h:1")
    assert nodes_refusal(two) is None
    profile = load_profile(one.sim_profile)
    a, b = build_script(one, profile), build_script(two, profile)
    assert a.failure is None and b.failure is None
    assert a.plan == b.plan  # tp is the total: each GPU holds 1/tp either way


def _world(rank: int, port: int, timeout: float = 5.0) -> tuple[World, list[str]]:
    ns = _ns(
        "--tp",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--dist-init-addr",
        f"127.0.0.1:{port}",
    )
    ns.dist_timeout = timeout
    said: list[str] = []
    return World(ns, lambda text, **kw: said.append(text)), said


def test_rank_0_times_out_with_torchs_message() -> None:
    async def run() -> tuple[str, ...] | None:
        world, _ = _world(0, free_port(), timeout=0.2)
        try:
            return await world.join(asyncio.Event())
        finally:
            await world.close()

    lines = asyncio.run(run())
    assert lines is not None and lines[0].startswith("torch.distributed.DistStoreError: Timed out")
    assert lines[0].endswith("waiting for clients. 1/2 clients joined.")


def test_two_ranks_meet_and_a_lost_one_is_seen() -> None:
    async def run() -> None:
        port = free_port()
        zero, said = _world(0, port)
        one, _ = _world(1, port)
        stop = asyncio.Event()
        assert await asyncio.gather(zero.join(stop), one.join(stop)) == [None, None]
        assert said == ["Init torch distributed begin.", "Init torch distributed ends."]
        await one.close()  # rank 1 gone without a word: rank 0's NCCL fails
        await asyncio.wait_for(zero.lost.wait(), 5)
        lines = zero.lost_lines()
        assert "Process group watchdog thread terminated with exception: NCCL error" in lines[1]
        assert lines[4].startswith("socketProgress: Connection closed by remote peer 127.0.0.1<")
        await zero.close()

    asyncio.run(run())


def test_rank_0s_graceful_stop_is_no_lost_peer_for_a_follower() -> None:
    async def run() -> None:
        port = free_port()
        zero, _ = _world(0, port)
        one, _ = _world(1, port)
        stop = asyncio.Event()
        await asyncio.gather(zero.join(stop), one.join(stop))
        await zero.leave()
        await asyncio.wait_for(one.lost.wait(), 5)
        assert one.leaving  # rank 0 said bye: the follower exits 0
        await one.close()

    asyncio.run(run())
