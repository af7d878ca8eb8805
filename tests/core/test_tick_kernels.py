"""The tick's fast kernels equal the straightforward forms they replaced, bit for bit.

Each was rewritten for a million-entity tick (benchmarks/tick.py); the reference here is
the earlier code, run on random inputs with the awkward cases in (missing samples,
counter resets, blocks that do not divide the entity count).
"""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.assess.evidence import _stack
from seamguard.assess.stats import counter_increase, noisy_or
from seamguard.decide.breaker import _topology
from seamguard.decide.checkpoints import _job_domain_pairs
from seamguard.fleet import FleetShape, generate_fleet
from seamguard.observe import History
from seamguard.observe.frame import Frame


def _reference_increase(rows: np.ndarray) -> np.ndarray:
    d = np.diff(rows, axis=0)
    d = np.where(d < 0, rows[1:], d)
    return np.nansum(d, axis=0)


def _counter_rows(rng: np.random.Generator, k: int, n: int) -> np.ndarray:
    rows = np.cumsum(rng.poisson(0.4, (k, n)) * rng.uniform(0.5, 3.0, (k, n)), axis=0)
    rows[rng.random(rows.shape) < 0.05] = np.nan  # missing samples
    reset = rng.random(rows.shape) < 0.03
    rows[reset] = rng.uniform(0.0, 1.0, int(reset.sum()))  # exporter restarts
    return rows


@pytest.mark.parametrize("k,n", [(2, 1), (2, 7), (5, 1000), (21, 70_001), (3, 2 * (1 << 15))])
def test_counter_increase_equals_reference(k: int, n: int) -> None:
    rng = np.random.default_rng(k * 1000 + n)
    rows = _counter_rows(rng, k, n)
    got = counter_increase(list(rows))
    want = _reference_increase(rows)
    assert got.dtype == want.dtype
    assert np.array_equal(got.view(np.int64), want.view(np.int64))  # bitwise (a sum is never NaN)


def test_history_rows_are_the_window_without_a_copy() -> None:
    hist = History(15.0, 3)
    rng = np.random.default_rng(3)
    for t in range(5):
        hist.push(Frame(t_s=15.0 * t, values={"c": rng.random(9)}))
    for k in (1, 2, 3, 5):
        rows = hist.rows("c", k)
        assert np.array_equal(np.array(rows), hist.window("c", k))
        assert all(not r.flags.writeable for r in rows)
    assert hist.rows("absent", 2) is None


def test_stack_is_the_row_major_stack_column_major() -> None:
    rng = np.random.default_rng(4)
    cols = [rng.random(1001) for _ in range(6)]
    got = _stack(cols)
    assert got.shape == (1001, 6)
    assert np.array_equal(got, np.stack(cols, axis=1))
    assert _stack([]).shape == (0, 0)


def test_breaker_node_leaf_pairs_equal_a_row_unique() -> None:
    fleet = generate_fleet(FleetShape(gpus=2048), seed=5)
    ok = fleet.nic_leaf >= 0
    want = np.unique(np.stack([fleet.nic_node[ok], fleet.nic_leaf[ok]], axis=1), axis=0)
    got = _topology(fleet).node_leaf_pairs
    assert got.dtype == want.dtype
    assert np.array_equal(got, want)


def _reference_noisy_or(scores: np.ndarray) -> np.ndarray:
    return 1.0 - np.prod(1.0 - scores, axis=-1)


@pytest.mark.parametrize("order", ["C", "F"])
def test_noisy_or_equals_reference(order: str) -> None:
    rng = np.random.default_rng(6)
    scores = np.asarray(rng.random((5000, 27)) * (rng.random((5000, 27)) < 0.3), order=order)
    got = noisy_or(scores)
    assert np.array_equal(got.view(np.int64), _reference_noisy_or(scores).view(np.int64))
    assert np.array_equal(noisy_or(scores[:, :1]), _reference_noisy_or(scores[:, :1]))
    assert noisy_or(np.zeros((4, 0))).tolist() == [0.0] * 4
    assert noisy_or(np.array([0.5, 0.5])) == 0.75  # one entity's channels as a vector


def test_exposure_job_domain_pairs_equal_a_row_unique() -> None:
    fleet = generate_fleet(FleetShape(gpus=4096), seed=7)
    placed = np.flatnonzero(fleet.node_job >= 0)
    for got, dom_of_node in zip(_job_domain_pairs(fleet), (fleet.node_loop, fleet.node_rack)):
        want = np.unique(np.stack([fleet.node_job[placed], dom_of_node[placed]]), axis=1)
        assert np.array_equal(got, want)
    assert _job_domain_pairs(fleet) is _job_domain_pairs(fleet)  # once per fleet
