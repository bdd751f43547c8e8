"""How sharp a latency limit's edge is for one server, in virtual time (not CI).

Run: `python tests/bench/bench_edge.py --case seventy --server '{"mem-fraction-static": 0.81,
"chunked-prefill-size": 16384}' --concurrency 56,58,60,62,64,66 --sets 8`

For each concurrency: `--sets` disjoint sets of 5 fresh noisy starts (bench_search's robust
score, seeds no study or score uses), how many sets hold every SLO pooled over their requests,
the mean throughput over all starts, and the range of each set's pooled p99s. It shows where the
feasible best of a server lies and how often a configuration at the edge passes the next 5
starts: what the inner search's SLO margin trades against.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: the helpers import as tests.*
    sys.path.insert(0, str(REPO))

from tests.bench.bench_search import CASES, requests_of, study_cfg  # noqa: E402
from tests.bench.search_robust import ROBUST_RUNS, one_run  # noqa: E402
from tuner.outcome import objective_values  # noqa: E402
from tuner.verdict.tails import SLO_KEYS, pooled_verdict, tails_of  # noqa: E402

pytestmark = pytest.mark.bench

#: the first seed of the sets (bench_search uses 0..99 for studies, 10,000+ and 20,000+ to score)
EDGE_SEED0 = 40_000


def edge_row(case: str, params: dict, sets: int) -> dict:
    """One concurrency's sets: passes, mean throughput, each pooled p99's (min, max) over sets."""
    cfg, reqs = study_cfg(case), requests_of(case)
    n = ROBUST_RUNS[0]
    values, passed, p99s = [], 0, {}
    for s in range(sets):
        tails, died = [], False
        for i in range(n):
            got = one_run(cfg, reqs, params, EDGE_SEED0 + n * s + i, noise=True)
            if got is None:
                died = True
                break
            result, metrics = got
            values.append(objective_values(cfg.objective, metrics)[0])
            tails.append(tails_of(result.records, cfg.objective.slo))
        if died:
            continue
        pooled, missed = pooled_verdict(tails)
        passed += not missed
        for key in SLO_KEYS.values():
            if key in pooled and key in (tails[0].get("limits") or {}):
                p99s.setdefault(key, []).append(pooled[key])
    return {
        "passed": passed,
        "mean": statistics.mean(values) if values else 0.0,
        "p99": {k: (min(v), max(v)) for k, v in p99s.items()},
    }


def table(case: str, server: dict, concurrencies: Sequence[int], sets: int) -> str:
    cfg = study_cfg(case)
    limits = {k: v for k, v in cfg.objective.slo.model_dump().items() if v is not None}
    lines = [
        f"== {CASES[case].title}: {server}, {sets} sets of {ROBUST_RUNS[0]} fresh starts; "
        f"limits {limits}",
        f"{'conc':>5} {'sets held':>9} {'mean':>8}  pooled p99 per set (min-max)",
    ]
    for c in concurrencies:
        row = edge_row(case, {**server, "concurrency": c}, sets)
        p99 = ", ".join(f"{k} {lo:,.1f}-{hi:,.1f}" for k, (lo, hi) in row["p99"].items())
        lines.append(f"{c:>5} {row['passed']:>5}/{sets:<3} {row['mean']:>8,.0f}  {p99}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="seventy", help=f"one of {', '.join(CASES)}")
    p.add_argument("--server", required=True, help="the server flags as JSON")
    p.add_argument("--concurrency", required=True, help="comma-separated concurrencies")
    p.add_argument("--sets", type=int, default=8, help="disjoint sets of fresh starts")
    a = p.parse_args(argv)
    server = json.loads(a.server)
    print(table(a.case, server, [int(x) for x in a.concurrency.split(",")], a.sets))


def test_bench_edge() -> None:
    """Llama-70B: far below the TPOT limit every set holds, far above none does."""
    server = {"mem-fraction-static": 0.81, "chunked-prefill-size": 16384}
    low, high = (edge_row("seventy", {**server, "concurrency": c}, 2) for c in (40, 80))
    assert low["passed"] == 2 and high["passed"] == 0 and high["mean"] > low["mean"]


if __name__ == "__main__":
    main()
