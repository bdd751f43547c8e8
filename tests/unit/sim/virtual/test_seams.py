"""The simulator in virtual time as a study's seams: start-ups, deaths, load runs, noise, clock."""

from __future__ import annotations

import copy
import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.paths import REPO
from tests.helpers.virtual import virtual_runner
from tuner.api import study_requests
from tuner.capacity.precheck import Hardware
from tuner.config.load import parse_study
from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError, TrialTimeout
from tuner.outcome import Attr, Status
from tuner.search.ceiling import Reading
from tuner.search.cut import CUT_METRIC, cutter
from tuner.server.launch import build_launch
from tuner.server.records import GPU_TOTAL, GPU_USED
from tuner.sglang.failures import FailureClass
from tuner.sim.flags import parse_flags
from tuner.sim.profile import load_profile
from tuner.sim.startup import build_script
from tuner.sim.virtual.server import VirtualClock, VirtualServer
from tuner.sim.virtual.study import VirtualLoad, check_launch
from tuner.trial.runner import score_load

LAUNCH = ["{python}", "-m", "tuner.sim", "--sim-profile", "llama-3.1-8b-h100"]


def data(**workload: Any) -> dict[str, Any]:
    """The demo, made cheap: short prompts, a 2 s window, concurrency up to 64."""
    d = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    d["target"]["launch"] = LAUNCH
    d["space"]["concurrency"] = {"low": 4, "high": 64, "log": True}
    d["baseline"]["concurrency"] = 16
    d["workload"].update({"input_len": 256, "output_len": 32, "duration_s": 2, **workload})
    d["objective"]["slo"]["p99_ttft_ms"] = 1500
    return d


@functools.cache
def cfg_of(yaml_text: str) -> StudyConfig:
    return parse_study(yaml.safe_load(yaml_text), "v.yaml")


def cfg(**workload: Any) -> StudyConfig:
    return cfg_of(yaml.safe_dump(data(**workload)))


_REQUESTS: dict[int, list] = {}


def requests(c: StudyConfig) -> list:
    """The study's request list, built once per config (cfg_of caches the configs)."""
    if id(c) not in _REQUESTS:
        _REQUESTS[id(c)] = study_requests(c)
    return _REQUESTS[id(c)]


def start(server: VirtualServer, c: StudyConfig, **flags: Any):
    spec = build_launch(LAUNCH, {**c.server, **flags}, c.target.port)
    return server.restart(spec, "/tmp/unused.log")


def run(c: StudyConfig, seed: int = 1, noise: bool = True, cut: Any = None, **client: Any):
    server = VirtualServer(seed, noise=noise)
    assert start(server, c, **{"mem-fraction-static": 0.85}).ok
    return VirtualLoad(server, c, requests(c))("virtual", {"concurrency": 16, **client}, cut=cut)


@pytest.mark.parametrize(
    ("flags", "failure", "words"),
    [
        ({"mem-fraction-static": 0.98}, FailureClass.OOM_CUDA_GRAPH, "capture cuda graph failed"),
        (
            {"hicache-size": 400, "enable-hierarchical-cache": True},
            FailureClass.HOST_MEMORY,
            "host",
        ),
        ({"bogus-flag": 1}, FailureClass.BAD_FLAG, "unrecognized arguments"),
        (
            {"enable-hierarchical-cache": True, "disable-radix-cache": True},
            FailureClass.BAD_FLAG,
            "mutually exclusive",
        ),
    ],
)
def test_a_failed_start_carries_sglangs_message_and_class(flags, failure, words) -> None:
    server = VirtualServer()
    res = start(server, cfg(), **flags)
    assert not res.ok and res.failure == failure
    assert words in res.reason.lower() and res.evidence and res.exit_code in (1, 2, 137)
    assert server.process is None and not server.responsive(1.0)


def test_a_start_reports_what_get_server_info_says_and_takes_virtual_time() -> None:
    clock = VirtualClock()
    server = VirtualServer(clock=clock)
    res = start(server, cfg(), **{"mem-fraction-static": 0.85})
    ns = parse_flags(["--model-path", "m", "--mem-fraction-static", "0.85"])
    plan = build_script(ns, load_profile("llama-3.1-8b-h100")).plan
    assert res.ok and res.max_total_num_tokens == plan.max_total_num_tokens
    assert res.max_running_requests == plan.max_running_requests
    assert res.mem_fraction_static == 0.85
    assert res.version == "0.5.6.post2 (virtual time)"  # the identity check tells it from real
    assert res.timings.start_to_ready_s == clock.t == 1.5  # --sim-startup-seconds' default
    assert server.check() is None and server.responsive(1.0)


def test_a_prefill_oom_under_load_is_a_death_with_sglangs_message(tmp_path: Path) -> None:
    c = cfg(input_len=2048)
    server = VirtualServer()
    assert start(server, c, **{"mem-fraction-static": 0.96}).ok  # the band below the cliff
    result = VirtualLoad(server, c, requests(c))("virtual", {"concurrency": 64})
    death = server.check()
    assert death is not None and death.failure == FailureClass.OOM_RUNTIME
    assert "Prefill out of memory" in death.reason and death.exit_code == 137
    assert result.stopped == "error_budget" and not server.responsive(1.0)
    assert server.fetch_log(str(tmp_path / "server.log"))
    log = (tmp_path / "server.log").read_text().splitlines()
    assert "Received sigquit" in log[-1]
    # SGLang logs a prefill batch before it runs it: the fatal one is the last line before the
    # traceback, and it is the one past the profile's prefill OOM cliff
    crash = next(i for i, line in enumerate(log) if "Scheduler hit an exception" in line)
    assert "Prefill batch" in log[crash - 1], log[crash - 3 : crash + 1]
    fatal = int(log[crash - 1].split("#new-token: ")[1].split(",")[0])
    engine = server._srv.engine  # type: ignore[union-attr]
    assert fatal > engine._s.params.oom_prefill_tokens


def test_a_load_run_is_scored_as_the_http_path_scores_it() -> None:
    c = cfg()
    result = run(c)
    m = score_load(result, c.objective.slo)
    assert result.stopped == "duration" and result.duration_s == pytest.approx(2.0)
    assert m["completed"] > 50 and m["cancelled"] <= 16 and m["errors"] == 0
    assert 0 < m["p99_ttft_ms"] < 1500 and m["window_output_throughput"] > m["output_throughput"]
    assert result.server is not None and result.server.mean_running_reqs  # --enable-metrics
    starts = [r.start_s for r in result.records]
    assert starts == sorted(starts) and all(0 <= s < 2.0 for s in starts)
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in result.records if r.ok)


def test_noise_is_seeded_per_start_and_can_be_turned_off() -> None:
    c = cfg()

    def value(seed: int, noise: bool = True) -> float:
        return score_load(run(c, seed, noise), c.objective.slo)["window_output_throughput"]

    assert value(3) == value(3)
    assert len({value(s) for s in range(4)}) > 1
    assert value(3, noise=False) == value(4, noise=False)


def test_a_count_bounded_run_ends_done_and_a_poisson_run_follows_its_rate() -> None:
    done = run(cfg(num_requests=40, duration_s=None))
    assert done.stopped == "done" and len(done.records) == 40
    poisson = run(cfg(duration_s=10), **{"request-rate": 5.0})
    starts = sorted(r.start_s for r in poisson.records)
    assert 30 <= len(starts) <= 75  # ~50 arrivals in 10 s
    assert max(b - a for a, b in itertools.pairwise(starts)) > 0.2  # not a closed loop


def test_a_follow_up_turn_starts_after_its_previous_turn_ended() -> None:
    c = cfg(kind="multi-turn", turns=3, question_len=16, num_requests=30, duration_s=20)
    result = run(c)
    assert result.stopped == "done" and len(result.records) == 30
    ended: dict[tuple[int | None, int], float] = {}
    for r in result.records:
        ended[(r.conversation, r.turn)] = r.start_s + r.latency_s
    follow = [r for r in result.records if r.turn > 0]
    assert follow
    for r in follow:
        assert r.start_s >= ended[(r.conversation, r.turn - 1)] - 1e-9


def test_a_cut_rule_ends_a_virtual_run_as_loadgen_ends_one() -> None:
    """The rule hears the run about once a virtual second with what a client counts; its
    reason stops the run as cut, requests in flight recorded as cut with what they had."""
    c = cfg(duration_s=20)
    heard: list = []

    def rule(p):
        heard.append(p)
        return "enough" if p.elapsed_s >= 5.0 else None

    result = run(c, cut=rule)
    assert result.stopped == "cut" and result.cut_reason == "enough" and result.was_cut
    assert 5.0 <= result.duration_s < 6.5  # stopped at the tick that said so, not at 20 s
    assert all(b.elapsed_s - a.elapsed_s >= 0.99 for a, b in itertools.pairwise(heard))
    last = heard[-1]
    assert last.window_s == 20 and last.streaming > 0 and last.done > 0
    # every request started: a TTFT, or the wait so far (16 in flight, none failed)
    assert len(last.first_waits) == last.done + 16 and min(last.first_waits) > 0
    # the tokens it was told are what the records hold when it stopped (none came after)
    assert sum(r.output_len for r in result.records) == last.output_tokens
    assert sum(r.cancelled for r in result.records) == last.streaming
    assert score_load(result, c.objective.slo)["stopped"] == "cut"


def test_the_trials_time_left_bounds_a_virtual_load_run() -> None:
    c = cfg()
    server = VirtualServer()
    assert start(server, c, **{"mem-fraction-static": 0.85}).ok
    with pytest.raises(TrialTimeout):
        VirtualLoad(server, c, requests(c))("virtual", {"concurrency": 8}, time_limit_s=1.0)


def test_a_runner_on_virtual_seams_reuses_the_server_and_learns_the_cliff(tmp_path: Path) -> None:
    c = cfg()
    runner = virtual_runner(c, hardware=Hardware(gpu_mem_mib=81559), requests=requests(c))
    server, clock = runner.server, runner.server.clock
    first = runner.run(0, {"mem-fraction-static": 0.85, "concurrency": 8}, tmp_path / "0")
    again = runner.run(1, {"mem-fraction-static": 0.85, "concurrency": 16}, tmp_path / "1")
    cliff = runner.run(2, {"mem-fraction-static": 0.98, "concurrency": 8}, tmp_path / "2")
    above = runner.run(3, {"mem-fraction-static": 0.98, "concurrency": 16}, tmp_path / "3")
    assert first.status == again.status == Status.OK and server.starts == 2
    assert first.restarted and not again.restarted
    assert cliff.status == Status.START_FAILED and cliff.failure == FailureClass.OOM_CUDA_GRAPH
    assert above.status == Status.REJECTED  # the pre-check learned the cliff: no restart
    assert clock.t > 4.0 and (tmp_path / "0" / "metrics.json").exists()


def test_virtual_needs_the_simulator_as_the_launch() -> None:
    d = copy.deepcopy(data())
    d["target"]["launch"] = ["python", "-m", "sglang.launch_server"]
    with pytest.raises(ConfigError, match=r"target\.launch: --virtual runs the simulator"):
        check_launch(parse_study(d, "v.yaml"))
    d["target"]["launch"] = ["{python}", "-m", "tuner.sim", "--sim-profile", "no-such-profile"]
    with pytest.raises(ConfigError, match="no-such-profile"):
        check_launch(parse_study(d, "v.yaml"))


def test_a_queue_past_the_pool_is_cut_for_its_ttft_long_before_its_window() -> None:
    """2,048-token prompts on a pool of mfs 0.5: 64 and 256 streams queue past the 1.5 s TTFT
    limit. Run out, their p99 misses it; with the cut rule (no score to beat, as on a study's
    first server) they stop within a third of the 30 s window, before any batch turned over.
    16 streams hold the limit and run the whole window."""
    c = cfg(duration_s=30, input_len=2048, output_len=512)
    limit = c.objective.slo.p99_ttft_ms
    assert limit is not None

    def go(streams: int, cut: bool) -> Any:
        server = VirtualServer(1, noise=True)
        assert start(server, c, **{"mem-fraction-static": 0.5}).ok
        rule = cutter(CUT_METRIC, 30, streams, None, limit) if cut else None
        load = VirtualLoad(server, c, requests(c))
        return load("virtual", {"concurrency": streams}, cut=rule and rule.cut)

    for streams in (64, 256):
        assert score_load(go(streams, False), c.objective.slo)["p99_ttft_ms"] > limit
        cut = go(streams, True)
        assert cut.stopped == "cut" and "p99 TTFT limit" in (cut.cut_reason or "")
        assert cut.duration_s < 10
    held = go(16, True)
    assert held.stopped == "duration" and held.duration_s == pytest.approx(30, abs=1)
    assert score_load(held, c.objective.slo)["p99_ttft_ms"] <= limit


def test_the_gpu_memory_a_run_leaves_predicts_where_the_memory_plan_dies() -> None:
    """nvidia-smi's view of a virtual server: start-up's memory, then the largest prefill's
    activations on top (PyTorch keeps them reserved) until a flush. Read after a run at mfs
    0.85, the ceiling it predicts (search/ceiling.py) is the memory plan's own: the first mfs
    where a full prefill chunk no longer fits (Llama-8B on an H100: 0.95)."""
    c = cfg(input_len=2048)  # 16 prompts of ~2k tokens at once: full 8,192-token chunks
    server = VirtualServer(1)
    assert start(server, c, **{"mem-fraction-static": 0.85}).ok
    idle = server.gpu_memory()
    assert idle is not None and idle.total_mib == load_profile("llama-3.1-8b-h100").gpu_mem_mib
    VirtualLoad(server, c, requests(c))("virtual", {"concurrency": 16})
    after = server.gpu_memory()
    assert after is not None and after.used_mib > idle.used_mib
    grid = [round(0.85 + k / 100, 2) for k in range(14)]
    predicted = next(
        m for m in grid if Reading(0.85, after.used_mib, after.total_mib).free_at(m) < 0
    )

    def verdict(mfs: float) -> str:
        ns = parse_flags(["--model-path", "m", "--mem-fraction-static", str(mfs)])
        plan = build_script(ns, load_profile("llama-3.1-8b-h100")).plan
        return "none" if plan is None else plan.verdict

    assert verdict(round(predicted - 0.01, 2)) == "ok" and verdict(predicted) != "ok", predicted
    # a flush empties PyTorch's cache (SGLang's flush_cache): even the start-up warm-up's
    # activations are gone, only what start-up placed is left
    assert server.process is not None and server.process.engine.flush_cache()
    flushed = server.gpu_memory()
    assert flushed is not None and flushed.used_mib < idle.used_mib
    server.stop()
    assert server.gpu_memory() is None


def test_a_trial_records_the_most_gpu_memory_its_server_held_after_a_run_it_lived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cfg(input_len=2048)
    runner = virtual_runner(c, requests=requests(c))
    seen: list[float] = []
    real = VirtualServer.gpu_memory

    def spy(self: VirtualServer):
        got = real(self)
        if got is not None:
            seen.append(got.used_mib)
        return got

    monkeypatch.setattr(VirtualServer, "gpu_memory", spy)
    out = runner.run(0, {"mem-fraction-static": 0.85}, tmp_path / "0")  # the inner search
    assert out.status == Status.OK and len(out.points) >= 2 and len(seen) >= 2
    assert out.server_info[GPU_USED] == max(seen) and out.server_info[GPU_TOTAL] == 81559
    assert GPU_USED in out.to_attrs()[Attr.SERVER_INFO]  # where search/ceiling.py reads it
    # a run that killed its server reads nothing: its memory is gone with it
    seen.clear()
    died = runner.run(1, {"mem-fraction-static": 0.96, "concurrency": 64}, tmp_path / "1")
    assert died.status == Status.DIED and GPU_USED not in died.server_info and not seen
