"""The mfs ceiling read from the GPU memory servers held under load (search/ceiling.py), and
the edge probe's jump to it."""

from __future__ import annotations

from typing import Any

import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, create_trial

from tests.unit.search.test_edge import DIST, flags_for
from tuner.outcome import Attr, Status
from tuner.search.ceiling import Reading, ceiling, reading_of
from tuner.search.edge import MFS, edge_probe, ladder
from tuner.server.records import GPU_TOTAL, GPU_USED

GPU = 100_000.0  # MiB: one hundredth of mfs is 1,000 MiB of pool
GRID = ladder(DIST)


def trial(
    mfs: float, status: Status, value: float = 0.0, used: float | None = None, **params: Any
) -> FrozenTrial:
    """A completed trial; `used`: the most GPU memory its server held after a load run."""
    ok = status == Status.OK
    info = {} if used is None else {GPU_USED: used, GPU_TOTAL: GPU}
    return create_trial(
        params={MFS: mfs, **params},
        distributions={MFS: DIST, **{k: CategoricalDistribution([v]) for k, v in params.items()}},
        values=[value if ok else 0.0],
        user_attrs={Attr.STATUS: status, Attr.SERVER_INFO: info},
        system_attrs={"constraints": [-1.0 if ok else 1.0]},
    )


def test_free_memory_falls_by_the_gpu_share_each_step_of_mfs_moves_into_the_pool() -> None:
    r = Reading(0.85, 94_000.0, GPU)
    assert r.free_at(0.85) == pytest.approx(6_000)
    assert r.free_at(0.90) == pytest.approx(1_000)
    assert r.free_at(0.91) == pytest.approx(0.0, abs=1e-6)
    assert r.free_at(0.92) == pytest.approx(-1_000)


def test_the_ceiling_is_the_first_grid_point_whose_load_would_not_fit() -> None:
    # 6,000 MiB free at 0.85: 0.91 leaves ~0 (fits), 0.92 would need 1,000 MiB more
    assert ceiling([trial(0.85, Status.OK, 700, used=94_000)], {}, GRID, flags_for) == 0.92
    # plenty free: every grid point fits
    assert ceiling([trial(0.85, Status.OK, 700, used=60_000)], {}, GRID, flags_for) is None
    # no reading (no nvidia-smi): nothing predicted
    assert ceiling([trial(0.85, Status.OK, 700)], {}, GRID, flags_for) is None


def test_the_largest_load_seen_decides_and_a_server_that_lived_beats_the_prediction() -> None:
    low = trial(0.85, Status.OK, 700, used=92_000)  # alone: up to 0.93
    high = trial(0.87, Status.OK, 750, used=97_500)  # a larger prefill: 2,500 free -> 0.89
    assert ceiling([low], {}, GRID, flags_for) == pytest.approx(0.94)
    assert ceiling([low, high], {}, GRID, flags_for) == pytest.approx(0.90)
    # a server at 0.91 ran its load and lived (its own reading): nothing at or below it fails
    lived = trial(0.91, Status.OK, 800, used=99_000)
    assert ceiling([low, high, lived], {}, GRID, flags_for) == pytest.approx(0.92)
    # one that died under load after a run it survived reads, but proves nothing fits
    died = trial(0.91, Status.DIED, used=99_000)
    assert ceiling([low, high, died], {}, GRID, flags_for) == pytest.approx(0.90)


def test_only_servers_of_the_same_memory_layout_predict() -> None:
    other = trial(0.85, Status.OK, 700, used=99_000, **{"chunked-prefill-size": 16384})
    assert ceiling([other], {}, GRID, flags_for) is None
    same_but_hicache = trial(0.85, Status.OK, 700, used=94_000, **{"hicache-size": 40})
    assert ceiling([same_but_hicache], {"hicache-size": 0}, GRID, flags_for) == 0.92


def test_a_reading_that_cannot_be_is_ignored() -> None:
    for used in (0.0, GPU + 1, "n/a"):
        t = trial(0.85, Status.OK, 700)
        t.user_attrs[Attr.SERVER_INFO] = {GPU_USED: used, GPU_TOTAL: GPU}
        assert reading_of(t) is None


def probe(*trials: FrozenTrial) -> float | None:
    found = edge_probe(list(trials), DIST, flags_for)
    return None if found is None else found.params[MFS]


def test_the_probe_jumps_to_the_highest_mfs_predicted_to_fit() -> None:
    # halving would go to 0.90 (halfway to one step past 0.95); the reading says 0.91 fits
    assert probe(trial(0.85, Status.OK, 700, used=94_000)) == pytest.approx(0.91)
    # the reading says 0.88 is the last that fits: no halfway climb into a predicted death
    assert probe(trial(0.85, Status.OK, 700, used=97_000)) == pytest.approx(0.88)
    # the jump died under load (a larger prefill than the reading saw): halved below it
    jumped = [trial(0.85, Status.OK, 700, used=94_000), trial(0.91, Status.DIED, used=99_000)]
    assert probe(*jumped) == pytest.approx(0.88)
    # a failure below the predicted ceiling binds: halving toward it, as without a reading
    best = trial(0.85, Status.OK, 700, used=90_000)
    assert probe(best, trial(0.89, Status.DIED)) == pytest.approx(0.87)


def test_at_the_predicted_ceiling_the_cliff_counts_as_found() -> None:
    best = trial(0.85, Status.OK, 700, used=94_000)
    top = trial(0.91, Status.OK, 900, used=99_700)
    # 0.92 is predicted not to fit: no climb; the pin (a restart at the cliff whose other flags
    # the sampler draws) comes next, as after a real failure at 0.92
    found = edge_probe([best, top], DIST, flags_for, sampled=[MFS, "hicache-size"])
    assert found is not None and found.pin and found.params[MFS] == pytest.approx(0.91)
    # without a reading the probe would still climb halfway to past the top
    assert probe(trial(0.91, Status.OK, 900)) > 0.92
