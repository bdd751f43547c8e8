"""bench_gpuhours' figure: GPU-hours to the first pick at 0.98 of the optimum, and its median and
worst over seeds when some seeds never got there (tests/bench/gpuhours_curve.py). Pure."""

from __future__ import annotations

import pytest

from tests.bench.gpuhours_curve import Reach, hours_to, median, ratio, worst


def test_hours_count_up_to_and_including_the_first_trial_whose_pick_reached() -> None:
    # a duplicate (0 GPU-hours) keeps the pick; the fourth trial's pick is the first at 0.98
    rows = [(0.5, 0.90), (0.0, 0.90), (0.25, 0.975), (0.5, 0.98), (0.5, 1.0)]
    assert hours_to(rows) == Reach(1.25, True)


def test_a_pick_that_falls_back_below_does_not_undo_the_first_reach() -> None:
    assert hours_to([(1.0, 0.99), (1.0, 0.5)]) == Reach(1.0, True)


def test_never_reached_counts_all_it_spent_as_a_lower_bound() -> None:
    got = hours_to([(0.5, 0.5), (0.75, 0.97)])
    assert got == Reach(1.25, False)
    assert hours_to([]) == Reach(0.0, False)


def test_median_and_worst_over_seeds() -> None:
    seeds = [Reach(1.0, True), Reach(3.0, True), Reach(2.0, True)]
    assert (median(seeds).value, median(seeds).exact) == (2.0, True)
    assert str(worst(seeds)) == "3.00"


def test_an_unreached_seed_makes_the_worst_a_lower_bound_but_not_a_median_it_does_not_decide():
    seeds = [Reach(1.0, True), Reach(2.0, True), Reach(9.0, False)]
    assert str(median(seeds)) == "2.00"
    assert str(worst(seeds)) == ">9.00"


def test_a_median_decided_by_unreached_seeds_is_a_lower_bound() -> None:
    # the middle two of four never reached: at least the median of what was spent
    seeds = [Reach(1.0, True), Reach(4.0, False), Reach(6.0, False), Reach(0.5, True)]
    got = median(seeds)
    assert not got.exact and got.value == pytest.approx(2.5)
    assert str(got) == ">2.50"


def test_the_ratio_of_medians_only_between_exact_figures() -> None:
    before = median([Reach(2.0, True)])
    assert ratio(median([Reach(1.0, True)]), before) == "0.50"
    assert ratio(median([Reach(5.0, False)]), before) == "-"
