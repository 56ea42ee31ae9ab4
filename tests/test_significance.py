"""The paired tests of ``runs compare`` on constructed scores whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.outputs.significance import (
    A_BETTER, B_BETTER, NO_DIFFERENCE, paired_difference, seed_difference,
)


def scores(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.2, 0.8, n)


@pytest.mark.parametrize("n", [6, 12, 40])
def test_identical_scores_show_no_difference(n):
    a = scores(n, 0)
    d = paired_difference(a, a.copy())
    assert d.mean == 0 and d.verdict == NO_DIFFERENCE and d.p_value == 1.0 and d.low <= 0 <= d.high


@pytest.mark.parametrize("n", [8, 20, 60])
def test_a_constant_shift_well_above_noise_is_detected_both_ways(n):
    rng = np.random.default_rng(n)
    a = scores(n, 1)
    b = a + 0.05 + rng.normal(0, 0.01, n)
    up, down = paired_difference(a, b), paired_difference(b, a)
    assert up.verdict == B_BETTER and up.low > 0 and up.low < up.mean < up.high and up.p_value < 0.05
    assert down.verdict == A_BETTER and down.high < 0
    assert math.isclose(up.mean, -down.mean) and math.isclose(up.low, -down.high, abs_tol=1e-6)


def test_pure_noise_is_no_detectable_difference_in_most_seeds():
    verdicts = []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        a = scores(12, seed)
        verdicts.append(paired_difference(a, a + rng.normal(0, 0.05, 12)).verdict)
    assert verdicts.count(NO_DIFFERENCE) >= 90  # a 5% test: about 5 false alarms in 100


def test_the_interval_holds_zero_exactly_when_the_test_does_not_reject():
    for seed in range(30):
        rng = np.random.default_rng(seed)
        a = scores(10, seed)
        d = paired_difference(a, a + rng.normal(0.02, 0.04, 10))
        assert (d.low <= 0 <= d.high) == (d.p_value >= 0.05)


def test_ties_keep_zero_in_the_interval_when_the_test_does_not_reject_it():
    """Issue 79: an interval [-0.0006, -0.0000] beside p 1.000. Graphs both runs scored alike (d = 0)
    carry no sign at shift 0 but do at any other: 0 is not rejected, so the interval holds it."""
    a = scores(25, 3)
    b = a.copy()
    b[0] -= 0.002  # one graph moved, 24 alike
    d = paired_difference(a, b)
    assert d.p_value == 1.0 and d.verdict == NO_DIFFERENCE
    assert d.low < 0 and d.high == 0.0  # was just below 0 (-4e-10)
    for seed in range(40):  # agreement over many tie patterns
        rng = np.random.default_rng(seed)
        a = scores(int(rng.integers(8, 30)), seed)
        b = a.copy()
        moved = rng.choice(a.shape[0], int(rng.integers(1, 8)), replace=False)
        b[moved] += rng.normal(-0.002, 0.003, moved.shape[0])
        d = paired_difference(a, b)
        assert math.isnan(d.low) or (d.low <= 0 <= d.high) == (d.p_value >= 0.05)


def test_a_lower_level_widens_the_interval_and_needs_more_graphs():
    rng = np.random.default_rng(5)
    a = scores(20, 5)
    b = a + 0.03 + rng.normal(0, 0.02, 20)
    usual, strict = paired_difference(a, b), paired_difference(a, b, alpha=0.005)
    assert strict.low < usual.low and strict.high > usual.high and strict.p_value == usual.p_value
    few = paired_difference(a[:8], b[:8], alpha=0.005)  # 2/2^8 = 0.0078: no sign vector rare enough
    assert "too few pairs to detect any at 0.50%" in few.verdict


def test_too_few_graphs_say_so_and_nan_pairs_are_left_out():
    a = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    d = paired_difference(a, a + 1)
    assert d.n == 5 and "too few" in d.verdict and math.isnan(d.low)
    d = paired_difference([*a, math.nan, 0.6, 0.7], [*(a + 1), 0.3, 1.6, 1.7])
    assert d.n == 7 and d.verdict == B_BETTER
    assert paired_difference([], []).n == 0


def test_weights_stratify_the_mean():
    a = np.zeros(12)
    b = np.array([1.0] * 6 + [0.0] * 6)
    weighted = paired_difference(a, b, [1 / 12] * 6 + [1 / 60] * 6)
    assert math.isclose(weighted.mean, (1 / 12 * 6) / (1 / 12 * 6 + 1 / 60 * 6))


def test_seed_difference():
    assert seed_difference([0.50, 0.51, 0.49], [0.60, 0.61, 0.62]).verdict == B_BETTER
    assert seed_difference([0.50, 0.55, 0.45], [0.51, 0.56, 0.44]).verdict == NO_DIFFERENCE
    assert "fewer than 2" in seed_difference([0.5], [0.6, 0.7]).verdict
