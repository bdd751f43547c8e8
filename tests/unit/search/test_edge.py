"""The mfs edge probe: the best server's mem-fraction-static bisected toward the nearest mfs
above it that failed, on its other flags; a queued trial per restart, never past a known cliff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from tests.helpers.paths import REPO
from tuner.api import tune
from tuner.capacity.precheck import Hardware
from tuner.config.load import parse_study
from tuner.outcome import POOL_ATTR, Attr, Status
from tuner.search.edge import MFS, ProbeEdge, edge_probe, ladder
from tuner.sim.virtual.server import VirtualServer
from tuner.sim.virtual.study import virtual_seams

DIST = FloatDistribution(0.80, 0.95, step=0.01)
FIXED = {"model-path": "m", "chunked-prefill-size": 8192}


def flags_for(params: dict[str, Any]) -> dict[str, Any]:
    return {**FIXED, **params}


def trial(
    mfs: float, status: Status, value: float = 0.0, pool: int | None = None, **params: Any
) -> FrozenTrial:
    """A completed trial as the loop stores it (feasible iff measured and OK; `pool`: the KV
    pool its server reported)."""
    ok = status == Status.OK
    return create_trial(
        params={MFS: mfs, **params},
        distributions={MFS: DIST, **{k: CategoricalDistribution([v]) for k, v in params.items()}},
        values=[value if ok else 0.0],
        user_attrs={Attr.STATUS: status, **({POOL_ATTR: pool} if pool else {})},
        system_attrs={"constraints": [-1.0 if ok else 1.0]},
    )


def probe(*trials: FrozenTrial, dist: Any = DIST) -> float | None:
    found = edge_probe(list(trials), dist, flags_for)
    return None if found is None else found.params[MFS]


def test_with_no_failure_above_the_probe_climbs_halfway_past_the_top() -> None:
    # nothing failed above 0.86: the gap ends one step past 0.95, so 0.91 is halfway
    assert probe(trial(0.86, Status.OK, 700)) == pytest.approx(0.91)


def test_each_probe_halves_the_gap_to_the_failure_above() -> None:
    best = trial(0.86, Status.OK, 700)
    assert probe(best, trial(0.94, Status.DIED)) == pytest.approx(0.90)
    # the probe ran and became the best: next, halfway between it and the death
    assert probe(best, trial(0.94, Status.DIED), trial(0.90, Status.OK, 800)) == pytest.approx(0.92)
    done = [best, trial(0.94, Status.DIED), trial(0.90, Status.OK, 800), trial(0.92, Status.DIED)]
    assert probe(*done) == pytest.approx(0.91)
    assert probe(*done, trial(0.91, Status.OK, 830)) is None  # the edge: 0.91 lives, 0.92 dies


def test_the_best_not_the_latest_is_probed_and_a_flat_curve_is_left_alone() -> None:
    best = trial(0.86, Status.OK, 900)
    # a feasible server above measured less: the pool no longer binds up there
    assert probe(best, trial(0.90, Status.OK, 850)) is None
    # a failure above that feasible one does not reopen the gap below it
    assert probe(best, trial(0.90, Status.OK, 850), trial(0.93, Status.DIED)) is None


def test_every_failure_of_the_same_flags_is_a_ceiling_but_not_another_servers_slo_miss() -> None:
    best = trial(0.86, Status.OK, 700, **{"hicache-size": 30})
    for failed in (Status.DIED, Status.START_FAILED, Status.REJECTED, Status.SLO_MISSED):
        assert probe(best, trial(0.88, failed, **{"hicache-size": 30})) == pytest.approx(0.87)
    # another hicache-size missed its SLO at 0.88: says nothing of this server's pool
    assert probe(best, trial(0.88, Status.SLO_MISSED, **{"hicache-size": 0})) == pytest.approx(0.91)


def test_a_gpu_failure_with_the_same_memory_flags_is_a_ceiling_whatever_hicache() -> None:
    best = trial(0.86, Status.OK, 700, **{"hicache-size": 30})
    died = trial(0.88, Status.DIED, **{"hicache-size": 0})
    assert probe(best, died) == pytest.approx(0.87)
    # the same death with another chunked-prefill-size is another memory budget
    other = trial(0.88, Status.DIED, **{"hicache-size": 30, "chunked-prefill-size": 2048})
    best2 = trial(0.86, Status.OK, 700, **{"hicache-size": 30, "chunked-prefill-size": 8192})
    assert probe(best2, other) == pytest.approx(0.91)


def test_at_the_cliff_a_server_that_served_more_per_pool_token_is_lifted_to_it() -> None:
    """The best (hicache off) sits at the cliff: 0.91 lives, 0.92 died. A hicache server measured
    at 0.88 served more per token of its pool: it runs at 0.91 next, and only once."""
    h = "hicache-size"
    edge = [trial(0.91, Status.OK, 940, pool=140_000, **{h: 0}), trial(0.92, Status.DIED, **{h: 0})]
    lean = trial(0.88, Status.OK, 860, pool=110_000, **{h: 30})  # 7.8 per 1k tokens > 6.7
    found = edge_probe([*edge, lean], DIST, flags_for)
    assert found is not None and found.params == {MFS: 0.91, h: 30} and found.of == lean.number
    lifted = trial(0.91, Status.OK, 990, pool=140_000, **{h: 30})
    assert probe(*edge, lean, lifted) is None  # the new best's edge is known: nothing left
    # less per pool token than the best: raising its pool would not reach the best
    assert probe(*edge, trial(0.88, Status.OK, 700, pool=110_000, **{h: 30})) is None
    # the cliff is not known yet (nothing failed right above the best): bisect, no lift
    assert probe(edge[0], trial(0.94, Status.DIED, **{h: 0}), lean) == pytest.approx(0.92)
    # another memory budget (chunked-prefill-size) has its own cliff: no lift across
    other = trial(0.88, Status.OK, 860, pool=110_000, **{h: 30, "chunked-prefill-size": 2048})
    best = trial(0.91, Status.OK, 940, pool=140_000, **{h: 0, "chunked-prefill-size": 8192})
    died = trial(0.92, Status.DIED, **{h: 0, "chunked-prefill-size": 8192})
    found = edge_probe([best, died, other], DIST, flags_for)
    # ... it is climbed toward its own cliff instead (search/edge.py `_other_cliffs`)
    assert (
        found is not None
        and found.of == other.number
        and found.params["chunked-prefill-size"] == 2048
    )
    assert found.params[MFS] == pytest.approx(0.92)


def served(
    mfs: float, value: float, pool: int, chosen: int, *points: tuple[int, str, bool], **params: Any
) -> FrozenTrial:
    """A feasible trial whose inner search chose `chosen`; points: (concurrency, status, clear)."""
    t = trial(mfs, Status.OK, value, pool=pool, **params)
    t.user_attrs[Attr.CLIENT] = {"concurrency": chosen}
    t.user_attrs[Attr.LOAD_POINTS] = [
        {"concurrency": c, "status": st, "clear": clear} for c, st, clear in points
    ]
    return t


def per_1000(pool: int | None) -> float:
    """The pool holds a request per 1,000 tokens."""
    return pool / 1000 if pool else float("inf")


def climbs(*trials: FrozenTrial) -> bool:
    return edge_probe(list(trials), DIST, flags_for, per_1000) is not None


def test_no_climb_past_a_latency_limit_the_pool_holds() -> None:
    limit = (64, "slo_missed", False)
    # the limit at 64 requests, the pool holds 400: more pool cannot move it
    assert not climbs(served(0.85, 900, 400_000, 48, (48, "ok", True), limit))
    # held with no margin counts as a limit too; a death or a point below the best does not
    assert not climbs(served(0.85, 900, 400_000, 48, (64, "ok", False)))
    assert climbs(served(0.85, 900, 400_000, 48, (64, "died", False)))
    assert climbs(served(0.85, 900, 400_000, 48, (32, "slo_missed", False)))
    # the pool holds 50: the limit at 64 may be the pool's (requests waited for KV memory)
    assert climbs(served(0.85, 900, 50_000, 48, limit))
    # no limit found (throughput flattened), or the pool not reported: climb
    assert climbs(served(0.85, 900, 400_000, 48, (48, "ok", True), (64, "ok", True)))
    assert climbs(served(0.85, 900, 0, 48, limit))
    # without the inner search's count of what a pool holds, the pool is taken to bind
    best = served(0.85, 900, 400_000, 48, limit)
    assert edge_probe([best], DIST, flags_for) is not None


def test_a_limit_found_on_another_mfs_of_the_same_flags_stops_the_climb() -> None:
    best = served(0.88, 950, 450_000, 90, (90, "ok", True))
    lower = served(0.82, 900, 400_000, 64, (256, "slo_missed", False))  # 256 < 400 held
    assert not climbs(best, lower)
    # another chunk size's limit is its own; one beyond what the other's pool held may be the pool's
    other = served(
        0.82, 900, 400_000, 64, (256, "slo_missed", False), **{"chunked-prefill-size": 2048}
    )
    assert climbs(best, other)
    small = served(0.80, 900, 200_000, 150, (256, "slo_missed", False))  # held only 200
    assert climbs(best, small)


def test_at_the_cliff_with_nothing_to_lift_the_other_flags_are_drawn_there_once() -> None:
    h = "hicache-size"
    best = trial(0.91, Status.OK, 940, pool=140_000, **{h: 0, "chunked-prefill-size": 8192})
    died = trial(0.92, Status.DIED, **{h: 0, "chunked-prefill-size": 8192})
    sampled = (MFS, h, "chunked-prefill-size")
    found = edge_probe([best, died], DIST, flags_for, sampled=sampled)
    # mfs and the memory flags fixed (the cliff is theirs); hicache left to the sampler
    assert found is not None and found.pin
    assert found.params == {MFS: 0.91, "chunked-prefill-size": 8192}
    pinned = trial(0.91, Status.OK, 930, pool=140_000, **{h: 36, "chunked-prefill-size": 8192})
    pinned.user_attrs[Attr.EDGE_PIN] = best.number
    assert edge_probe([best, died, pinned], DIST, flags_for, sampled=sampled) is None
    # nothing but memory flags sampled, or below the cliff: no pin
    assert edge_probe([best, died], DIST, flags_for, sampled=(MFS,)) is None
    assert edge_probe([best], DIST, flags_for, sampled=sampled).params[MFS] > 0.91


def test_ladders_choices_and_ranges_without_a_step() -> None:
    assert ladder(CategoricalDistribution([0.9, 0.8, 0.85])) == [0.8, 0.85, 0.9]
    assert ladder(FloatDistribution(0.8, 0.83)) == pytest.approx([0.8, 0.81, 0.82, 0.83])
    assert ladder(FloatDistribution(0.5, 0.9, log=True)) == []
    choices = CategoricalDistribution([0.80, 0.85, 0.90])
    assert probe(trial(0.80, Status.OK, 1), trial(0.90, Status.DIED), dist=choices) == 0.85
    assert probe(trial(0.80, Status.SLO_MISSED)) is None  # nothing feasible: nothing to climb


def _kimi_file() -> dict[str, Any]:
    """search_spaces/kimi-k2.5-tp8.yaml on the simulator (mfs x hicache-size x concurrency):
    its pool binds, and from mfs 0.92 a prefill runs out of memory under load."""
    d = yaml.safe_load((REPO / "search_spaces" / "kimi-k2.5-tp8.yaml").read_text())
    sim = ["{python}", "-m", "tuner.sim", "--sim-startup-seconds", "1"]
    d["target"] = {"host": "local", "launch": [*sim, "--sim-profile", "kimi-k2.5-tp8"]}
    d["space"] = {k: d["space"][k] for k in (MFS, "hicache-size", "concurrency")}
    d["baseline"] = {k: v for k, v in d["baseline"].items() if k in d["space"]}
    d["workload"]["duration_s"] = 60
    d["budget"].update(confirm_top=0, inner_runs=3)
    return d


def _demo_file() -> dict[str, Any]:
    """The demo's H100 with 1,024-token prompts: a pool for ~450 of them, the TTFT limit ~200."""
    d = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    d["space"] = {
        MFS: {"low": 0.80, "high": 0.98, "step": 0.01},
        "concurrency": {"low": 8, "high": 256, "log": True},
    }
    d["baseline"] = {MFS: 0.82}
    d["workload"].update(input_len=1024, output_len=128, range_ratio=0.5, duration_s=3)
    d["objective"]["slo"] = {"p99_ttft_ms": 2900}
    d["budget"].update(confirm_top=0, inner_runs=3)
    return d


def _virtual(data: dict[str, Any], tmp_path: Path, n_trials: int) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    cfg = parse_study(data, "s.yaml")
    return tune(
        cfg, runs_dir=tmp_path, seed=3, n_trials=n_trials, make_seams=virtual_seams(3)
    ).study


def test_a_virtual_study_climbs_from_the_baseline_to_the_cliff_one_restart_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a host without nvidia-smi: no GPU memory read, so no ceiling predicted (search/ceiling.py)
    monkeypatch.setattr(VirtualServer, "gpu_memory", lambda self: None)
    trials = _virtual(_kimi_file(), tmp_path, 5).trials
    probes = [t for t in trials if Attr.EDGE_OF in t.user_attrs]
    assert [t.number for t in probes] == [1, 2, 3, 4]  # the baseline, then each probe's next
    for t in probes:
        below = trials[t.user_attrs[Attr.EDGE_OF]]
        assert below.params[MFS] < t.params[MFS]  # always up from the best it probed
        assert below.user_attrs[Attr.STATUS] == Status.OK
    # the gap halves: no probe lands where an earlier one already failed or below a success
    deaths = [t.params[MFS] for t in trials if t.user_attrs[Attr.STATUS] != Status.OK]
    oks = [t.params[MFS] for t in trials if t.user_attrs[Attr.STATUS] == Status.OK]
    assert deaths and max(oks) < min(deaths), (oks, deaths)


def test_no_climb_where_the_latency_limit_is_below_what_the_pool_holds(tmp_path: Path) -> None:
    trials = _virtual(_demo_file(), tmp_path, 4).trials
    base = trials[0].user_attrs
    chosen, pool = base[Attr.CLIENT]["concurrency"], base[POOL_ATTR]
    missed = [p["concurrency"] for p in base[Attr.LOAD_POINTS] if p["status"] == "slo_missed"]
    # the premise: an SLO broke above the baseline's best, where its pool held every request
    assert missed and chosen < min(missed) < pool / (1024 + 128)
    assert not any(Attr.EDGE_OF in t.user_attrs for t in trials)


def test_the_callback_queues_one_probe_and_never_twice(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db")
    best = trial(0.86, Status.OK, 700)
    study.add_trial(best)
    cb = ProbeEdge(DIST, flags_for)
    cb(study, study.trials[-1])
    cb(study, study.trials[-1])  # a waiting probe: nothing more queued
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"][MFS] for t in waiting] == [pytest.approx(0.91)]
    assert waiting[0].user_attrs[Attr.EDGE_OF] == 0
    ProbeEdge(None, flags_for)(study, study.trials[0])  # mfs not searched: no probe
    ProbeEdge(DIST, flags_for, n_trials=1)(study, study.trials[0])  # budget spent: none
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 1


def test_mfs_edge_off_leaves_every_server_to_the_sampler(tmp_path: Path) -> None:
    data = _kimi_file()
    data.setdefault("sampler", {})["mfs_edge"] = False
    study = _virtual(data, tmp_path, 3)
    assert len(study.trials) == 3 and not any(Attr.EDGE_OF in t.user_attrs for t in study.trials)


def test_the_callback_enqueues_a_pin_with_only_the_fixed_flags(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db")
    h = "hicache-size"
    study.add_trial(trial(0.91, Status.OK, 940, pool=140_000, **{h: 0}))
    study.add_trial(trial(0.92, Status.DIED, **{h: 0}))
    ProbeEdge(DIST, flags_for, sampled=(MFS, h))(study, study.trials[-1])
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))
    assert waiting.system_attrs["fixed_params"] == {MFS: 0.91}
    assert waiting.user_attrs == {Attr.EDGE_PIN: 0}


def test_a_virtual_study_jumps_to_the_cliff_its_gpu_memory_predicts(tmp_path: Path) -> None:
    """Kimi TP8 at mfs 0.85 holds all but ~6 GiB of its GPUs after a load run; each hundredth of
    mfs is ~1 GiB more pool, so the probe goes straight to 0.91 (the memory plan: a full prefill
    chunk fits there and not at 0.92) and, alive there, counts the cliff as found."""
    trials = _virtual(_kimi_file(), tmp_path, 3).trials
    base, jump, pin = trials
    assert base.params[MFS] == pytest.approx(0.85) and jump.user_attrs[Attr.EDGE_OF] == 0
    assert jump.params[MFS] == pytest.approx(0.91)
    assert jump.user_attrs[Attr.STATUS] == Status.OK
    assert pin.user_attrs[Attr.EDGE_PIN] == 1 and pin.params[MFS] == pytest.approx(0.91)


def test_a_virtual_study_draws_hicache_at_the_cliff_it_found(tmp_path: Path) -> None:
    trials = _virtual(_kimi_file(), tmp_path, 6).trials
    cliff = next(t for t in trials if Attr.EDGE_PIN in t.user_attrs)
    best = trials[cliff.user_attrs[Attr.EDGE_PIN]]
    assert cliff.params[MFS] == best.params[MFS]  # pinned at the best's mfs, the cliff
    assert cliff.params["hicache-size"] != best.params["hicache-size"]  # drawn by the sampler


def test_the_studys_hardware_gives_the_neighbours_their_memory() -> None:
    """`ProbeEdge.of` with the pre-check's hardware: pools move along mfs by the GPU over the
    cell, and the reserve SGLang keeps for a graph batch of 256 instead of 64 is 384 MiB more
    (2 MiB a batch, server_args.py:848-890); without the GPU's memory, neither is known."""
    cfg = parse_study(_kimi_file())
    hw = Hardware(bytes_per_token=70_272, gpu_mem_mib=97_887)
    edge = ProbeEdge.of(cfg, lambda p: {**cfg.server, **p}, hardware=hw)
    assert edge.memory is not None
    grown = edge.memory.pool_at({}, 100_000, 0.85, 0.87)
    assert grown == 100_000 + int(0.02 * 97_887 * 2**20 / 70_272)
    spare = edge.memory.spare({"cuda-graph-max-bs": 256}, {"cuda-graph-max-bs": 64})
    assert spare == pytest.approx(384 / 97_887)
    assert ProbeEdge.of(cfg, lambda p: p, hardware=Hardware()).memory is None
    assert ProbeEdge.of(cfg, lambda p: p).memory is None
