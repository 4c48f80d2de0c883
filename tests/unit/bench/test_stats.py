"""The statistics behind the benchmark's figures (bench/stats.py)."""

from __future__ import annotations

import statistics

import pytest

from bench.stats import bootstrap_ci, per_step, quantile, spread


def test_per_step_cancels_what_both_runs_share() -> None:
    start_up = 1_000_000
    assert per_step(start_up + 10 * 7_000, start_up + 50 * 7_000, 10, 50) == 7_000


def test_per_step_needs_a_larger_run() -> None:
    with pytest.raises(ValueError, match="more steps"):
        per_step(1, 2, 50, 50)


def test_quantile_interpolates_between_neighbours() -> None:
    assert quantile([1, 2, 3, 4], 0) == 1
    assert quantile([1, 2, 3, 4], 1) == 4
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([1, 2, 3, 4], 0.25) == 1.75
    assert quantile([7], 0.9) == 7


def test_bootstrap_ci_of_two_values_is_their_resampled_means() -> None:
    # Resamples of [0, 10] (size 2) have means 0, 5, 10 with chances 1/4, 1/2, 1/4: a 95 %
    # interval must reach both ends, an 40 % one only the middle.
    assert bootstrap_ci([0.0, 10.0], statistics.mean, level=0.95) == (0.0, 10.0)
    assert bootstrap_ci([0.0, 10.0], statistics.mean, level=0.4) == (5.0, 5.0)


def test_bootstrap_ci_brackets_the_median_and_narrows_with_the_level() -> None:
    values = [float(v) for v in range(1, 101)]
    lo95, hi95 = bootstrap_ci(values)
    lo50, hi50 = bootstrap_ci(values, level=0.5)
    assert lo95 < 50.5 < hi95
    assert lo95 <= lo50 <= hi50 <= hi95
    assert (hi95 - lo95) < 40  # far tighter than the range of the values


def test_bootstrap_ci_is_repeatable_and_constant_values_give_a_point() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    assert bootstrap_ci(values) == bootstrap_ci(values)
    assert bootstrap_ci([2.5] * 7) == (2.5, 2.5)


def test_bootstrap_ci_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0], level=1.0)


def test_spread() -> None:
    assert spread([4.0, 1.0, 3.0, 2.0, 5.0]) == {
        "n": 5,
        "min": 1.0,
        "p25": 2.0,
        "median": 3.0,
        "p75": 4.0,
        "max": 5.0,
    }
