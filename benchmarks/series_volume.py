"""How many bytes the ledger's persisted dashboard series take (ledger/series.py).

Ticks a twin fleet through a served runner's own writer, then reads SQLite's page
accounting (``dbstat``, tables and their indexes) for the series tables: bytes per fleet
row and per entity row as stored, and from them bytes per day at a tick interval and the
steady-state size under the retention rule (per tick for a day, per minute for 8 days, per
15 minutes for 35 days). The 30-minute twin scenario fails a cooling loop, so half the
GPUs are gray and the per-tick entity cap (32) is reached: the entity figure is the
worst case. Then the read side: a week of 5 s ticks (120,960 fleet rows, bulk-written
and rolled up as a restarted writer does) read back for the dashboard's 6 h, 24 h and
7 day ranges at 360 points, with nothing in memory (the cost of a restarted service's
coolant panel). Prints one JSON line.

    python benchmarks/series_volume.py            # 512 and 4,096 GPUs, 240 ticks each
    python benchmarks/series_volume.py --quick    # 512 GPUs, 120 ticks
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from seamguard.app.runner import Runner
from seamguard.app.service import render
from seamguard.app.service.timerange import TimeRange
from seamguard.app.sources import TwinSource
from seamguard.fleet.model import Kind
from seamguard.ledger import open_ledger, open_reader
from seamguard.ledger.series import LEVELS, WATCH_MAX, SeriesTick, encode_fleet

DAY_S = 86400.0


def _table_bytes(path: Path, table: str) -> tuple[int, int, int]:
    """(bytes of the table and its indexes, its rows, its rows at level 0: one per tick and entity)."""
    db = sqlite3.connect(path)
    try:
        pages = db.execute("SELECT SUM(pgsize - unused) FROM dbstat WHERE name = ? OR name IN "
                           "(SELECT name FROM sqlite_schema WHERE tbl_name = ? AND type = 'index') "
                           "OR name = 'sqlite_autoindex_' || ? || '_1'", (table, table, table)).fetchone()[0]
        rows = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        raw = db.execute(f"SELECT COUNT(*) FROM {table} WHERE level = 0").fetchone()[0]
    finally:
        db.close()
    return int(pages or 0), int(rows), int(raw)


def measure(gpus: int, ticks: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ledger.sqlite"
        r = Runner(TwinSource(gpus=gpus, minutes=30.0, seed=0), speed=0, ledger_path=path)
        try:
            r.advance(ticks)
            assert r.series.flush(60), "the series writer did not finish"
            loops = r.snapshot().fleet.count(Kind.COOLING_LOOP)
            written, failed = r.series.written, r.series.failed
        finally:
            r.close()
        fleet_b, fleet_rows, _ = _table_bytes(path, "fleet_series")
        ent_b, ent_rows, ent_raw = _table_bytes(path, "entity_series")
    per_fleet, per_ent = fleet_b / fleet_rows, ent_b / max(ent_rows, 1)
    ents_per_tick = ent_raw / ticks

    def per_day(tick_s: float) -> float:
        return DAY_S / tick_s * (per_fleet + ents_per_tick * per_ent)

    def steady(tick_s: float) -> float:
        rows = [(lv.keep_s / (tick_s if not lv.width_s else lv.width_s)) for lv in LEVELS]
        return sum(rows) * per_fleet + sum(rows) * WATCH_MAX * per_ent

    return {"gpus": gpus, "loops": loops, "ticks": ticks, "written": written, "failed": failed,
            "fleet_row_bytes": round(per_fleet, 1), "entity_row_bytes": round(per_ent, 1),
            "entity_rows_per_tick": round(ents_per_tick, 1),
            "mb_per_day_5s_tick": round(per_day(5.0) / 1e6, 1), "mb_per_day_15s_tick": round(per_day(15.0) / 1e6, 1),
            "steady_mb_worst_15s_tick": round(steady(15.0) / 1e6, 1),
            "steady_mb_worst_5s_tick": round(steady(5.0) / 1e6, 1)}


def read_week(gpus: int, tick_s: float = 5.0, repeat: int = 5) -> dict:
    """Milliseconds to serve /history/fleet's 6 h, 24 h and 7 d ranges from a week in the ledger."""
    with tempfile.TemporaryDirectory() as d:
        r = Runner(TwinSource(gpus=gpus, minutes=2.0, seed=1), speed=0, ledger_path=Path(d) / "runner.sqlite")
        try:
            r.advance(1)
            loops = r.snapshot().fleet.count(Kind.COOLING_LOOP)
            ts = np.arange(tick_s, 7 * DAY_S + tick_s / 2, tick_s)
            vecs = [encode_fleet([gpus, 0, 0, 0, 0, 0], [gpus // 8, 0, 0, 0, 0, 0], 0.9, None, np.zeros(loops),
                                 np.tile([[100.0 + (t // 3600) % 24, 20.0, 30.0]], (loops, 1))) for t in ts]
            ledger = open_ledger(Path(d) / "week.sqlite")
            ledger.db.executemany("INSERT INTO fleet_series(level, t_s, tick, wall_time, n, vec) VALUES(0,?,?,?,1,?)",
                                  [(float(t), k, 0.0, v.tobytes()) for k, (t, v) in enumerate(zip(ts[:-1], vecs))])
            ledger.record_series(SeriesTick(len(ts), float(ts[-1]), 0.0, vecs[-1]))
            ledger.close()
            snap = replace(r.snapshot(), t_s=float(ts[-1]), fleet_history=(), throughput=())
            reader = open_reader(Path(d) / "week.sqlite")
            out = {}
            for name, span in (("6h", 6 * 3600.0), ("24h", DAY_S), ("7d", 7 * DAY_S)):
                rng = TimeRange(ts[-1] - span, ts[-1])
                render.fleet_history(snap, 360, None, None, rng, reader)
                t0 = time.perf_counter()
                for _ in range(repeat):
                    h = render.fleet_history(snap, 360, None, None, rng, reader)
                out[name] = {"ms": round((time.perf_counter() - t0) / repeat * 1e3, 1), "points": len(h.t_s),
                             "resolution_s": h.persisted.resolution_s}
            reader.close()
        finally:
            r.close()
    return {"gpus": gpus, "loops": loops, "tick_s": tick_s, "reads": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="512 GPUs, 120 ticks")
    a = ap.parse_args()
    runs = [(512, 120)] if a.quick else [(512, 240), (4096, 240)]
    print(json.dumps({"series_volume": [measure(g, t) for g, t in runs],
                      "week_read": read_week(runs[-1][0])}))


if __name__ == "__main__":
    main()
