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

import argparse
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: the helpers import as tests.*
    sys.path.insert(0, str(REPO))

from tests.bench import bench_gpuhours as g  # noqa: E402  (registers kimi-90)
from tests.bench import bench_search as bs  # noqa: E402
from tests.bench.bench_ttft_cut import GRID  # noqa: E402
from tuner.loadgen.result import LoadProgress  # noqa: E402
from tuner.search.cut import DRIFT, Cutter  # noqa: E402
from tuner.server.launch import build_launch  # noqa: E402
from tuner.sim.virtual.server import VirtualServer  # noqa: E402
from tuner.sim.virtual.study import VirtualLoad  # noqa: E402
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
    cfg = g.study_cfg(case, "curve", True)
    requests = bs.requests_of(case)
    window = cfg.workload.duration_s
    assert window, f"{case}: needs a window"
    tally = Tally(case)
    mfss, concurrencies = GRID[case]
    for mfs, c, seed in itertools.product(mfss, concurrencies, range(seeds)):
        server = VirtualServer(seed, noise=True)
        flags = {**cfg.server, "mem-fraction-static": mfs}
        if not server.restart(build_launch(cfg.target.launch, flags, cfg.target.port), "-").ok:
            continue
        rule = Cutter(None, window, c)
        seen: list[tuple[float, int, float, float]] = []  # (t, tokens, rate, projected)

        def listen(p: LoadProgress, rule: Cutter = rule, seen: list = seen) -> None:
            got = rule.project(p)
            if got is not None and rule.full is not None:
                since, base, _, _ = rule.full
                seen.append(
                    (
                        p.elapsed_s,
                        p.output_tokens,
                        (p.output_tokens - base) / (p.elapsed_s - since),
                        got[0],
                    )
                )

        result = VirtualLoad(server, cfg, requests)("virtual", {"concurrency": c}, cut=listen)
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


def bench(cases: Sequence[str], seeds: int) -> list[Tally]:
    out = []
    for case in cases:
        tally = replay(case, seeds)
        print(tally.line(), flush=True)
        out.append(tally)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(GRID), help=f"comma-separated: {','.join(GRID)}")
    p.add_argument("--seeds", type=int, default=2, help="noisy starts per (pool, concurrency)")
    a = p.parse_args(argv)
    bench(a.cases.split(","), a.seeds)


def test_bench_projection() -> None:
    """tight, 1 seed: the rest of a window never ran faster than the score cut allows."""
    (tally,) = bench(["tight"], 1)
    assert tally.runs > 0 and all(r <= 1 + DRIFT for r in tally.rest_first)


if __name__ == "__main__":
    main()
