"""What failures teach the pre-check: a death under load bounds mfs (and concurrency) from
above, a start with "Not enough memory" bounds mfs from below; only with the same memory flags."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.studies import study_dict
from tests.helpers.virtual import virtual_runner
from tuner.capacity.precheck import Hardware, Knowledge, precheck
from tuner.config.load import parse_study
from tuner.outcome import Status
from tuner.trial.runner import TrialRunner

BASE = {"model-path": "m", "chunked-prefill-size": 8192}


def test_a_death_under_load_rejects_higher_mfs_at_that_concurrency_or_more() -> None:
    know = Knowledge().with_death({**BASE, "mem-fraction-static": 0.90}, 128, 7)
    hw = Hardware()
    verdict = precheck({**BASE, "mem-fraction-static": 0.93}, hw, know, concurrency=200)
    assert not verdict.feasible and verdict.kind == "oom_runtime"
    assert "0.9" in verdict.reason and "128" in verdict.reason and "trial 7" in verdict.reason
    # less load, less mfs, another chunk size, or load unknown: measured, not rejected
    assert precheck({**BASE, "mem-fraction-static": 0.93}, hw, know, concurrency=64).feasible
    assert precheck({**BASE, "mem-fraction-static": 0.88}, hw, know, concurrency=200).feasible
    smaller = {**BASE, "chunked-prefill-size": 4096, "mem-fraction-static": 0.93}
    assert precheck(smaller, hw, know, concurrency=200).feasible
    # a larger chunk needs more activation memory for a prefill at the same headroom
    larger = {**BASE, "chunked-prefill-size": 16384, "mem-fraction-static": 0.90}
    v = precheck(larger, hw, know, concurrency=128)
    assert not v.feasible and "chunked-prefill-size 8192 (smaller)" in v.reason
    assert know.death_cap(larger) == 128 and know.death_cap(smaller) is None
    # another memory flag, or a chunk size SGLang picks: nothing known
    tp2 = {**larger, "tensor-parallel-size": 2}
    assert precheck(tp2, hw, know, concurrency=200).feasible and know.death_cap(tp2) is None
    auto = {"model-path": "m", "mem-fraction-static": 0.95}
    assert know.death_cap(auto) is None
    assert precheck({**BASE, "mem-fraction-static": 0.93}, hw, know).feasible
    # the inner search stays below the concurrency that killed a server like it
    assert know.death_cap({**BASE, "mem-fraction-static": 0.95}) == 128
    assert know.death_cap({**BASE, "mem-fraction-static": 0.85}) is None


def test_not_enough_memory_rejects_that_mfs_and_lower() -> None:
    know = Knowledge().with_floor({**BASE, "mem-fraction-static": 0.60}, 3)
    hw = Hardware()
    low = precheck({**BASE, "mem-fraction-static": 0.55}, hw, know)
    assert not low.feasible and low.kind == "not_enough_memory" and "trial 3" in low.reason
    assert not precheck({**BASE, "mem-fraction-static": 0.60}, hw, know).feasible
    assert precheck({**BASE, "mem-fraction-static": 0.65}, hw, know).feasible
    assert precheck({"model-path": "m", "mem-fraction-static": 0.55}, hw, know).feasible


def _runner(profile: str, space: dict, workload: dict, slo: dict) -> TrialRunner:
    data = study_dict(
        study=f"learn-{profile}",
        target={"launch": ["{python}", "-m", "tuner.sim", "--sim-profile", profile]},
        space=space,
        workload={"duration_s": 3, "warmup_requests": 1, **workload},
        objective__slo=slo,
    )
    return virtual_runner(parse_study(data, "l.yaml"), noise=False)


def test_a_runner_learns_a_floor_from_a_start_without_memory(tmp_path: Path) -> None:
    # Qwen-7B on a 24 GB card: the weights leave no KV pool at a low mfs
    r = _runner(
        "qwen2.5-7b-l4",
        {"mem-fraction-static": {"low": 0.3, "high": 0.95, "step": 0.05}},
        {"input_len": 128, "output_len": 16},
        {"p99_ttft_ms": 2000},
    )
    r.knowledge = Knowledge()  # no calibration: only the failure can teach the floor
    r.hardware = Hardware()
    out = r.run(0, {"mem-fraction-static": 0.4}, tmp_path / "0")
    assert out.status == Status.START_FAILED and out.failure == "not_enough_memory"
    again = r.run(1, {"mem-fraction-static": 0.35}, tmp_path / "1")
    assert again.status == Status.REJECTED and "trial 0" in again.reason
    assert again.failure == "not_enough_memory" and not again.launched


def test_a_runner_learns_a_death_under_load(tmp_path: Path) -> None:
    # the demo's H100 above ~0.95 mfs: a large prefill runs out of memory under load
    space = {
        "mem-fraction-static": {"low": 0.80, "high": 0.98, "step": 0.01},
        "concurrency": {"low": 8, "high": 256, "log": True, "search": "joint"},
    }
    r = _runner(
        "llama-3.1-8b-h100",
        space,
        {"input_len": 1024, "output_len": 128, "range_ratio": 0.5},
        {"p99_ttft_ms": 2900},
    )
    died = None
    for i, mfs in enumerate((0.95, 0.96, 0.97)):
        out = r.run(i, {"mem-fraction-static": mfs, "concurrency": 128}, tmp_path / str(i))
        if out.status == Status.DIED:
            died = (i, mfs)
            break
    assert died is not None, "no death under load at the top of the demo's mfs range"
    n, mfs = died
    assert r.knowledge.deaths and r.knowledge.deaths[0][1:] == (mfs, 128, n)
    nxt = r.run(9, {"mem-fraction-static": mfs + 0.01, "concurrency": 160}, tmp_path / "9")
    assert nxt.status == Status.REJECTED and nxt.failure == "oom_runtime" and not nxt.launched


HOST = (
    "ValueError: Not enough host memory available. Requesting 54.00 GB but only have 35.26 GB free."
)


def test_a_hicache_pool_the_host_could_not_pin_rejects_that_size_and_more() -> None:
    from tuner.trial.learning import learned_failure

    tp8 = {"model-path": "m", "tensor-parallel-size": 8, "mem-fraction-static": 0.9}
    know = learned_failure(Knowledge(), "host_memory", {**tp8, "hicache-size": 54}, 9, HOST)
    hw = Hardware()
    v = precheck({**tp8, "hicache-size": 60, "mem-fraction-static": 0.8}, hw, know)
    assert not v.feasible and v.kind == "host_memory" and "(trial 9" in v.reason
    assert not precheck({**tp8, "hicache-size": 54}, hw, know).feasible  # any mfs: host RAM
    assert precheck({**tp8, "hicache-size": 48}, hw, know).feasible
    assert precheck({**tp8, "hicache-size": 0}, hw, know).feasible  # HiCache off
    tp4 = {**tp8, "tensor-parallel-size": 4, "hicache-size": 54}  # fewer ranks: half the RAM
    assert precheck(tp4, hw, know).feasible
    # a host pool not larger than the device pool is cured by a larger size: nothing learned
    small = "AssertionError: The host memory should be larger than the device memory"
    flags = {**tp8, "hicache-size": 6}
    assert learned_failure(Knowledge(), "host_memory", flags, 3, small) == Knowledge()
