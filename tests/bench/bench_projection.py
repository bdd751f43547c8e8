"""How well a load run's projection (search/cut.py `Cutter.project`) foretells its window (not CI).

Each run is a full window on the simulator's engine (noisy starts, bench_ttft_cut's grid of pools
and concurrencies per case), never stopped, with a `Cutter` listening once a second. At the
first moment the projection can be judged, and at every later one, it compares what the rest of
the window did with the rate seen so far. The constants of the score cut rest on these bounds:
the rest ran at most 1 + DRIFT times the rate seen (the optimistic projection never fell below
the final score), and the final score sat near the projection. The low side says what a rule
ending *gaining* runs early could count on.

Run: `python tests/bench/bench_projection.py` (five cases, about a minute) or `--cases kimi
--seeds 2`; `pytest -m bench tests/bench/bench_projection.py -s` runs the tight case.

Per case: how many runs could be judged at all, where in the window the first judgment came
(share of it), the rest's rate over the rate seen (min and max, at the first judgment and over
every judgment), and the final score over the first projection (min and max).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: the helpers import as tests.*
    sys.path.insert(0, str(REPO))

from tests.bench import bench_ttft_cut as cut  # noqa: E402  (its grid and replay loop)
from tuner.loadgen.result import LoadProgress  # noqa: E402
from tuner.search.cut import DRIFT, Cutter  # noqa: E402
from tuner.trial.runner import score_load  # noqa: E402

pytestmark = pytest.mark.bench


@dataclass
class Tally:
    case: str
    runs: int = 0
    first_at: list[float] = field(default_factory=list)  # share of the window
    rest_first: list[float] = field(default_factory=list)  # rest's rate / rate seen
    rest_all: list[float] = field(default_factory=list)
    final_over_projected: list[float] = field(default_factory=list)

    def line(self) -> str:
        def span(xs: list[float]) -> str:
            return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"

        return (
            f"{self.case}: {len(self.first_at)} of {self.runs} runs judged, first at "
            f"{span(self.first_at)} of the window; rest / rate seen: {span(self.rest_first)} at the "
            f"first judgment, {span(self.rest_all)} at any; final / projected: "
            f"{span(self.final_over_projected)}"
        )


def replay(case: str, seeds: int) -> Tally:
    tally = Tally(case)
    for cfg, load, _, c, _ in cut.started(case, seeds):
        window = cfg.workload.duration_s
        assert window, f"{case}: needs a window"
        rule = Cutter(None, window, c)
        seen: list[tuple[float, int, float, float]] = []  # (t, tokens, rate, projected)

        def listen(p: LoadProgress, rule: Cutter = rule, seen: list = seen) -> None:
            got = rule.project(p)
            if got is not None and rule.full is not None:
                since, base, _, _ = rule.full
                rate = (p.output_tokens - base) / (p.elapsed_s - since)
                seen.append((p.elapsed_s, p.output_tokens, rate, got[0]))

        result = load("virtual", {"concurrency": c}, cut=listen)
        final = score_load(result, cfg.objective.slo).get("window_output_throughput") or 0.0
        tally.runs += 1
        for i, (t, tokens, rate, projected) in enumerate(seen):
            rest = window - t
            if rest < 1 or rate <= 0:
                continue
            ratio = (final * window - tokens) / rest / rate
            tally.rest_all.append(ratio)
            if i == 0:
                tally.first_at.append(t / window)
                tally.rest_first.append(ratio)
                tally.final_over_projected.append(final / projected)
    return tally


def main(argv: Sequence[str] | None = None) -> None:
    cut.main(argv, replay, __doc__ or "", seeds=2)


def test_bench_projection() -> None:
    """tight, 1 seed: the rest of a window never ran faster than the score cut allows."""
    (tally,) = cut.bench(["tight"], 1, replay)
    assert tally.runs > 0 and all(r <= 1 + DRIFT for r in tally.rest_first)


if __name__ == "__main__":
    main()
