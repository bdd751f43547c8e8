"""Cut load runs in the inner search (trial/inner.py, search/cut.py): a cut run steers the
search and is never its result; a server that cannot beat the study's best is recorded as cut
with its projection, and its search stops once its peak is found."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.helpers.studies import study_dict
from tests.unit.search.test_cut import WINDOW, ticks
from tuner.config.load import parse_study
from tuner.config.schema import StudyConfig
from tuner.loadgen.result import LoadProgress
from tuner.outcome import Status, TrialOutcome, cut_outcome, measured_outcome
from tuner.search.inner import Bounds
from tuner.search.mode import NAME
from tuner.trial.inner import run_inner


def _cfg(early_stop: bool = True) -> StudyConfig:
    data = study_dict(
        study="cut",
        space={
            "mem-fraction-static": {"low": 0.8, "high": 0.95},
            "concurrency": {"low": 8, "high": 256, "search": "inner"},
        },
        workload__duration_s=WINDOW,
        budget__early_stop=early_stop,
    )
    return parse_study(data, "cut.yaml")


class Server:
    """One server's load runs: `curve(c)` tok/s over a window, a request's life 30 s. A run
    given a `cut` rule hears its progress each second and stops when the rule says so."""

    def __init__(self, cfg: StudyConfig, curve: Callable[[int], float]):
        self.cfg, self.curve = cfg, curve
        self.runs: list[tuple[int, float, bool]] = []  # (concurrency, seconds, given a rule)

    def measure(
        self,
        params: Mapping[str, Any],
        _dir: Path,
        cut: Callable[[LoadProgress], str | None] | None = None,
    ) -> TrialOutcome:
        c = int(params[NAME])
        rate = self.curve(c) * WINDOW / (WINDOW - 8.0)  # scores curve(c) over the window
        for p in ticks(rate, min(c, 64), 30.0):
            why = cut(p) if cut is not None else None
            if why is not None:
                self.runs.append((c, p.elapsed_s, True))
                metrics = {"window_output_throughput": p.output_tokens / p.elapsed_s}
                return cut_outcome(self.cfg.objective, metrics, why)
        self.runs.append((c, WINDOW, cut is not None))
        metrics = {"window_output_throughput": self.curve(c), "p99_ttft_ms": 100.0}
        return measured_outcome(self.cfg.objective, metrics, client_lagged=False)


def _search(cfg: StudyConfig, server: Server, beat: float | None, start: int = 32) -> TrialOutcome:
    b = Bounds(8, 256, start, max_runs=5)
    return run_inner(
        cfg, {}, Path("/nonexistent"), server.measure, b, lambda: None, lambda: 0.0, beat=beat
    )


def rising(top: float, knee: int) -> Callable[[int], float]:
    """Throughput that rises with concurrency up to `knee`, then flat at `top`."""
    return lambda c: top * min(c, knee) / knee


def test_a_server_that_cannot_beat_the_study_is_recorded_as_cut(tmp_path: Path) -> None:
    cfg = _cfg()
    server = Server(cfg, rising(600.0, 64))
    out = _search(cfg, server, beat=1000.0)
    assert out.status == Status.CUT
    assert all(r[1] < WINDOW for r in server.runs)  # no run spent its whole window
    assert len(server.runs) < 5  # its peak found (a run above it lost): the search stopped
    # its value is its best projection, labelled: never a measured score
    assert 540.0 < out.values[0] < 1000.0
    assert out.reason.startswith("projected") and "not a score" in out.reason
    assert all(p["cut"] and not p["clear"] and not p["feasible"] for p in out.points)
    assert out.client[NAME] == max(out.points, key=lambda p: p["value"])[NAME]


def test_a_server_that_beats_the_study_is_scored_by_a_full_window(tmp_path: Path) -> None:
    cfg = _cfg()
    server = Server(cfg, rising(1200.0, 64))
    out = _search(cfg, server, beat=1000.0, start=16)
    assert out.status == Status.OK
    assert out.values[0] >= 1000.0
    chosen = next(p for p in out.points if p[NAME] == out.client[NAME])
    assert not chosen["cut"] and chosen["clear"]
    full = {c for c, s, _ in server.runs if s == WINDOW}
    assert out.client[NAME] in full
    # the runs below the study's best were cut, each before its window's end
    assert any(p["cut"] for p in out.points)
    assert all(s < WINDOW for c, s, _ in server.runs if c not in full)


def test_the_first_server_of_a_study_runs_its_first_window_in_full(tmp_path: Path) -> None:
    cfg = _cfg()
    server = Server(cfg, rising(800.0, 64))
    out = _search(cfg, server, beat=None)
    assert server.runs[0][1] == WINDOW and not server.runs[0][2]  # nothing to beat yet
    assert out.status == Status.OK


def test_early_stop_off_gives_no_run_a_rule(tmp_path: Path) -> None:
    cfg = _cfg(early_stop=False)
    server = Server(cfg, rising(600.0, 64))
    out = _search(cfg, server, beat=1000.0)
    assert out.status == Status.OK and len(server.runs) == 5
    assert all(s == WINDOW and not given for _, s, given in server.runs)
