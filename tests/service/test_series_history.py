"""The dashboard's series after a restart and over a week: served from the ledger.

Controller A ticks a 512-GPU twin 150 times holding only its last 60 fleet points and 40
ring rows in memory, and stops. Controller B opens the same ledger on the same fleet (its
twin advanced past A's ticks, as a fleet keeps running) and ticks 5 times. B's service
must still chart A's whole run: coolant, useful throughput, a gray GPU's GFS and signals,
equal to what A held. A week of persisted ticks comes back rolled up to the points asked.
"""

from __future__ import annotations

from dataclasses import replace

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from seamguard.app.runner import Runner
from seamguard.app.service import render
from seamguard.app.service.metrics import make_registry
from seamguard.app.service.metrics import render as render_metrics
from seamguard.app.service.server import Server
from seamguard.app.service.timerange import TimeRange
from seamguard.app.signal_ring import score_row
from seamguard.app.sources import TwinSource
from seamguard.fleet.model import Kind
from seamguard.ledger import open_ledger, open_reader
from seamguard.ledger.series import SeriesTick, encode_fleet
from seamguard.observe.signals import signals_for

from .conftest import TOKEN

TICKS_A, TICKS_B = 150, 5
SHORT = dict(throughput_points=60, ring_depth=40)  # memory holds less than A's run


def _twin() -> TwinSource:
    return TwinSource(gpus=512, minutes=30.0, seed=0)


def restart(path, ticks_a: int, ticks_b: int):
    """A ticks ``ticks_a`` times and stops; B opens the same ledger on a twin advanced past A's
    ticks (the fleet kept running) and ticks ``ticks_b`` times. (A's last snapshot, A's ring, B)."""
    a = Runner(_twin(), speed=0, ledger_path=path, **SHORT)
    a.advance(ticks_a)
    before, ring_a = a.snapshot(), a.ring
    a.close()  # writes what is queued, then stops
    source = _twin()
    for _ in range(ticks_a):
        source.next_frame(0.0)
    b = Runner(source, speed=0, ledger_path=path, **SHORT)
    b.advance(ticks_b)
    return before, ring_a, b


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    before, ring_a, b = restart(tmp_path_factory.mktemp("series") / "ledger.sqlite", TICKS_A, TICKS_B)
    assert b.series.flush(30)
    b.start()
    server = Server(b, TOKEN).start()
    with httpx.Client(base_url=server.url, timeout=30.0) as http:
        yield before, ring_a, b, http
    server.stop()
    b.stop()


def test_a_restarted_controller_charts_the_whole_run_from_the_ledger(restarted):
    before, _, b, http = restarted
    s = b.snapshot()
    assert len(s.fleet_history) == TICKS_B  # B's memory: its own ticks only
    ticks = [t for (t,) in b.ledger.db.execute("SELECT t_s FROM ticks ORDER BY tick")]
    assert len(ticks) == TICKS_A + TICKS_B
    h = http.get(f"/api/v1/history/fleet?since=0&until={s.t_s}&points=2000").json()
    assert h["t_s"] == ticks  # every tick of A, then B's
    assert h["persisted"]["until_t_s"] == s.fleet_history[0].t_s == h["held_since_t_s"]
    assert h["persisted"]["resolution_s"] == 0.0
    k = {t: j for j, t in enumerate(h["t_s"])}
    useful = {p.t_s: p for p in before.throughput}
    for p in before.fleet_history:  # what A held in memory is what B serves from the ledger
        j = k[p.t_s]
        for i, lp in enumerate(h["loops"]):
            assert lp["flow_lpm"][j] == pytest.approx(float(p.coolant[i, 0]), abs=1e-3)
            assert lp["supply_c"][j] == pytest.approx(float(p.coolant[i, 1]), abs=1e-3)
        assert h["useful_with"][j] == pytest.approx(useful[p.t_s].useful_with, abs=1e-5)
        assert [h["states"][0]["counts"][x][j] for x in h["state_codes"]] == list(p.gpu_counts)
    empty = http.get(f"/api/v1/history/fleet?since={s.t_s + 10}&until={s.t_s + 20}")  # nothing there yet
    assert empty.status_code == 200 and empty.json()["t_s"] == [] and empty.json()["useful_with"] == []


def test_a_gray_gpus_signals_outlive_the_restart(restarted):
    before, ring_a, b, http = restarted
    g = before.kinds[Kind.GPU]
    i = int(np.argmax(np.where(g.state != 0, np.nan_to_num(g.gfs) + 1, np.nan_to_num(g.gfs))))
    name = g.names[i]
    assert g.state[i] != 0  # the scenario has gray GPUs by then
    t_a, gfs_a = ring_a.series(score_row("gpu"), i, before.ring_upto)
    d = http.get(f"/api/v1/entities/gpu/{name}?since=0&until={b.snapshot().t_s}&points=2000").json()
    assert d["persisted"] is not None and d["persisted"]["until_t_s"] == b.snapshot().fleet_history[0].t_s
    got = dict(zip(d["gfs_series"]["t_s"], d["gfs_series"]["values"]))
    assert all(t in got for t in t_a) and min(got) < t_a[0]  # A's last ring rows and older ones
    assert [got[t] for t in t_a] == pytest.approx(gfs_a, abs=1e-4)
    for j, sig in enumerate(signals_for(Kind.GPU)[:6]):
        t_sig, v_sig = ring_a.series(sig.name, i, before.ring_upto)
        served = dict(zip(d["signals"][j]["t_s"], d["signals"][j]["values"]))
        assert d["signals"][j]["name"] == sig.name
        for t, v in zip(t_sig, v_sig):
            assert served[t] == (None if v is None else pytest.approx(v, rel=1e-4, abs=1e-4)), (sig.name, t)


def test_a_week_comes_back_rolled_up_to_the_points_asked(tmp_path):
    """7 days of 30 s ticks (20,160) persisted; a controller restarted with nothing in memory."""
    path = tmp_path / "ledger.sqlite"
    r = Runner(TwinSource(gpus=64, minutes=2.0, seed=1), speed=0, ledger_path=tmp_path / "runner.sqlite")
    r.advance(1)  # a snapshot of this fleet; its time and memory are replaced below
    loops = r.snapshot().fleet.count(Kind.COOLING_LOOP)
    week, dt = 7 * 86400.0, 30.0
    ts = np.arange(dt, week + dt / 2, dt)
    flow = 100.0 + (ts // 3600) % 24  # hourly steps
    rows = [encode_fleet([64, 0, 0, 0, 0, 0], [16, 0, 0, 0, 0, 0], 0.9, None, np.zeros(loops),
                         np.tile([[f, 20.0, 30.0]], (loops, 1))) for f in flow]
    ledger = open_ledger(path)
    ledger.db.executemany("INSERT INTO fleet_series(level, t_s, tick, wall_time, n, vec) VALUES(0,?,?,?,1,?)",
                          [(float(t), k, 0.0, v.tobytes()) for k, (t, v) in enumerate(zip(ts[:-1], rows))])
    ledger.record_series(SeriesTick(len(ts), float(ts[-1]), 0.0, rows[-1]))  # rolls up 7 days at once
    ledger.close()
    snap = replace(r.snapshot(), t_s=float(ts[-1]), fleet_history=(), throughput=())
    reader = open_reader(path)
    try:
        for points in (360, 2000):
            h = render.fleet_history(snap, points, None, None, TimeRange(0.0, week), reader)
            assert len(h.t_s) <= points and h.t_s[-1] == ts[-1] and h.persisted.resolution_s == 60.0
            assert len(h.t_s) > points * 0.9  # the week is dense: nearly every span has a point
            # Each point: the mean of the ticks its span holds (minute rows weigh their ticks).
            closed = np.floor(ts[-1] / 60) * 60
            at = np.where(np.floor(ts / 60) * 60 < closed, np.floor(ts / 60) * 60, ts)
            prev = -1.0
            for t, v in zip(h.t_s, h.loops[0].flow_lpm):
                inside = (at > prev) & (at <= t)
                assert v == pytest.approx(flow[inside].mean(), abs=1e-3), t
                prev = t
    finally:
        reader.close()
        r.close()


def test_a_failing_series_write_never_breaks_the_tick(tmp_path):
    r = Runner(TwinSource(gpus=64, minutes=2.0, seed=1), speed=0, ledger_path=tmp_path / "ledger.sqlite")

    def broken():
        raise OSError("no space left on device")

    r.series._open = broken
    try:
        r.advance(3)
        assert r.snapshot().tick == 2 and r.snapshot().tick_error == ""
        assert r.series.flush(10) and r.series.failed == 3 and "no space" in r.series.last_error
        assert r.ledger.last_tick() == 2  # the controller's own record goes on
        # ... and an operator sees the lost history on /metrics
        fams = {f.name: f for f in text_string_to_metric_families(
            render_metrics(make_registry(r.snapshot, None, r.series)).decode())}
        assert fams["seamguard_series_write_failures"].samples[0].value == 3
        assert fams["seamguard_series_ticks_written"].samples[0].value == 0
    finally:
        r.close()
