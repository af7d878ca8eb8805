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


def _direct_loo_mad(x: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per entity with a value, the MAD of the other members with one around their own median."""
    out = np.full(len(x), np.nan)
    for i in np.flatnonzero(np.isfinite(x)):
        others = np.sort(x[(group == group[i]) & np.isfinite(x) & (np.arange(len(x)) != i)])
        m = len(others)
        if m == 0:
            continue
        lo, hi = (m - 1) // 2, m // 2
        c = 0.5 * (others[lo] + others[hi])
        d = np.sort(np.abs(others - c))
        out[i] = 0.5 * (d[lo] + d[hi])
    return out


def _direct_loo_median(x: np.ndarray, group: np.ndarray) -> np.ndarray:
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        others = np.sort(x[(group == group[i]) & np.isfinite(x) & (np.arange(len(x)) != i)])
        if len(others):
            out[i] = 0.5 * (others[(len(others) - 1) // 2] + others[len(others) // 2])
    return out


# The leave-one-out pick of the replaced code: ranks in a sorted layout.
def _loo_pick(xs: np.ndarray, start: np.ndarray, rank: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Median of the ``m`` sorted values of a group other than the one at ``rank`` (NaN where m == 0).
    A rank past every slot (an entity without a value) excludes nothing."""
    has = m > 0
    lo, hi = np.maximum(m - 1, 0) // 2, m // 2
    i_lo = start + lo + (lo >= rank)
    i_hi = start + hi + (hi >= rank)
    out = np.full(len(m), np.nan)
    if len(xs):
        top = len(xs) - 1
        out[has] = 0.5 * (xs[np.minimum(i_lo, top)] + xs[np.minimum(i_hi, top)])[has]
    return out


_NO_RANK = np.iinfo(np.int64).max // 4


def _reference_sorted_groups(x: np.ndarray, group: np.ndarray, n_groups: int):
    from seamguard.assess.stats import _group_sort
    ok = np.flatnonzero(np.isfinite(x))
    order = ok[_group_sort(x[ok], group[ok])]
    counts = np.bincount(group[ok], minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rank = np.full(len(x), -1, dtype=np.int64)
    rank[order] = np.arange(len(order)) - starts[group[order]]
    return order, counts, starts, rank


def _reference_loo_median(x: np.ndarray, group: np.ndarray, n_groups: int):
    """loo_median as it was before 2026-12-07: one sort, each entity's rank in it."""
    order, counts, starts, rank = _reference_sorted_groups(x, group, n_groups)
    has = rank >= 0
    others = np.where(has, counts[group] - 1, counts[group])
    return _loo_pick(x[order], starts[group], np.where(has, rank, _NO_RANK), others), others


def _reference_loo_robust_z(x: np.ndarray, group: np.ndarray, n_groups: int, floor: float, min_peers: int = 3):
    """loo_robust_z as it was before 2026-12-07: each centre's deviations sorted (three stable sorts)."""
    from seamguard.assess.stats import _group_sort
    order, counts, starts, rank = _reference_sorted_groups(x, group, n_groups)
    has = rank >= 0
    others = np.where(has, counts[group] - 1, counts[group])
    xs = x[order]
    med = _loo_pick(xs, starts[group], np.where(has, rank, _NO_RANK), others)
    gs = group[order]
    st = starts[gs]
    r = np.arange(len(order)) - st
    m = counts[gs] - 1
    lo, hi = np.maximum(m - 1, 0) // 2, m // 2
    top = max(len(xs) - 1, 0)

    def at(i):
        return xs[np.minimum(st + i, top)] if len(xs) else np.zeros(0)
    centres = (0.5 * (at(lo) + at(hi)), 0.5 * (at(lo) + at(hi + 1)), 0.5 * (at(lo + 1) + at(hi + 1)))
    variant = np.where(r > hi, 0, np.where(r > lo, 1, 2))
    mad_s = np.full(len(order), np.nan)
    for v, c in enumerate(centres):
        dv = np.abs(xs - c)
        o2 = _group_sort(dv, gs, stable=True)
        pos = np.empty(len(o2), dtype=np.int64)
        pos[o2] = np.arange(len(o2))
        mad_s = np.where(variant == v, _loo_pick(dv[o2], st, pos - st, m), mad_s)
    mad = np.full(len(x), np.nan)
    mad[order] = mad_s
    enough = others >= min_peers
    scale = np.maximum(1.4826 * np.nan_to_num(mad, nan=floor), floor)
    return np.where(enough, (x - med) / scale, np.nan), np.where(enough, med, np.nan), others


def _peer_inputs(rng: np.random.Generator, n: int, n_groups: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    x = rng.integers(0, 6, n).astype(float) if ties else rng.normal(50.0, 2.0, n)
    x[rng.random(n) < 0.1] = np.nan
    x[rng.random(n) < 0.02] += 40.0  # outliers
    return x, rng.integers(0, n_groups, n)


# select_min 2: every group of two or more takes the partition path; 4096: every group here is sorted.
@pytest.mark.parametrize("select_min", [2, 4096])
@pytest.mark.parametrize("n,n_groups,ties,grouped", [(300, 60, False, False), (300, 60, True, True),
                                                     (400, 2, True, False), (400, 1, False, False),
                                                     (1, 1, False, False), (0, 3, False, False)])
def test_loo_median_and_mad_equal_the_direct_computation(monkeypatch, select_min, n, n_groups, ties, grouped) -> None:
    from seamguard.assess import stats
    monkeypatch.setattr(stats, "_SELECT_MIN", select_min)
    rng = np.random.default_rng(n * 10 + n_groups + ties)
    x, g = _peer_inputs(rng, n, n_groups, ties)
    if grouped:  # laid out group by group, as a rack's GPUs are
        g = np.sort(g)
    med, others = stats.loo_median(x, g, n_groups)
    assert np.array_equal(med, _direct_loo_median(x, g), equal_nan=True)
    assert np.array_equal(others, _reference_loo_median(x, g, n_groups)[1])
    ok = np.isfinite(x)
    r = stats._ranks(x, g, n_groups, ok)
    rows = stats._leave_out(r, x, g, ok)[2]
    assert np.array_equal(stats._loo_mad(r, x, g, ok, rows), _direct_loo_mad(x, g), equal_nan=True)


@pytest.mark.parametrize("seed", range(6))
def test_loo_statistics_give_the_replaced_sorts_verdicts(monkeypatch, seed: int) -> None:
    from seamguard.assess import stats
    rng = np.random.default_rng(seed)
    n, n_groups = int(rng.integers(1000, 30_000)), int(rng.choice([1, 2, 50, 3000]))
    monkeypatch.setattr(stats, "_SELECT_MIN", int(rng.choice([64, 4096])))
    x, g = _peer_inputs(rng, n, n_groups, ties=bool(seed % 2))
    med, peers = stats.loo_median(x, g, n_groups)
    med0, peers0 = _reference_loo_median(x, g, n_groups)
    assert np.array_equal(peers, peers0)
    np.testing.assert_allclose(med, med0, rtol=1e-12, atol=0)  # the old sort's combined key rounds at 1e-16
    z, med, peers = stats.loo_robust_z(x, g, n_groups, floor=0.05)
    z0, med0, peers0 = _reference_loo_robust_z(x, g, n_groups, floor=0.05)
    assert np.array_equal(peers, peers0)
    np.testing.assert_allclose(med, med0, rtol=1e-12, atol=0)
    np.testing.assert_allclose(z, z0, rtol=1e-12, atol=0)
    for bar in (3.0, 6.0, 12.0):  # the channels' concern and saturation bars: the same verdicts
        assert np.array_equal(np.abs(np.nan_to_num(z)) >= bar, np.abs(np.nan_to_num(z0)) >= bar)


def _reference_ramp(x, lo: float, hi: float):
    return np.clip((np.nan_to_num(x, nan=lo) - lo) / (hi - lo), 0.0, 1.0)


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (120.0, 480.0), (-3.0, 5.5), (2.0, 1.0), (1.0, 1.0), (0.0, 1e-300)])
def test_ramp_equals_reference(lo: float, hi: float) -> None:
    from seamguard.assess.stats import ramp
    rng = np.random.default_rng(8)
    x = rng.normal(lo, 3.0 * abs(hi - lo) + 1.0, 5000)
    x[:6] = [np.nan, np.inf, -np.inf, lo, hi, 1e308]
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)  # baselines are float32 (1e308 becomes inf)
    for arr in (x, x32, (x > lo).astype(np.int64)):
        with np.errstate(all="ignore"):
            want = _reference_ramp(arr, lo, hi)
            got = ramp(arr, lo, hi)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    for v in (np.nan, lo, np.inf):  # scalars
        with np.errstate(all="ignore"):
            assert np.array_equal(ramp(v, lo, hi), _reference_ramp(v, lo, hi), equal_nan=True)


def _reference_ew(old, new, a, learn):
    ok = learn & np.isfinite(new)
    start = ~np.isfinite(old)
    return np.where(ok & start, new, np.where(ok, old + a * (np.nan_to_num(new) - old), old)).astype(np.float32)


def test_ew_equals_reference() -> None:
    from seamguard.assess.baselines import ew
    rng = np.random.default_rng(9)
    n = 20_000
    old = rng.normal(40.0, 5.0, n).astype(np.float32)
    old[rng.random(n) < 0.1] = np.nan  # not learned yet
    new = rng.normal(40.0, 5.0, n)
    new[rng.random(n) < 0.1] = np.nan
    new[:4] = [np.inf, -np.inf, np.nan, 1e308]
    a = np.where(rng.random(n) < 0.5, rng.random(n), 0.0)
    learn = rng.random(n) < 0.8
    got, want = ew(old, new, a, learn), _reference_ew(old, new, a, learn)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
