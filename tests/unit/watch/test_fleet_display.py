"""A fleet's events from its workers' pipes (watch/pipe.py) and its one display (watch/fleet.py):
plain lines name their worker, every worker's watch counts the whole study, the live panel has
a row per worker."""

from __future__ import annotations

import io

from rich.console import Console

from tests.unit.watch.test_live import Clock, cfg, finished
from tuner.loadgen.result import LoadProgress
from tuner.outcome import Status
from tuner.sglang.milestones import Milestone
from tuner.watch.events import PhaseChanged, RunStarted, TrialStarted
from tuner.watch.fleet import FleetLive, FleetPlain, render_fleet
from tuner.watch.pipe import EventPipe, decode


def test_a_workers_events_cross_the_pipe_as_they_were() -> None:
    out = io.StringIO()
    pipe = EventPipe(out)
    events = [
        RunStarted("s", 10, 3600.0, "output_throughput", 2, trials=(finished(0, 1.0, "ok", True),)),
        TrialStarted(3, {"mem-fraction-static": 0.85, "concurrency": 32}),
        PhaseChanged(3, "load"),
        Milestone("ready", "ready to roll"),
        LoadProgress(1.0, 6.0, 40, 100, 2345, running=12.0, queued=None),
    ]
    for e in events:
        pipe.progress(e)
    pipe.trial(finished(7, 1.0, "ok", True))
    pipe.message("this run: 2 launched")
    got = [decode(line) for line in out.getvalue().splitlines()]
    run = RunStarted("s", 10, 3600.0, "output_throughput", 2)  # trials: read from the study
    assert got == [
        ("progress", run),
        *(("progress", e) for e in events[1:]),
        ("trial", 7),
        ("message", "this run: 2 launched"),
    ]
    for stray in ("Traceback (most recent call last):", "[1, 2]", '{"progress": "Nope"}'):
        assert decode(stray) is None


def test_plain_lines_name_their_worker_and_count_the_whole_study() -> None:
    lines: list[str] = []
    clock = Clock()
    d = FleetPlain(cfg(), ["gpu-a", "gpu-b"], lines.append, clock)
    for w in ("gpu-a", "gpu-b"):
        d.progress(w, RunStarted("s", 4, None, "output_throughput", 0))
    d.progress("gpu-a", TrialStarted(1, {"concurrency": 8}))
    d.progress("gpu-b", TrialStarted(2, {"concurrency": 16}))
    d.trial("gpu-a", finished(1, 100.0, Status.OK, True))
    d.progress("gpu-a", TrialStarted(3, {"concurrency": 24}))
    d.trial("gpu-b", finished(2, 50.0, Status.OK, True))
    d.message(None, "worker gpu-a: ended (exit 0)")
    texts = [ln.split(" ", 1)[1] for ln in lines]  # after the timestamp
    assert "gpu-a: trial #1 started (1/4 trials): concurrency=8" in texts
    assert "gpu-b: trial #2 started (1/4 trials): concurrency=16" in texts
    assert "gpu-a: trial #3 started (2/4 trials): concurrency=24" in texts  # b's trial ran on
    # gpu-b's progress counts gpu-a's trial too, and the best is the study's
    progress_b = next(t for t in texts if t.startswith("gpu-b: progress"))
    assert progress_b.startswith("gpu-b: progress 2/4 trials: 2 complete: 2 feasible")
    assert "best 100.0 tok/s output_throughput at trial #1" in progress_b
    assert texts[-1] == "fleet: worker gpu-a: ended (exit 0)"


def test_the_live_panel_has_a_row_per_worker() -> None:
    console = Console(file=io.StringIO(), width=160, force_terminal=True)
    clock = Clock()
    d = FleetLive(cfg(), ["gpu-a", "gpu-b"], console, clock)
    for w in ("gpu-a", "gpu-b"):
        d.progress(w, RunStarted("s", 4, None, "output_throughput", 0))
    d.progress("gpu-a", TrialStarted(1, {"concurrency": 8}))
    d.progress("gpu-a", PhaseChanged(1, "load"))
    d.progress("gpu-a", LoadProgress(1.0, 6.0, 40, 100, 2345))
    d.trial("gpu-b", finished(2, 50.0, Status.OK, True))
    d.ended("gpu-b", "stopped (exit 1): tuner: stopped: the host is down")
    views = {w: s.snapshot() for w, s in d.watches.items()}
    record = Console(file=io.StringIO(), width=160, record=True)
    record.print(render_fleet(views, d.endings))
    text = record.export_text()
    assert "tuner tune s (fleet)" in text
    assert "50.0 tok/s output_throughput at trial #2" in text  # the study's best
    row_a = next(ln for ln in text.splitlines() if "gpu-a" in ln)
    assert "trial #1: concurrency=8" in row_a and "load run" in row_a and "40 requests" in row_a
    row_b = next(ln for ln in text.splitlines() if "gpu-b" in ln)
    assert "stopped (exit 1): tuner: stopped: the host is down" in row_b
    printed = console.file.getvalue()
    assert "gpu-b: trial #2 ok" in printed


def test_a_worker_that_begins_late_counts_each_trial_once() -> None:
    lines: list[str] = []
    d = FleetPlain(cfg(), ["gpu-a", "gpu-b"], lines.append, Clock())
    d.progress("gpu-a", RunStarted("s", 4, None, "output_throughput", 0))
    early = finished(1, 100.0, Status.OK, True)
    d.trial("gpu-a", early)  # before gpu-b's RunStarted, which the fleet reads from the study
    d.progress("gpu-b", RunStarted("s", 4, None, "output_throughput", 0, trials=(early,)))
    assert d.lines["gpu-b"].watch.snapshot().counts.complete == 1
    assert lines[-1].endswith("gpu-b: study s: 1/4 trials complete")
