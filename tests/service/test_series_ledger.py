"""The dashboard's persisted series on both ledger backends: SQLite (embedded) and PostgreSQL
(an HA pair's shared ledger, Debian's server started here as in tests/ha).

Fleet vectors and one entity's points are written tick by tick; what comes back per tick,
rolled up per minute and per 15 minutes, and what retention deletes, must be the same on
both. The writer thread's failures and drops are counted, never raised.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from seamguard.ledger import open_ledger, open_reader
from seamguard.ledger.series import (
    LEVELS,
    N_STATES,
    SeriesTick,
    SeriesWriter,
    decode_fleet,
    encode_fleet,
    watched,
)
from seamguard.testbed.postgres_server import PostgresServer

_db_numbers = itertools.count()
LOOPS = 3
GPU = "gpu000/gpu1"


@pytest.fixture(scope="module")
def postgres():
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return request.getfixturevalue("postgres").create_database(f"series_{next(_db_numbers)}")


def _tick(i: int, dt_s: float) -> SeriesTick:
    """Tick i: GPU counts move, loop 1 flow cycles, loop 2 is quarantined at tick 50 only;
    the GPU is recorded on even ticks with a GFS cycling 0..0.9 and a signal that is never read."""
    flow = np.array([100.0, 90.0 + i % 7, 80.0])
    coolant = np.stack([flow, np.full(LOOPS, 20.0 + i % 3), np.full(LOOPS, 30.0)], axis=1)
    states = np.array([0, 1, 3 if i == 50 else 0])
    gpus = [100 - i % 5, i % 5, 0, 0, 0, 0]
    fleet = encode_fleet(gpus, [10, 0, 0, 0, 0, 0], 0.9 - (i % 4) / 100, None, states, coolant)
    ents = (("gpu", GPU, (i % 10) / 10, np.array([i, 2 * i, np.nan], dtype=np.float32)),) if i % 2 == 0 else ()
    return SeriesTick(i, i * dt_s, 1e9 + i, fleet, ents)


def _write(target: str, ticks: int, dt_s: float) -> list[SeriesTick]:
    ledger = open_ledger(target)
    written = [_tick(i, dt_s) for i in range(ticks)]
    for st in written:
        ledger.record_series(st)
    ledger.close()
    return written


def test_series_per_tick_and_rolled_up_read_back_alike(target):
    dt = 20.0
    written = _write(target, 360, dt)  # 2 hours of 20 s ticks
    newest = written[-1].t_s
    reader = open_reader(target)
    try:
        # A short range: every tick as written.
        got = reader.fleet_series(0.0, newest, newest)
        assert got["level"].level == 0 and got["t_s"].tolist() == [st.t_s for st in written]
        assert np.array_equal(got["rows"], np.stack([st.fleet for st in written]).astype(np.float64), equal_nan=True)
        cols = decode_fleet(got["rows"])
        assert cols["coolant"].shape == (360, LOOPS, 3) and cols["loop_state"][50].tolist() == [0, 1, 3]

        # Over 6 hours: per-minute rows (3 ticks each), then the ticks after the last closed minute.
        per_min = reader.fleet_series(0.0, 7 * 3600.0, newest)
        assert per_min["level"].width_s == 60.0
        mins = per_min["n"] > 1
        t_min, rows_min = per_min["t_s"][mins], decode_fleet(per_min["rows"][mins])
        assert t_min.tolist() == [60.0 * k for k in range(119)] and set(per_min["n"][mins]) == {3.0}
        assert per_min["t_s"][~mins].tolist() == [st.t_s for st in written if st.t_s >= 119 * 60]  # not closed yet
        for k, b in enumerate(t_min):
            inside = [st for st in written if b <= st.t_s < b + 60]
            raw = decode_fleet(np.stack([st.fleet for st in inside]))
            assert rows_min["coolant"][k] == pytest.approx(raw["coolant"].mean(axis=0), abs=1e-4)
            assert rows_min["loop_state"][k].tolist() == raw["loop_state"].max(axis=0).tolist()
            assert rows_min["gpu_counts"][k].tolist() == raw["gpu_counts"][-1].tolist()
            assert np.isnan(rows_min["useful_without"][k])
        assert rows_min["loop_state"][50 * 20 // 60, 2] == 3  # the quarantine tick survives the roll-up

        # Over 8 days: 15-minute rows (45 ticks each, rolled from the minutes), then minutes, then ticks.
        per_q = reader.fleet_series(0.0, 9 * 86400.0, newest)
        assert per_q["level"].width_s == 900.0
        q = per_q["n"] == 45
        assert per_q["t_s"][q].tolist() == [900.0 * k for k in range(7)] and set(per_q["n"][~q]) == {3.0, 1.0}
        first = decode_fleet(np.stack([st.fleet for st in written[:45]]))
        assert decode_fleet(per_q["rows"][:1])["coolant"][0] == pytest.approx(first["coolant"].mean(axis=0), abs=1e-4)
        assert np.all(np.diff(per_q["t_s"]) > 0) and per_q["t_s"][-1] == newest

        # The entity: its even ticks; per minute the worst GFS and the mean signal (NaN stays NaN).
        e = reader.entity_series("gpu", GPU, 0.0, newest, newest)
        assert e["t_s"].tolist() == [st.t_s for st in written if st.entities]
        e_min = reader.entity_series("gpu", GPU, 0.0, 7 * 3600.0, newest)
        m0 = e_min["t_s"] == 60.0  # ticks 3 and 4 recorded only tick 4
        assert e_min["n"][m0].tolist() == [1.0] and e_min["gfs"][m0].tolist() == [0.4]
        m1 = e_min["t_s"] == 120.0  # ticks 6 and 8
        assert e_min["gfs"][m1].tolist() == [0.8] and e_min["values"][m1][0, :2].tolist() == [7.0, 14.0]
        assert np.isnan(e_min["values"][:, 2]).all()
        assert reader.entity_series("gpu", "gpu000/gpu2", 0.0, newest, newest)["t_s"].size == 0
    finally:
        reader.close()


def test_each_level_keeps_its_days_and_a_read_goes_coarser_past_them(target):
    dt = 1200.0
    written = _write(target, 3 * 72, dt)  # 3 days of 20-minute ticks
    newest = written[-1].t_s
    reader = open_reader(target)
    try:
        raw = reader.fleet_series(newest - 3 * 3600.0, newest, newest)
        assert raw["level"].level == 0 and raw["t_s"].tolist() == [st.t_s for st in written if st.t_s >= newest - 3 * 3600]
        day1 = reader.fleet_series(0.0, 3 * 3600.0, newest)  # a short range, but older than a day
        assert day1["level"].level == 1 and day1["t_s"].tolist() == [st.t_s for st in written if st.t_s <= 3 * 3600]
        ledger = open_ledger(target)
        try:
            levels = dict(ledger.db.execute("SELECT level, MIN(t_s) FROM fleet_series GROUP BY level").fetchall())
        finally:
            ledger.close()
        # The last tick was written at 3 days: raw rows older than a day went, minute rows stay.
        assert levels[0] >= newest - LEVELS[0].keep_s and levels[1] == 0.0 and levels[2] == 0.0
    finally:
        reader.close()


def test_the_writer_counts_a_failure_and_a_drop_and_goes_on(tmp_path):
    path = tmp_path / "ledger.sqlite"
    opened = threading.Event()
    release = threading.Event()
    calls = []

    def open_slowly_then_fail_once():
        calls.append(1)
        if len(calls) == 1:
            opened.set()
            release.wait(10)
            raise OSError("disk on fire")
        return open_ledger(path)

    w = SeriesWriter(open_slowly_then_fail_once, queue_ticks=1)
    try:
        assert w.put(_tick(0, 5.0))
        assert opened.wait(10)
        assert w.put(_tick(1, 5.0))  # queued while the writer waits on its ledger
        assert not w.put(_tick(2, 5.0)) and w.dropped == 1  # the queue is full: dropped, not waited for
        release.set()
        assert w.flush(10)
        assert w.failed == 1 and "disk on fire" in w.last_error and w.written == 1
    finally:
        w.close()
    reader = open_reader(path)
    assert reader.fleet_series(0.0, 100.0, 100.0)["t_s"].tolist() == [5.0]
    reader.close()


def test_watched_keeps_the_not_healthy_then_the_grayest():
    gfs = {"gpu": np.array([0.1, 0.9, 0.25, np.nan, 0.05]), "node": np.array([0.0, 0.3])}
    state = {"gpu": np.array([0, 0, 0, 0, 5]), "node": np.array([3, 0])}
    assert watched(gfs, state, floor=0.2, limit=10) == [("gpu", 4), ("node", 0), ("gpu", 1), ("node", 1), ("gpu", 2)]
    assert watched(gfs, state, floor=0.2, limit=3) == [("gpu", 4), ("node", 0), ("gpu", 1)]
    assert N_STATES == 6 and watched({"gpu": np.zeros(3)}, {"gpu": np.zeros(3, dtype=int)}) == []
