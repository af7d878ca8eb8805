"""Goodput as the max rate at an SLO attainment target (seamguard.testbed.inference_goodput): which
grid level a curve of attainments gives, and which ratios are exact and which only bounds."""

from __future__ import annotations

import pytest

from seamguard.testbed.inference_goodput import (
    AT,
    AT_LEAST,
    BELOW,
    MaxRate,
    Point,
    max_rate_at_target,
    rate_ratio,
)

LEVELS = (0.3, 0.5, 0.7, 0.85, 1.0)


def curve(*attainments: float) -> list[Point]:
    return [Point(lv, round(lv * 7.54, 3), a) for lv, a in zip(LEVELS, attainments)]


@pytest.mark.parametrize("attainments, target, bound, level, again", [
    ((1.0, 1.0, 0.99, 0.96, 0.8), 0.99, AT, 0.7, ()),  # exactly the target counts as met
    ((1.0, 1.0, 0.99, 0.96, 0.8), 0.90, AT, 0.85, ()),
    ((0.95, 0.92, 0.905, 0.88, 0.7), 0.90, AT, 0.7, ()),
    ((0.89, 0.9, 0.86, 0.8, 0.7), 0.90, BELOW, 0.3, (0.5,)),  # a miss at the lowest level, met again above
    ((1.0, 0.98, 0.99, 1.0, 0.97), 0.99, AT, 0.3, (0.7, 0.85)),  # a dip bounds the rate; the recovery is reported
    ((1.0, 1.0, 1.0, 1.0, 0.995), 0.99, AT_LEAST, 1.0, ()),
])
def test_max_rate_is_the_last_level_before_the_first_miss(attainments, target, bound, level, again):
    got = max_rate_at_target(curve(*attainments), target)
    assert (got.bound, got.level, got.met_again_at) == (bound, level, again)
    assert got.rate_rps == pytest.approx(level * 7.54, abs=1e-3)


@pytest.mark.parametrize("attainments, bound, level", [
    ((0.84, 0.92, 0.905, 0.88, 0.7), AT, 0.7),  # a balancer's curve that rises with load: its best point counts
    ((0.89, 0.88, 0.86, 0.8, 0.7), BELOW, 0.3),
    ((0.8, 0.95, 0.8, 0.8, 0.91), AT_LEAST, 1.0),
    ((1.0, 1.0, 0.85, 0.8, 0.7), AT, 0.5),  # a curve that only falls reads the same either way
])
def test_generous_reading_takes_the_highest_level_that_met_the_target(attainments, bound, level):
    got = max_rate_at_target(curve(*attainments), 0.90, contiguous=False)
    assert (got.bound, got.level) == (bound, level)


def test_points_are_read_in_level_order_whatever_order_they_come_in():
    shuffled = list(reversed(curve(1.0, 1.0, 0.98, 1.0, 1.0)))
    assert max_rate_at_target(shuffled, 0.99).level == 0.5


def test_max_rate_prints_its_bound():
    assert str(MaxRate(AT, 0.7, 5.278)) == "0.7 (5.28 req/s)"
    assert str(MaxRate(AT_LEAST, 1.0, 7.54)) == ">= 1 (7.54 req/s)"
    assert str(MaxRate(BELOW, 0.3, 2.262)) == "below 0.3 (2.26 req/s)"


@pytest.mark.parametrize("points, target, message", [
    ([], 0.9, "no points"),
    (curve(1.0), 0.0, "target 0.0"),
    (curve(1.0), 1.5, "target 1.5"),
    ([Point(0.5, 3.8, 1.0), Point(0.5, 3.8, 0.9)], 0.9, "level 0.5 appears twice"),
    (curve(1.0, 1.2), 0.9, "level 0.5: attainment 1.2 outside 0..1"),
])
def test_bad_input_names_what_was_wrong(points, target, message):
    with pytest.raises(ValueError, match=message):
        max_rate_at_target(points, target)


AT7, AT85, AT3 = MaxRate(AT, 0.7, 5.0), MaxRate(AT, 0.85, 6.0), MaxRate(AT, 0.3, 2.0)
TOP, LOW = MaxRate(AT_LEAST, 1.0, 7.0), MaxRate(BELOW, 0.3, 2.0)


@pytest.mark.parametrize("ours, theirs, bound, value", [
    (AT85, [AT7, AT3], "=", 1.2),  # the best baseline is the larger one
    (TOP, [AT7], ">=", 1.4),  # we might go higher than the grid went
    (AT85, [LOW, LOW], ">=", 3.0),  # they never met it: their rate is under the lowest level
    (TOP, [LOW, AT7], ">=", 1.4),  # one baseline below, the other at a level: the one at a level is the best
    (LOW, [AT7], "<=", 0.4),  # we never met it
    (AT85, [TOP, AT3], "<=", 6.0 / 7.0),  # a baseline met it at every level tried
    (LOW, [LOW], "?", None),
    (TOP, [TOP], "?", None),
])
def test_ratio_is_exact_only_when_both_rates_are_grid_levels(ours, theirs, bound, value):
    got = rate_ratio(ours, theirs)
    assert got.bound == bound
    assert got.value == (None if value is None else pytest.approx(value, abs=1e-4))


def test_ratio_prints_its_bound_and_needs_a_baseline():
    assert str(rate_ratio(TOP, [LOW])) == ">= 3.50x"
    assert str(rate_ratio(AT85, [AT7])) == "1.20x"
    assert str(rate_ratio(LOW, [LOW])) == "undetermined by the grid"
    with pytest.raises(ValueError, match="no rates"):
        rate_ratio(AT85, [])
