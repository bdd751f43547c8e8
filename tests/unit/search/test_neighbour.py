"""Neighbours of the best at its cliff: one layout flag changed, ranked by evidence (conclusive
only at the neighbour's mfs or above), at an mfs below the layout's known failures, never
twice, at most PER_BEST layouts per best."""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, create_trial

from tuner.config.space import ParamSpec
from tuner.outcome import POOL_ATTR, Attr, Status
from tuner.search.edge import MFS, ladder
from tuner.search.neighbour import PER_BEST, Memory, layout_params, neighbour_probe

DIST = FloatDistribution(0.85, 0.95, step=0.02)
GRID = ladder(DIST)
SPACE = {
    MFS: ParamSpec(low=0.85, high=0.95, step=0.02),
    "hicache-size": ParamSpec(choices=[0, 40]),
    "enable-dp-attention": ParamSpec(type="bool"),
    "data-parallel-size": ParamSpec(choices=[4, 8], when={"enable-dp-attention": True}),
    "cuda-graph-max-bs": ParamSpec(choices=[64, 256]),
    "speculative-algorithm": ParamSpec(choices=["none", "EAGLE3"]),
    "speculative-num-steps": ParamSpec(
        low=2, high=4, step=1, when={"speculative-algorithm": "EAGLE3"}
    ),
}
FIXED = {"model-path": "m", "tensor-parallel-size": 8}
BASE = {
    "hicache-size": 0,
    "enable-dp-attention": True,
    "data-parallel-size": 4,
    "cuda-graph-max-bs": 64,
    "speculative-algorithm": "none",
}


def flags_for(params: dict[str, Any]) -> dict[str, Any]:
    return {**FIXED, **params}


def trial(
    mfs: float, status: Status, value: float = 0.0, attrs: dict[str, Any] | None = None, **over: Any
) -> FrozenTrial:
    params = {k: v for k, v in {**BASE, **over}.items() if v is not None}
    ok = status == Status.OK
    return create_trial(
        params={MFS: mfs, **params},
        distributions={MFS: DIST, **{k: CategoricalDistribution([v]) for k, v in params.items()}},
        values=[value if ok else 0.0],
        user_attrs={Attr.STATUS: status, **(attrs or {})},
        system_attrs={"constraints": [-1.0 if ok else 1.0]},
    )


def fails_on_gpu(t: FrozenTrial) -> bool:
    return t.user_attrs.get(Attr.STATUS) == Status.DIED


def measured(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    ok = [t for t in trials if t.user_attrs[Attr.STATUS] == Status.OK]
    return sorted(ok, key=lambda t: -t.values[0])


def next_to(best: FrozenTrial, *others: FrozenTrial) -> dict[str, Any] | None:
    trials = [best, *others]
    return neighbour_probe(best, trials, measured(trials), SPACE, GRID, flags_for, fails_on_gpu)


def test_layout_params_are_the_memory_flags_with_choices() -> None:
    assert layout_params(SPACE) == [
        "enable-dp-attention",
        "data-parallel-size",
        "cuda-graph-max-bs",
        "speculative-algorithm",
    ]


def test_the_value_that_served_best_elsewhere_comes_first_at_the_bests_mfs() -> None:
    best = trial(0.95, Status.OK, 900)
    dp8 = trial(0.89, Status.OK, 850, **{"data-parallel-size": 8})
    spec = trial(
        0.91, Status.OK, 800, **{"speculative-algorithm": "EAGLE3", "speculative-num-steps": 3}
    )
    got = next_to(best, dp8, spec)
    assert got == {**BASE, "data-parallel-size": 8, MFS: 0.95}


def test_a_value_that_never_served_near_the_best_is_left_to_the_sampler() -> None:
    best = trial(0.95, Status.OK, 900)
    weak = {"data-parallel-size": 8}
    # every other layout value is ruled out by weak evidence; unseen ones remain
    others = [
        trial(0.95, Status.OK, 100, **weak),
        trial(0.95, Status.OK, 100, **{"cuda-graph-max-bs": 256}),
        trial(0.95, Status.OK, 100, **{"enable-dp-attention": False, "data-parallel-size": None}),
    ]
    got = next_to(best, *others)
    # the only unseen value: speculation on, its steps from the range's middle (no donor)
    assert got == {**BASE, "speculative-algorithm": "EAGLE3", "speculative-num-steps": 3, MFS: 0.95}


def test_activated_params_come_from_the_best_donor_and_deactivated_ones_are_dropped() -> None:
    best = trial(
        0.93, Status.OK, 900, **{"speculative-algorithm": "EAGLE3", "speculative-num-steps": 2}
    )
    off = trial(0.87, Status.OK, 880)
    got = next_to(best, off)
    assert got is not None and got["speculative-algorithm"] == "none"
    assert "speculative-num-steps" not in got
    # DP attention off drops its size; turning speculation on takes the donor's steps
    best = trial(0.93, Status.OK, 900)
    donors = [
        trial(
            0.87, Status.OK, 890, **{"speculative-algorithm": "EAGLE3", "speculative-num-steps": 4}
        ),
        trial(
            0.85, Status.OK, 700, **{"speculative-algorithm": "EAGLE3", "speculative-num-steps": 2}
        ),
    ]
    got = next_to(best, *donors)
    assert got == {**BASE, "speculative-algorithm": "EAGLE3", "speculative-num-steps": 4, MFS: 0.93}


def test_the_mfs_goes_below_a_gpu_failure_of_that_layout_and_tried_layouts_are_skipped() -> None:
    best = trial(0.95, Status.OK, 900)
    dp8 = {"data-parallel-size": 8}
    died = trial(0.93, Status.DIED, **dp8)
    assert next_to(best, trial(0.87, Status.OK, 890, **dp8), died)[MFS] == 0.91
    # that layout ran at 0.91 already: the next neighbour instead
    ran = trial(0.91, Status.OK, 850, **dp8)
    got = next_to(best, trial(0.87, Status.OK, 890, **dp8), died, ran)
    assert got is not None and got.get("data-parallel-size") != 8


def test_at_most_per_best_neighbours_per_best() -> None:
    best = trial(0.95, Status.OK, 900)
    best.number = 3
    layouts = [{"cuda-graph-max-bs": 256}, {"data-parallel-size": 8}, {"hicache-size": 40}]
    ran = [
        trial(0.95, Status.OK, 800, attrs={Attr.EDGE_NEIGHBOUR: 3}, **layout)
        for layout in layouts[:PER_BEST]
    ]
    assert next_to(best, *ran) is None
    assert next_to(best, *ran[: PER_BEST - 1]) is not None


def test_weak_evidence_from_a_smaller_pool_does_not_rule_a_value_out() -> None:
    # DP 8 served 0.6 of the best, but at mfs 0.87: at the best's 0.95 its pool is larger
    best = trial(0.95, Status.OK, 1000)
    low = trial(0.87, Status.OK, 600, **{"data-parallel-size": 8})
    ruled_out = [
        trial(0.95, Status.OK, 100, **{"cuda-graph-max-bs": 256}),
        trial(0.95, Status.OK, 100, **{"enable-dp-attention": False, "data-parallel-size": None}),
        trial(
            0.95,
            Status.OK,
            100,
            **{"speculative-algorithm": "EAGLE3", "speculative-num-steps": 3},
        ),
    ]
    got = next_to(best, low, *ruled_out)
    assert got == {**BASE, "data-parallel-size": 8, MFS: 0.95}
    # measured at 0.95 too it is conclusive: left to the sampler
    high = trial(0.95, Status.OK, 600, **{"data-parallel-size": 8, "hicache-size": 40})
    assert next_to(best, low, high, *ruled_out) is None


def test_promising_then_unseen_then_weak_from_a_smaller_pool() -> None:
    best = trial(0.95, Status.OK, 1000)
    dp8_low = trial(0.85, Status.OK, 500, **{"data-parallel-size": 8})
    graphs = trial(0.89, Status.OK, 900, **{"cuda-graph-max-bs": 256, "hicache-size": 40})
    spec = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": 3}
    no_dpa = {"enable-dp-attention": False, "data-parallel-size": None}
    weak = [trial(0.95, Status.OK, 100, **spec), trial(0.95, Status.OK, 100, **no_dpa)]
    # graph batch 256 served 0.9 of the best: first
    assert next_to(best, dp8_low, graphs, *weak) == {**BASE, "cuda-graph-max-bs": 256, MFS: 0.95}
    # speculation never measured: before DP 8's weak evidence from a smaller pool
    weak.append(trial(0.95, Status.OK, 100, **{"cuda-graph-max-bs": 256}))
    assert next_to(best, dp8_low, *weak[1:]) == {
        **BASE,
        "speculative-algorithm": "EAGLE3",
        "speculative-num-steps": 3,
        MFS: 0.95,
    }
    assert next_to(best, dp8_low, *weak) == {**BASE, "data-parallel-size": 8, MFS: 0.95}


def test_a_retry_below_a_neighbours_failure_is_the_same_neighbour() -> None:
    best = trial(0.95, Status.OK, 1000)
    best.number = 3
    dp8 = {"data-parallel-size": 8}
    failed = trial(0.95, Status.DIED, attrs={Attr.EDGE_NEIGHBOUR: 3}, **dp8)
    retry = trial(0.93, Status.OK, 800, attrs={Attr.EDGE_NEIGHBOUR: 3}, **dp8)
    # PER_BEST is 2 and one layout ran (twice): a second layout is still proposed
    assert PER_BEST == 2
    got = next_to(best, failed, retry)
    assert got is not None and got.get("data-parallel-size") != 8


#: pools grow 10,000 tokens per 0.01 of mfs; no layout reserves less than another
LINEAR = Memory(
    pool_at=lambda params, tokens, at, to: tokens + round((to - at) * 1_000_000),
    spare=lambda best, params: 0.0,
)


def pooled(mfs: float, value: float, pool: int, **over: Any) -> FrozenTrial:
    return trial(mfs, Status.OK, value, {POOL_ATTR: pool}, **over)


def near(best: FrozenTrial, *others: FrozenTrial, memory: Memory | None = LINEAR) -> Any:
    trials = [best, *others]
    ms = measured(trials)
    return neighbour_probe(best, trials, ms, SPACE, GRID, flags_for, fails_on_gpu, memory)


def test_weak_evidence_grown_to_the_neighbours_pool_comes_before_the_unseen() -> None:
    """DP 8 served 0.5 of the best at 0.87 with 40,000 tokens; at 0.95 its pool is 3x that:
    within reach of the best, so it runs before speculation, never measured."""
    best = pooled(0.95, 1000, 200_000)
    dp8 = pooled(0.87, 500, 40_000, **{"data-parallel-size": 8})
    graphs = trial(0.95, Status.OK, 100, **{"cuda-graph-max-bs": 256})
    no_dpa = trial(
        0.95, Status.OK, 100, **{"enable-dp-attention": False, "data-parallel-size": None}
    )
    dp8_first = {**BASE, "data-parallel-size": 8, MFS: 0.95}
    assert near(best, dp8, graphs, no_dpa) == dp8_first
    # without the GPU's memory, or with a pool that barely grows, it is last (unseen first)
    spec = {**BASE, "speculative-algorithm": "EAGLE3", "speculative-num-steps": 3, MFS: 0.95}
    assert near(best, dp8, graphs, no_dpa, memory=None) == spec
    big = pooled(0.87, 500, 400_000, **{"data-parallel-size": 8})
    assert near(best, big, graphs, no_dpa) == spec


def test_the_bound_comes_from_the_value_at_its_highest_mfs() -> None:
    """Throughput grows slower than the pool: the trial nearest the neighbour's mfs bounds it
    most tightly. No DP attention at 0.85 (50,000 tokens) would grow to 1.0x the best at 0.95;
    at 0.93 (130,000 tokens) it grows to 0.58x: not within reach, last."""
    best = pooled(0.95, 1000, 200_000)
    no_dpa = {"enable-dp-attention": False, "data-parallel-size": None}
    low = pooled(0.85, 450, 50_000, **no_dpa)
    high = pooled(0.93, 500, 130_000, **no_dpa)
    graphs = trial(0.95, Status.OK, 100, **{"cuda-graph-max-bs": 256})
    spec = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": 3}
    dp8 = trial(0.95, Status.OK, 100, **{"data-parallel-size": 8})
    ruled_out = (graphs, dp8)
    # from 0.85 alone it is within reach: before speculation, never measured
    alone = near(best, low, *ruled_out)
    no_dp = {k: v for k, v in BASE.items() if k != "data-parallel-size"}
    assert alone == {**no_dp, "enable-dp-attention": False, MFS: 0.95}
    # measured at 0.93 too, the bound from there is 0.58x: speculation (unseen) first
    got = near(best, low, high, *ruled_out)
    assert got == {**BASE, **spec, MFS: 0.95}


def test_a_layout_reserving_a_step_less_starts_one_step_up_and_first() -> None:
    """Best: DP 4, graph batch 256 at 0.91, dead at 0.93. Graph batch 64 reserves 0.03 of the
    GPU less: it starts at 0.93 (one step, never two) and before DP 8, earlier in the space."""
    best = pooled(0.91, 1000, 150_000, **{"cuda-graph-max-bs": 256})
    dead = trial(0.93, Status.DIED, **{"cuda-graph-max-bs": 256})

    def memory(room: float) -> Memory:
        def spare(b: Any, params: Any) -> float:
            return room if params["cuda-graph-max-bs"] < b["cuda-graph-max-bs"] else 0.0

        return Memory(LINEAR.pool_at, spare)

    plain = {"enable-dp-attention": False, "data-parallel-size": None, "cuda-graph-max-bs": 256}
    no_dpa = trial(0.93, Status.OK, 100, **plain)  # conclusive: left to the sampler
    assert near(best, dead, no_dpa, memory=memory(0.03)) == {**BASE, MFS: 0.93}
    assert near(best, dead, no_dpa, memory=memory(0.10)) == {**BASE, MFS: 0.93}
    # less than a step: the best's mfs, and the space's order (DP 8 first)
    got = near(best, dead, no_dpa, memory=memory(0.01))
    assert got == {**BASE, "cuda-graph-max-bs": 256, "data-parallel-size": 8, MFS: 0.91}
