"""The live display of `tuner tune`: SGLang's start-up milestones, the watch's counts, best and
ETA, the rich panel (rendered to a recording console) and the plain lines; the start-up log
follower on a real file through LocalHost."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial
from rich.console import Console

from tests.helpers.studies import REPO
from tuner.config.load import load_study
from tuner.hosts.local import LocalHost
from tuner.loadgen.result import LoadProgress
from tuner.outcome import Attr
from tuner.server.startlog import StartupLog
from tuner.sglang.milestones import Milestone, milestones
from tuner.sim import loglines
from tuner.watch.events import PhaseChanged, RunStarted, TrialStarted
from tuner.watch.live import PlainLines, render
from tuner.watch.state import StudyWatch

#: a real SGLang start-up, as its log shows it (TP 2: every rank writes the same lines)
SGLANG_LOG = """\
[2026-01-02 03:04:05 TP0] Load weight begin. avail mem=78.45 GB
[2026-01-02 03:04:05 TP1] Load weight begin. avail mem=78.45 GB
[2026-01-02 03:04:35 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.42 GB, mem usage=15.04 GB.
[2026-01-02 03:04:36 TP0] KV Cache is allocated. #tokens: 452310, K size: 27.61 GB, V size: 27.61 GB
[2026-01-02 03:04:36 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=7.52 GB
[2026-01-02 03:04:49 TP0] Capture cuda graph end. Time elapsed: 12.31 s. mem usage=0.84 GB. avail mem=6.68 GB.
[2026-01-02 03:04:49 TP0] max_total_num_tokens=452310, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=131072, available_gpu_mem=6.68 GB
[2026-01-02 03:04:52] The server is fired up and ready to roll!
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def cfg():
    return load_study(REPO / "search_spaces" / "demo-sim.yaml")


def finished(
    number: int, value: float, status: str, feasible: bool, **attrs
) -> optuna.trial.FrozenTrial:
    t = create_trial(
        value=value,
        params={"mem-fraction-static": 0.85},
        distributions={"mem-fraction-static": FloatDistribution(0.8, 0.98)},
        user_attrs={Attr.STATUS: status, **attrs},
        constraints={"c_start": -1.0 if feasible else 1.0},
    )
    t.number = number
    return t


def test_milestones_are_sglang_lines_with_units_once_per_kind() -> None:
    found = milestones(SGLANG_LOG.splitlines())
    first = {}
    for m in found:
        first.setdefault(m.key, m.text)
    assert first == {
        "weights_begin": "loading weights",
        "weights": "weights loaded: 15.04 GB",
        "kv_cache": "KV cache allocated: 452,310 tokens (55.22 GB)",
        "graphs_begin": "capturing CUDA graphs",
        "graphs": "CUDA graphs captured in 12.31 s",
        "scheduler": "scheduler: 4,096 requests max running, 6.68 GB GPU memory free",
        "ready": "ready to roll",
    }
    # nothing but those numbers leaves a line (SGLang logs its server_args, keys included)
    assert milestones(["server_args=ServerArgs(api_key='sk-secret-1234', ...)"]) == []


def test_the_watch_counts_ranks_and_estimates() -> None:
    clock = Clock()
    w = StudyWatch(clock)
    w.take(RunStarted("s", 5, 600.0, "window_output_throughput", 2))
    w.take(TrialStarted(0, {"mem-fraction-static": 0.98}))
    clock.t += 10
    w.finished(finished(0, 0.0, "start_failed", False, failure="oom_cuda_graph"))
    w.take(TrialStarted(1, {"mem-fraction-static": 0.85}))
    w.take(PhaseChanged(1, "load"))
    clock.t += 4
    w.take(LoadProgress(4.0, 6.0, 40, 500, 8000, running=64, queued=12))
    v = w.snapshot()
    assert (v.index, v.counts.infeasible, v.counts.reasons) == (2, 1, (("oom_cuda_graph", 1),))
    assert v.best is None and v.phase == "load" and v.phase_s == 4.0 and v.load.tok_s == 2000.0
    clock.t += 6
    w.finished(finished(1, 2500.0, "ok", True, restarted=True))
    w.finished(finished(2, 2600.0, "ok", True))  # measured on the same server: a reuse
    w.finished(finished(3, 0.0, "rejected", False))
    v = w.snapshot()
    assert v.best.number == 2 and v.best.value == 2600.0
    assert (v.counts.complete, v.counts.feasible, v.counts.rejected, v.counts.server_reuses) == (
        4,
        2,
        1,
        1,
    )
    # 20 s for 4 trials: 1 trial and 2 confirmation runs left at 5 s each
    assert v.eta_s == 15.0 and v.index == 5


def test_the_panel_shows_trial_i_of_n_best_and_phase() -> None:
    clock = Clock()
    w = StudyWatch(clock)
    w.take(RunStarted("demo", 10, 600.0, "window_output_throughput", 0))
    for i in range(3):
        w.take(TrialStarted(i, {}))
        clock.t += 20
        w.finished(finished(i, 2000.0 + i, "ok", True, restarted=True))
    w.take(TrialStarted(3, {"mem-fraction-static": 0.91, "concurrency": 90}))
    w.take(PhaseChanged(3, "spawn"))
    w.take(Milestone("kv_cache", "KV cache allocated: 452,310 tokens (55.22 GB)"))
    clock.t += 7
    console = Console(record=True, force_terminal=True, width=100)
    console.print(render(w.snapshot()))
    text = console.export_text()
    assert "trial 4/10" in text and "1m 07s elapsed of a 10m 00s budget" in text
    assert "best   2,002.0 tok/s window_output_throughput at trial #2" in text
    assert "starting 7.0 s" in text and "452,310 tokens" in text
    assert "mem-fraction-static=0.91 concurrency=90" in text
    w.take(PhaseChanged(3, "load"))
    w.take(LoadProgress(2.0, 6.0, 10, 500, 3000, running=None, queued=None))
    console = Console(record=True, force_terminal=True, width=100)
    console.print(render(w.snapshot()))
    text = console.export_text()
    assert "load run" in text and "1,500.0 tok/s" in text and "━" in text  # the bar
    assert "running" not in text  # no /metrics, no gauges


def test_plain_lines_are_stamped_with_units_and_no_trailing_space() -> None:
    lines: list[str] = []
    clock = Clock()
    p = PlainLines(cfg(), lines.append, clock)
    p.progress(RunStarted("demo", 3, None, "window_output_throughput", 0))
    p.progress(TrialStarted(0, {"mem-fraction-static": 0.85, "concurrency": 64}))
    p.progress(PhaseChanged(0, "restart"))
    clock.t += 1.5
    p.progress(PhaseChanged(0, "spawn"))
    p.progress(Milestone("weights", "weights loaded: 15.04 GB"))
    p.progress(PhaseChanged(0, "load"))
    p.progress(LoadProgress(1.0, 6.0, 3, 500, 900, running=64, queued=3))
    p.progress(LoadProgress(2.0, 6.0, 6, 500, 1800, running=64, queued=3))  # under 5 s: quiet
    p.message("a message\nover two lines ")
    text = "\n".join(lines)
    assert re.search(r"trial #0 phase starting \(stopping took 1\.5 s\)", text)
    assert (
        "trial #0 load 1.0 s of 6.0 s, 3 requests done, 900.0 tok/s, 64 running, 3 queued" in text
    )
    assert text.count(" requests done") == 1 and "over two lines" in text
    for line in lines:
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d \S", line) and line == line.rstrip()


def test_startup_log_reads_only_new_bytes_and_reports_each_milestone_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    lines = SGLANG_LOG.splitlines(keepends=True)

    class Server:
        pgid, log_path = 4242, str(log)

    seen: list[str] = []
    follow = StartupLog(Server(), LocalHost(), lambda m: seen.append(m.key), min_interval_s=0)
    follow()  # no log yet
    log.write_text("".join(lines[:3]) + lines[3][:30])  # a line cut mid-write waits
    follow()
    assert seen == ["weights_begin", "weights"]
    with log.open("a") as f:
        f.write(lines[3][30:] + "".join(lines[4:]))
    follow()
    assert seen == [
        "weights_begin",
        "weights",
        "kv_cache",
        "graphs_begin",
        "graphs",
        "scheduler",
        "ready",
    ]
    Server.pgid = 4343  # a new start reuses the name: its own milestones
    log.write_text(lines[2])
    follow()
    assert seen[-1] == "weights"


def test_the_last_read_of_a_start_ignores_the_interval(tmp_path: Path) -> None:
    """A start quicker than the interval (the simulator: under 1 s) still reports its milestones:
    the lifecycle's read when the start ends is not throttled."""
    log = tmp_path / "server.log"

    class Server:
        pgid, log_path = 4242, str(log)

    clock, seen = Clock(), []
    follow = StartupLog(Server(), LocalHost(), lambda m: seen.append(m.key), clock=clock)
    follow()  # the first poll: the log is still empty
    log.write_text(SGLANG_LOG)
    clock.t += 0.3
    follow()  # within the interval: not read
    assert seen == []
    follow(last=True)
    assert seen[0] == "weights_begin" and seen[-1] == "ready"


@pytest.mark.parametrize("version", ["0.5.6.post2", "0.5.23"])
def test_milestones_read_each_played_versions_lines(version: str) -> None:
    # the simulator writes each version's own templates (0.5.23 changed three of them)
    lines = [
        loglines.load_weight_end(version, 30.1, "LlamaForCausalLM", "torch.bfloat16", 63.42, 15.04),
        loglines.kv_allocated(version, "torch.bfloat16", 452310, False, 55.22),
        loglines.graph_begin(version, 7.52),
        loglines.graph_end(version, 256, 12.31, 0.9, 6.62),
    ]
    assert [(m.key, m.text) for m in milestones(lines)] == [
        ("weights", "weights loaded: 15.04 GB"),
        ("kv_cache", "KV cache allocated: 452,310 tokens (55.22 GB)"),
        ("graphs_begin", "capturing CUDA graphs"),
        ("graphs", "CUDA graphs captured in 12.31 s"),
    ]
