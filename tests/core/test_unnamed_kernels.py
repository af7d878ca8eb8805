"""The series judge's fast paths (assess/unnamed.py) give what the forms they replaced gave, bit
for bit, tick after tick: the peer median by partitions where most cells are in large groups
(instead of a sort started from last tick's order) and each column's spread by a partition
(instead of np.nanmedian). Random blocks with the awkward cases in: missing cells, series that
vanish, counter resets, load classes that change, columns without a warm cell."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from seamguard.assess import unnamed
from seamguard.assess.stats import loo_median_hinted
from seamguard.assess.unnamed import UnnamedJudgeConfig, judge
from seamguard.fleet.model import Kind
from seamguard.observe.unnamed import SeriesBlock

_FIELDS = ("names", "counter", "prev", "mu", "dev", "n", "bits", "still", "moved", "gone", "seen")


def _reference_spread(a: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(a, axis=0)


def _run(n: int, s: int, group_size: int, ticks: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    counter = np.arange(s) % 2 == 1
    names = tuple(f"x_{i}" for i in range(s))
    level = rng.normal(50.0, 2.0, (n, s))
    level[rng.random(n) < 0.02] += 30.0  # entities that always sit apart
    acc = np.zeros((n, s))
    host = np.arange(n) // 4
    cfg, st, out = UnnamedJudgeConfig(warm_samples=3), None, []
    for k in range(ticks):
        acc += rng.random((n, s)) * (rng.random((n, s)) > 0.1)  # some counters stand still
        acc[rng.random((n, s)) < 0.01] = 0.0  # resets
        x = np.where(counter, acc, level + rng.normal(0.0, 0.3, (n, s)))
        x[n // 2, 0] += 4.0 * max(k - 5, 0)  # one entity drifts away on one gauge
        x[rng.random((n, s)) < 0.03] = np.nan  # missing cells
        if k >= ticks // 2:
            x[: n // 50, 0] = np.nan  # a series that vanishes on some entities
            x[:, s - 1] = np.nan if k % 3 == 0 else x[:, s - 1]  # a column gone for a tick
        group = (np.arange(n) // group_size + (k % 4 == 3)) % max(n // group_size, 1)  # classes change
        named = np.where(rng.random(n) < 0.05, 0.5, 0.0)
        learn = rng.random(n) > 0.02
        score, value, tele, st = judge(SeriesBlock(Kind.GPU, names, counter, x), st, 15.0 * k, group, named,
                                       learn, host, cfg)
        out.append((score, value, tele, *(getattr(st, f) for f in _FIELDS)))
    return out


@pytest.mark.parametrize("n,s,group_size", [(12_000, 3, 6_000), (3_000, 4, 16), (500, 5, 100), (12, 2, 6)])
def test_the_judge_equals_the_hinted_sort_and_nanmedian_it_replaced(monkeypatch, n, s, group_size) -> None:
    got = _run(n, s, group_size, 12, seed=n + s)
    monkeypatch.setattr(unnamed, "_peer_median", loo_median_hinted)
    monkeypatch.setattr(unnamed, "_column_spread", _reference_spread)
    want = _run(n, s, group_size, 12, seed=n + s)
    for tick, (g, w) in enumerate(zip(got, want)):
        for name, a, b in zip(("score", "value", "tele", *_FIELDS), g, w):
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), (tick, name)
            else:
                assert a == b, (tick, name)
    assert any((g[0] > 0).any() for g in got)  # something was scored: the comparison covers verdicts


def test_column_spread_equals_nanmedian() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 599, 600, 1001):
        a = np.abs(rng.normal(0.0, 1.0, (n, 6)))
        a[rng.random(a.shape) < 0.3] = np.nan
        a[:, 0] = np.nan
        a[:, 1] = 2.0  # ties
        a[: n // 2, 2] = np.inf
        assert np.array_equal(unnamed._column_spread(a), _reference_spread(a), equal_nan=True), n


def test_large_groups_take_the_partitions_and_keep_no_order() -> None:
    n, s = 10_000, 2
    v = np.random.default_rng(1).normal(0.0, 1.0, n * s)
    g = np.repeat(np.arange(s), n)  # two groups of 10,000 cells
    *_, order = unnamed._peer_median(v, g, s, None)
    assert order is None
    *_, order = unnamed._peer_median(v, np.arange(n * s) // 8, n * s // 8, None)  # groups of 8: the hinted sort
    assert order is not None and order.size == n * s
