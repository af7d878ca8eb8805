"""Decision tables for spend over history bin by bin (`zombie_history.py`): pure, on hand-made days."""

from __future__ import annotations

import math
from array import array

import numpy as np

from seamguard.gateway.zombie_history import (
    BINS_PER_DAY,
    MIN_BINS,
    MIN_DAY_SPREAD,
    MIN_SIGMA,
    bin_evidence,
    cusum,
    learn_reference,
)

GATE, PSEUDO, SHIFT = 2500.0, 2500.0, 6
BAR = math.log(1e5)


def day(level: float, hours: range = range(9, 18), noise: np.ndarray | None = None) -> tuple:
    """One active day as the detector keeps it: tokens per 5-minute bin (``level`` in ``hours``), no taint."""
    vals = np.zeros(BINS_PER_DAY)
    vals[hours.start * 12:hours.stop * 12] = level
    if noise is not None:
        vals *= noise
    return array("f", vals.astype(np.float32).tobytes()), bytearray(BINS_PER_DAY)


def test_no_reference_before_the_days_it_needs():
    days = {0: day(30000.0), 1: day(30000.0)}
    assert learn_reference(days, 2, SHIFT, GATE, PSEUDO, min_days=3) is None


def test_identical_days_get_the_floors_not_zero_spread():
    days = {d: day(30000.0) for d in range(3)}
    ref = learn_reference(days, 3, SHIFT, GATE, PSEUDO, min_days=3)
    assert ref is not None and ref.days == 3
    assert ref.sigma == MIN_SIGMA and ref.allowance == 2 * MIN_DAY_SPREAD and ref.offset == 0.0
    assert ref.usual[12 * 12] == 30000.0 and ref.usual[0] == 0.0  # an idle hour: usual 0, not unknown


def test_spread_is_learned_from_the_key_s_own_bins():
    rng = np.random.default_rng(1)
    quiet = learn_reference({d: day(30000.0, noise=rng.lognormal(0, 0.05, BINS_PER_DAY)) for d in range(5)},
                            5, SHIFT, GATE, PSEUDO, 3)
    noisy = learn_reference({d: day(30000.0, noise=rng.lognormal(0, 0.5, BINS_PER_DAY)) for d in range(5)},
                            5, SHIFT, GATE, PSEUDO, 3)
    assert quiet is not None and noisy is not None
    assert quiet.sigma == MIN_SIGMA < noisy.sigma


def test_growth_of_its_recent_days_is_not_evidence():
    days = {d: day(30000.0 * 1.1 ** d) for d in range(6)}  # 10 % a day
    ref = learn_reference(days, 6, SHIFT, GATE, PSEUDO, 3)
    assert ref is not None and ref.offset > 0.1
    flat = learn_reference({d: day(30000.0) for d in range(6)}, 6, SHIFT, GATE, PSEUDO, 3)
    tomorrow = 30000.0 * 1.1 ** 6
    assert bin_evidence(tomorrow, ref.usual[144], ref, 1.5, PSEUDO, BAR) < 0
    assert bin_evidence(tomorrow, flat.usual[144], flat, 1.5, PSEUDO, BAR) > bin_evidence(
        tomorrow, ref.usual[144], ref, 1.5, PSEUDO, BAR)


def test_a_bin_as_usual_lowers_the_score_and_a_huge_one_counts_a_quarter_of_the_bar_at_most():
    ref = learn_reference({d: day(30000.0) for d in range(3)}, 3, SHIFT, GATE, PSEUDO, 3)
    assert bin_evidence(30000.0, ref.usual[144], ref, 1.5, PSEUDO, BAR) < 0
    assert bin_evidence(3e7, ref.usual[144], ref, 1.5, PSEUDO, BAR) == BAR / MIN_BINS
    assert bin_evidence(30000.0, float("nan"), ref, 1.5, PSEUDO, BAR) == 0.0


def test_cusum_never_below_zero_and_an_unjudged_bin_never_raises_it():
    assert cusum(1.0, -5.0, True) == 0.0
    assert cusum(1.0, 2.0, False) == 1.0
    assert cusum(1.0, -0.5, False) == 0.5
    assert cusum(1.0, 2.0, True) == 3.0
