"""lab/experiments/findings.py: the docs' sentences with a number carry the interval the named pairing gives,
in points for rates and in nats for losses, and an end near 0 keeps the digit that says which side of 0 it
is."""

import math

from lab.experiments import findings


def test_a_paired_interval_in_points_pairs_by_key_and_a_welch_one_does_not():
    """a - b = +10, +30, +20 points by key: mean 20, sd 10, t(0.975, 2) = 4.3027: 20 -+ 24.84. Welch's over
    the same values: variances 100 each, df 4, t 2.7764: 20 -+ 2.7764 sqrt(200/3) = 20 -+ 22.67."""
    a, b = {1: 0.6, 2: 0.7, 3: 0.8}, {1: 0.5, 2: 0.4, 3: 0.6}
    half = 4.302653 * 10 / math.sqrt(3)
    assert findings.interval(a, b, True) == f"+20 [{20 - half:+.0f}, {20 + half:+.0f}] points"
    half = 2.776445 * math.sqrt(200 / 3)
    assert findings.interval(a, b, True, welch=True) == f"+20 [{20 - half:+.0f}, {20 + half:+.0f}] points"
    assert findings.word(a, b, True) == "level" and findings.word(a, b, False, welch=True) == "level"


def test_a_loss_interval_is_in_nats_and_an_end_near_zero_in_points_keeps_its_sign():
    """The last: 0.04 and 0.06 points, mean 0.05, half-width t(0.975, 1) x 0.01 = 0.127: [-0.077, +0.177]."""
    assert findings.interval({1: 1.5, 2: 1.6}, {1: 1.0, 2: 1.1}, False) == "+0.500 [+0.500, +0.500]"
    assert findings.interval({1: 0.0, 2: 0.5004}, {1: 0.0, 2: 0.0}, True) == "+25 [-293, +343] points"
    assert findings.interval({1: 0.2004, 2: 0.2006}, {1: 0.2, 2: 0.2}, True) == "+0.05 [-0.08, +0.18] points"


def test_every_finding_is_wrapped_to_the_page_width_and_a_bullet_keeps_its_indent():
    for name, text in findings.findings().items():
        lines = text.splitlines()
        assert all(len(line) <= 110 for line in lines), name
        if lines[0].startswith("- "):
            assert all(line.startswith("  ") for line in lines[1:]), name
