"""What bench_search measures a pick by, and the pick a user is handed (not CI).

`robust`: a configuration as it would be shipped: `ROBUST_RUNS` fresh servers with the
simulator's noise (seeds no study uses), one load run each; its score is the mean of the runs'
measured scores when none died and the SLOs hold on all their requests pooled (tuner.verdict.tails),
else 0. A single noise-free run is one sample like any other: at an SLO's edge (Llama-70B at
concurrency 63: p99 TPOT passes in 3 of 6 noisy starts, fails noise-free) it calls a coin toss
a fact, and an optimum found that way is one no user could keep. The optimum is chosen on one
set of starts (ROBUST_SEED0) and valued, like every pick, on another (HELDOUT_SEED0): the best of
many configurations scored on the same starts is the one those starts favoured most (demo: 2,677
on its selection starts, 2,649 held out), a bar no pick scored on other starts could reach.

`confirmed_pick`: the default strategy's study stopped after its n-th restart, then resumed to
run the tuner's own confirmation (the case's confirm settings or tuner's defaults), and the
configuration `tuner export` would write.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tuner.api import Events, tune
from tuner.outcome import Attr, full_params, objective_values
from tuner.search.space import client_params, server_flags
from tuner.server.launch import build_launch
from tuner.server.target import Launch
from tuner.sim.virtual.server import VirtualServer
from tuner.sim.virtual.study import VirtualLoad, virtual_seams
from tuner.trial.runner import score_load
from tuner.verdict.tails import pooled_verdict, tails_of
from tuner.verdict.trials import all_confirmations
from tuner.verdict.winner import best_trial

#: fresh noisy starts per configuration, and the first of their seeds (studies use 0..99)
ROBUST_RUNS = [5]
#: disjoint sets of ROBUST_RUNS starts a score averages (`expected`): 1 is one pass/fail draw;
#: more value a configuration at an SLO's edge by how often it holds on the next starts
ROBUST_SETS = [1]
ROBUST_SEED0 = 10_000
#: the first seed of the held-out starts: the optimum is chosen on ROBUST_SEED0's starts and
#: valued, like every pick, on these (a maximum over many configurations each scored on one set
#: of starts is biased up by whichever was lucky on them: the optimizer's curse)
HELDOUT_SEED0 = 20_000
#: SQLite's fsync per commit dominates a virtual study on a disk; tmpfs when there is one
TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
#: the resumed (confirming) run draws its noise from the study's seed plus this
CONFIRM_SEED_OFFSET = 7_919


def one_run(cfg: Any, requests: list, params: dict[str, Any], seed: int, noise: bool):
    """(LoadResult, metrics) of one fresh server and one load run; None when it could not
    start or died under the load."""
    server = VirtualServer(seed, noise=noise)
    spec = build_launch(
        Launch.of(cfg.target).template, {**cfg.server, **server_flags(params)}, cfg.target.port
    )
    if not server.restart(spec, "").ok:
        return None
    result = VirtualLoad(server, cfg, requests)("virtual", client_params(params))
    if server.check() is not None:
        return None
    return result, score_load(result, cfg.objective.slo)


def robust(cfg: Any, requests: list, params: dict[str, Any], seed0: int = ROBUST_SEED0) -> float:
    """The mean measured score over ROBUST_RUNS noisy fresh starts (seeds from `seed0`); 0 when
    one could not start or died, or the SLOs miss on every request of the runs pooled."""
    values, tails = [], []
    for i in range(ROBUST_RUNS[0]):
        got = one_run(cfg, requests, params, seed0 + i, noise=True)
        if got is None:
            return 0.0
        result, metrics = got
        values.append(objective_values(cfg.objective, metrics)[0])
        tails.append(tails_of(result.records, cfg.objective.slo))
    _, missed = pooled_verdict(tails)
    return 0.0 if missed else statistics.mean(values)


def expected(cfg: Any, requests: list, params: dict[str, Any], seed0: int = ROBUST_SEED0) -> float:
    """The mean `robust` score over ROBUST_SETS disjoint sets of starts: what a configuration
    is worth on the next restart, a set that misses its SLOs counting 0 (a configuration that
    holds on 3 sets in 4 is worth 3/4 of its throughput, not all of it or nothing)."""
    n, k = ROBUST_RUNS[0], ROBUST_SETS[0]
    return statistics.mean(robust(cfg, requests, params, seed0 + n * s) for s in range(k))


class BudgetSpent(Exception):
    """The study spent the restarts it was given (raised from the per-trial hook to end tune)."""


def search(cfg: Any, requests: list, seed: int, restarts: int, runs_dir: Path) -> None:
    """The study in virtual time until its `restarts`-th restart; a small space runs out of new
    configurations (every proposal a duplicate), so at most 4x as many trials, after which
    `tune` confirms on its own (when the study file asks it to)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    spent = [0]

    def on_trial(t: Any) -> None:
        spent[0] += bool(t.user_attrs.get(Attr.LAUNCHED))
        if spent[0] >= restarts:
            raise BudgetSpent

    with contextlib.suppress(BudgetSpent):
        tune(
            cfg,
            runs_dir=runs_dir,
            seed=seed,
            n_trials=4 * restarts,
            events=Events(on_trial=on_trial),
            make_seams=virtual_seams(seed, requests=requests),
        )


def confirmed_pick(
    cfg: Any, requests: list, seed: int, restarts: int
) -> tuple[dict[str, Any] | None, int]:
    """Search until the `restarts`-th restart, then confirm as `tuner tune` does at its end ->
    (what the export writes, the confirmation's runs: each one a fresh restart)."""
    import optuna

    with tempfile.TemporaryDirectory(prefix="bench-confirm-", dir=TMP) as tmp:
        search(cfg, requests, seed, restarts, Path(tmp))
        # resumed: nothing left to run (one completed trial is enough), so it confirms
        tune(
            cfg,
            runs_dir=Path(tmp),
            seed=seed,
            n_trials=1,
            make_seams=virtual_seams(seed + CONFIRM_SEED_OFFSET, requests=requests),
        )
        url = f"sqlite:///{tmp}/{cfg.study}/study.db"
        study = optuna.load_study(study_name=cfg.study, storage=url)
        best, _ = best_trial(study)
        runs = sum(len(v) for v in all_confirmations(study).values())
        return (None if best is None else full_params(best.params, best.user_attrs)), runs
