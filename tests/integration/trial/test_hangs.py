"""Nothing waits forever: a real simulator that stops answering (SIGSTOP of its process group).

The load client alone, then the trial runner with the real lifecycle on this machine: a server
frozen mid-load is recognised as hung (the world's failure, never a measured 0) and stopped; a
reused server frozen between trials is found before its load run and replaced. Every group a
test froze is SIGCONT'ed and SIGKILLed in `finally`, by its own id only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers.simproc import SimProc
from tests.helpers.studies import study_file
from tuner.api import Seams, build_seams
from tuner.config.load import load_study
from tuner.config.schema import StudyConfig
from tuner.config.workload import WorkloadSection
from tuner.loadgen.bounds import Bounds
from tuner.loadgen.options import load_options
from tuner.loadgen.result import LoadProgress
from tuner.loadgen.run import run_load_sync
from tuner.loadgen.workload import requests_for
from tuner.outcome import Status
from tuner.trial.runner import HUNG

pytestmark = pytest.mark.slow

MFS = 0.85


def _freeze(pgid: int) -> None:
    os.killpg(pgid, signal.SIGSTOP)


def _release(pgid: int | None) -> None:
    """SIGCONT then SIGKILL one group we froze (it may be gone already)."""
    if pgid is None:
        return
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _gone(pgid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _phase_times(trial_dir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (trial_dir / "phases.log").read_text().splitlines():
        t, phase = line.split()
        out.setdefault(phase, float(t))
    return out


def test_load_run_against_a_server_frozen_mid_load_returns_within_its_bound() -> None:
    w = WorkloadSection(input_len=256, output_len=32, duration_s=20, flush_cache=False)
    opts = replace(load_options(w, concurrency=8), metrics_interval_s=0.2)
    bound = Bounds.of(opts)
    proc = SimProc.start(["--sim-profile", "llama-3.1-8b-h100", "--enable-metrics"])
    frozen_at: list[float] = []

    def freeze_once_measured(p: LoadProgress) -> None:
        # frozen once the timed run has completed requests (told about once a second), not
        # after a fixed delay that a busy machine could spend before the warm-up ended
        if p.done > 0 and not frozen_at:
            proc.signal(signal.SIGSTOP)
            frozen_at.append(p.elapsed_s)

    try:
        proc.wait_ready()
        t0 = time.monotonic()
        res = run_load_sync(
            proc.url, requests_for(w, num_requests=400), opts, on_progress=freeze_once_measured
        )
        took = time.monotonic() - t0
    finally:
        _release(proc.popen.pid)
        proc.kill()
    print(
        f"\nsim frozen {frozen_at} s into the window: load run returned after {took:.1f} s "
        f"(window {opts.duration_s:g} s, stall {bound.stall_s:g} s, bound {bound.total_s:g} s)"
    )
    assert frozen_at, "no request completed in the window: the server was never frozen"
    assert res.stopped == "unresponsive" and res.silent_s >= bound.stall_s
    assert took < bound.total_s
    assert res.metrics().completed > 0  # it had measured before the freeze


@pytest.fixture
def study(tmp_path: Path) -> Iterator[tuple[StudyConfig, Seams]]:
    path = study_file(
        tmp_path,
        "hangs",
        target__timeouts={"ready_s": 30, "stop_s": 5, "http_s": 2, "poll_s": 0.2},
        workload={
            "kind": "random",
            "input_len": 256,
            "output_len": 200,
            "duration_s": 4,
            "warmup_requests": 1,
            "flush_cache": True,
        },
    )
    cfg = load_study(path)
    seams = build_seams(cfg, None)
    frozen: list[int] = []
    seams.frozen = frozen  # type: ignore[attr-defined]
    try:
        yield cfg, seams
    finally:
        for pgid in [*frozen, seams.server.pgid]:
            _release(pgid)
        seams.close()


def test_a_server_frozen_during_the_load_is_hung_the_worlds_and_stopped(
    study: tuple[StudyConfig, Seams], tmp_path: Path
) -> None:
    cfg, seams = study
    trial_dir = tmp_path / "trials" / "0"

    def freeze_mid_load() -> None:
        # the trial's own phases log says when the timed run began (after the warm-up, the
        # flush and its pause, however long a busy machine takes for them)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            log = trial_dir / "phases.log"
            if log.exists() and " load\n" in log.read_text():
                # requests in flight; the 4 s window leaves the 1 s of quiet it needs to call
                # the silence unresponsive (Bounds.quiet_s) with seconds to spare
                time.sleep(0.3)
                pgid = seams.server.pgid
                if pgid is not None:
                    seams.frozen.append(pgid)  # type: ignore[attr-defined]
                    _freeze(pgid)
                return
            time.sleep(0.05)

    freezer = threading.Thread(target=freeze_mid_load)
    freezer.start()
    t0 = time.monotonic()
    out = seams.runner.run(
        0, {"mem-fraction-static": MFS, "concurrency": 16}, trial_dir, deadline=t0 + 120
    )
    took = time.monotonic() - t0
    freezer.join()
    phases = _phase_times(trial_dir)
    load_s = phases["scoring"] - phases["warmup"]
    opts = load_options(cfg.workload, concurrency=16)
    bound = Bounds.of(opts).total_s
    print(
        f"\nfrozen mid-load: load run {load_s:.1f} s (bound {bound:g} s), whole trial "
        f"{took:.1f} s; outcome {out.status}/{out.failure}: {out.reason}"
    )
    assert seams.frozen, "the freezer never saw the load start"  # type: ignore[attr-defined]
    assert out.status == Status.WORLD and out.failure == HUNG
    assert out.values == (0.0,) and out.constraints["c_start"] > 0  # not a measurement
    assert load_s < bound
    assert seams.server.pgid is None and _gone(seams.frozen[0])  # type: ignore[attr-defined]
    assert list(phases)[-1] == "done"


def test_a_reused_server_frozen_between_trials_is_found_and_replaced(
    study: tuple[StudyConfig, Seams], tmp_path: Path
) -> None:
    cfg, seams = study
    runner = seams.runner
    first = runner.run(0, {"mem-fraction-static": MFS, "concurrency": 8}, tmp_path / "t0")
    assert first.status in (Status.OK, Status.SLO_MISSED), first.reason
    old = seams.server.pgid
    assert old is not None
    seams.frozen.append(old)  # type: ignore[attr-defined]
    _freeze(old)
    t0 = time.monotonic()
    second = runner.run(
        1, {"mem-fraction-static": MFS, "concurrency": 16}, tmp_path / "t1", deadline=t0 + 120
    )
    took = time.monotonic() - t0
    print(
        f"\nfrozen reused server: trial 1 took {took:.1f} s; {second.server_info.get('replaced')}"
    )
    assert second.restarted and second.server_info["replaced"].startswith(HUNG)
    assert second.status in (Status.OK, Status.SLO_MISSED), second.reason
    assert second.metrics["completed"] > 0
    assert seams.server.pgid not in (None, old) and _gone(old)
    assert runner.reuses == 0
    assert list(_phase_times(tmp_path / "t1"))[:3] == ["ready", "restart", "spawn"]
