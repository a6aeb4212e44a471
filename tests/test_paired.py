"""lab/measure/paired.py: the paired-t interval behind every verdict over seeds, checked by hand and against
published t quantiles."""

import math
import random

import pytest

from lab.measure.paired import paired_cell, paired_difference, t_quantile, verdict, welch_difference


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)])
def test_t_quantile_matches_the_published_97_5_percent_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_paired_interval_of_a_hand_computed_case():
    """d = (1, 2, 3): mean 2, sd 1, standard error 1/sqrt(3), t(0.975, 2) = 4.302653: 2 -+ 2.484138."""
    mean, low, high = paired_difference([1.5, 2.5, 3.5], [0.5, 0.5, 0.5])
    assert mean == pytest.approx(2.0)
    assert (low, high) == pytest.approx((2 - 4.302653 / math.sqrt(3), 2 + 4.302653 / math.sqrt(3)), abs=1e-6)
    assert verdict(low, high, higher_is_better=True) == "level"  # three seeds this spread hold 0


def test_pairing_removes_what_the_seeds_share():
    """A constant gap on top of a large per-seed effect: the paired interval is the gap, exactly."""
    rng = random.Random(0)
    seed_effect = [rng.uniform(-5, 5) for _ in range(5)]
    mean, low, high = paired_difference([s + 0.25 for s in seed_effect], seed_effect)
    assert mean == pytest.approx(0.25) and high - low == pytest.approx(0.0, abs=1e-12)
    assert verdict(low, high, higher_is_better=False) == "worse"
    assert verdict(-high, -low, higher_is_better=False) == "better"


def test_a_verdict_needs_two_paired_seeds():
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_difference([1.0], [0.0])
    with pytest.raises(ValueError):
        paired_difference([1.0, 2.0], [0.0])


def test_a_paired_cell_shows_the_scaled_difference_its_interval_and_word():
    """The hand-computed case above in points: 200 -+ 248.4."""
    assert paired_cell([1.5, 2.5, 3.5], [0.5] * 3, True, 100, " points") == "+200 points [-48.4, +448]: level"
    assert paired_cell([1.0, 1.1, 1.2], [0.0, 0.1, 0.2], False) == "+1 [+1, +1]: worse"


def test_welch_interval_of_a_hand_computed_case():
    """a = (1, 2, 3), b = (3, 4, 5): variances 1 and 1, squared standard error 1/3 + 1/3, df = (2/3)^2 / (2 x
    (1/3)^2 / 2) = 4, t(0.975, 4) = 2.7764: -2 -+ 2.7764 sqrt(2/3) = [-4.2669, +0.2669], level. Paired, the
    same values differ by exactly -2."""
    mean, low, high = welch_difference([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    assert mean == pytest.approx(-2.0)
    half = 2.7764 * math.sqrt(2 / 3)
    assert (low, high) == pytest.approx((-2 - half, -2 + half), abs=1e-3)
    assert verdict(low, high, higher_is_better=True) == "level"
    assert paired_difference([1.0, 2.0, 3.0], [3.0, 4.0, 5.0]) == pytest.approx((-2.0, -2.0, -2.0))


def test_welch_degrees_of_freedom_follow_the_noisier_side():
    """Unequal spreads: a's variance 1 over 3, b's 100 over 3 -> df = (101/3)^2 / ((1/9 + 10000/9) / 2) =
    2.0400, near b's n - 1 = 2; unequal sizes are allowed."""
    a, b = [1.0, 2.0, 3.0], [0.0, 10.0, 20.0]
    mean, low, high = welch_difference(a, b)
    df = (101 / 3) ** 2 / ((1 / 9 + 10000 / 9) / 2)
    assert high - mean == pytest.approx(t_quantile(0.975, df) * math.sqrt(101 / 3), rel=1e-9)
    assert df == pytest.approx(2.0400, abs=1e-4)
    assert welch_difference([1.0, 2.0, 3.0, 4.0], [0.0, 1.0])[0] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least 2 values a side"):
        welch_difference([1.0], [0.0, 1.0])


def test_a_welch_cell_is_written_as_a_paired_one():
    assert paired_cell([1.0, 2.0, 3.0], [3.0, 4.0, 5.0], True, interval=welch_difference) == (
        "-2 [-4.27, +0.267]: level"
    )
