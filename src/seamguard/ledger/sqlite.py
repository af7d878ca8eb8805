"""The durable record: SQLite in WAL mode.

Transitions with their evidence, decisions with their reasons, actions with their
results, and the controller's own state (assessment state vectors, breaker, exposure
episodes) so a controller killed mid-tick resumes without repeating or losing actions.
"""

from __future__ import annotations

import io
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ticks (
  tick INTEGER PRIMARY KEY, t_s REAL NOT NULL, wall_started REAL, wall_finished REAL,
  tick_s REAL, mode TEXT, flags TEXT);
CREATE TABLE IF NOT EXISTS transitions (
  id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, kind TEXT, entity TEXT,
  from_state TEXT, to_state TEXT, gfs REAL, prs REAL, fae REAL, reasons TEXT);
CREATE INDEX IF NOT EXISTS transitions_entity ON transitions(entity, t_s);
CREATE TABLE IF NOT EXISTS decisions (
  id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, key TEXT, event TEXT, verb TEXT, target TEXT,
  reason TEXT, cause TEXT, evidence TEXT, benefit REAL, cost REAL, criticality REAL);
CREATE INDEX IF NOT EXISTS decisions_key ON decisions(key);
CREATE TABLE IF NOT EXISTS desired (key TEXT PRIMARY KEY, since_tick INTEGER, action TEXT);
CREATE TABLE IF NOT EXISTS actions (
  id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, op TEXT, key TEXT, verb TEXT, actuator TEXT,
  status TEXT, detail TEXT, wall_time REAL);
CREATE INDEX IF NOT EXISTS actions_key ON actions(key, op);
CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), tick INTEGER, blob BLOB);
"""


def _action_json(a) -> str:
    return json.dumps({"key": a.key, "verb": a.verb.value, "target": a.target, "target_kind": a.target_kind,
                       "params": dict(a.params), "reason": a.reason, "cause": a.cause,
                       "benefit": a.benefit_gpu_h_per_h, "cost": a.cost_gpu_h_per_h})


class Ledger:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ---- meta / controller state ------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                        (key, json.dumps(value)))

    def last_tick(self) -> int:
        row = self.db.execute("SELECT MAX(tick) FROM ticks WHERE wall_finished IS NOT NULL").fetchone()
        return int(row[0]) if row and row[0] is not None else -1

    def save_snapshot(self, tick: int, arrays: dict[str, np.ndarray]) -> None:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        self.db.execute("INSERT INTO snapshot(id, tick, blob) VALUES(1, ?, ?) "
                        "ON CONFLICT(id) DO UPDATE SET tick=excluded.tick, blob=excluded.blob",
                        (tick, buf.getvalue()))

    def load_snapshot(self) -> tuple[int, dict[str, np.ndarray]] | None:
        row = self.db.execute("SELECT tick, blob FROM snapshot WHERE id=1").fetchone()
        if not row:
            return None
        with np.load(io.BytesIO(row[1])) as z:
            return int(row[0]), {k: z[k] for k in z.files}

    # ---- one tick -----------------------------------------------------------------
    def begin_tick(self, tick: int, t_s: float, mode: str, flags: tuple[str, ...]) -> None:
        self.db.execute("INSERT OR REPLACE INTO ticks(tick, t_s, wall_started, mode, flags) VALUES(?,?,?,?,?)",
                        (tick, t_s, time.time(), mode, json.dumps(list(flags))))

    def finish_tick(self, tick: int, tick_s: float) -> None:
        self.db.execute("UPDATE ticks SET wall_finished=?, tick_s=? WHERE tick=?", (time.time(), tick_s, tick))

    def record_transitions(self, tick: int, transitions) -> None:
        self.db.executemany(
            "INSERT INTO transitions(tick, t_s, kind, entity, from_state, to_state, gfs, prs, fae, reasons) "
            "VALUES(?,?,?,?,?,?,?,?,?,?)",
            [(tick, tr.t_s, tr.kind.label, tr.entity, tr.from_state.label, tr.to_state.label, tr.gfs, tr.prs, tr.fae,
              json.dumps([[r.channel, r.score, r.value, r.unit] for r in tr.reasons])) for tr in transitions])

    def record_decisions(self, tick: int, t_s: float, desired: dict, held: list) -> list[tuple[str, str]]:
        """Record keys that entered or left the desired state; returns (event, key) pairs."""
        before = {k for (k,) in self.db.execute("SELECT key FROM desired")}
        events: list[tuple[str, str]] = []
        rows = []
        for k, a in desired.items():
            if k not in before:
                events.append(("decided", k))
                rows.append((tick, t_s, k, "decided", a.verb.value, a.target, a.reason, a.cause,
                             json.dumps(a.evidence), a.benefit_gpu_h_per_h, a.cost_gpu_h_per_h, a.criticality))
                self.db.execute("INSERT INTO desired(key, since_tick, action) VALUES(?,?,?)", (k, tick, _action_json(a)))
        for k in before - set(desired):
            events.append(("withdrawn", k))
            rows.append((tick, t_s, k, "withdrawn", k.split(":", 1)[0], k.split(":", 1)[1].split("@")[0],
                         "no longer desired", "", "[]", 0.0, 0.0, 0.0))
            self.db.execute("DELETE FROM desired WHERE key=?", (k,))
        for a in held:
            rows.append((tick, t_s, a.key, "held_by_breaker", a.verb.value, a.target, a.reason, a.cause,
                         json.dumps(a.evidence), a.benefit_gpu_h_per_h, a.cost_gpu_h_per_h, a.criticality))
        self.db.executemany(
            "INSERT INTO decisions(tick, t_s, key, event, verb, target, reason, cause, evidence, benefit, cost, "
            "criticality) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        return events

    def begin_action(self, tick: int, t_s: float, op: str, key: str, verb: str, actuator: str) -> None:
        self.db.execute("INSERT INTO actions(tick, t_s, op, key, verb, actuator, status, wall_time) "
                        "VALUES(?,?,?,?,?,?, 'pending', ?)", (tick, t_s, op, key, verb, actuator, time.time()))

    def finish_action(self, key: str, op: str, status: str, detail: str) -> None:
        self.db.execute("UPDATE actions SET status=?, detail=? WHERE id = (SELECT MAX(id) FROM actions "
                        "WHERE key=? AND op=? AND status='pending')", (status, detail, key, op))

    def record_dry_run(self, tick: int, t_s: float, op: str, key: str, verb: str, actuator: str) -> None:
        self.db.execute("INSERT INTO actions(tick, t_s, op, key, verb, actuator, status, detail, wall_time) "
                        "VALUES(?,?,?,?,?,?, 'dry_run', 'not applied', ?)", (tick, t_s, op, key, verb, actuator,
                                                                            time.time()))

    def done_keys(self) -> set[str]:
        return {k for (k,) in self.db.execute("SELECT DISTINCT key FROM actions WHERE op='apply' AND status='done'")}

    def settle_pending(self, actual: set[str]) -> int:
        """After a restart: pending actions the world shows as done are closed as done."""
        rows = self.db.execute("SELECT id, key, op FROM actions WHERE status='pending'").fetchall()
        for rid, key, op in rows:
            took = (key in actual) if op == "apply" else (key not in actual)
            self.db.execute("UPDATE actions SET status=?, detail=? WHERE id=?",
                            ("done" if took else "interrupted",
                             "settled after restart from actual state" if took else
                             "controller stopped before the actuator call completed", rid))
        return len(rows)

    # ---- queries ------------------------------------------------------------------------
    def transitions(self, entity: str | None = None, limit: int = 1000) -> list[dict]:
        q = "SELECT tick, t_s, kind, entity, from_state, to_state, gfs, prs, fae, reasons FROM transitions"
        args: tuple = ()
        if entity is not None:
            q += " WHERE entity=?"
            args = (entity,)
        q += " ORDER BY id DESC LIMIT ?"
        cols = ("tick", "t_s", "kind", "entity", "from", "to", "gfs", "prs", "fae", "reasons")
        return [dict(zip(cols, r[:-1] + (json.loads(r[-1]),)))
                for r in self.db.execute(q, args + (limit,))][::-1]

    def actions(self, limit: int = 1000) -> list[dict]:
        cols = ("tick", "t_s", "op", "key", "verb", "actuator", "status", "detail")
        return [dict(zip(cols, r)) for r in self.db.execute(
            "SELECT tick, t_s, op, key, verb, actuator, status, detail FROM actions ORDER BY id DESC LIMIT ?",
            (limit,))][::-1]

    def decisions(self, limit: int = 1000) -> list[dict]:
        cols = ("tick", "t_s", "key", "event", "verb", "target", "reason", "cause", "benefit", "cost")
        return [dict(zip(cols, r)) for r in self.db.execute(
            "SELECT tick, t_s, key, event, verb, target, reason, cause, benefit, cost FROM decisions "
            "ORDER BY id DESC LIMIT ?", (limit,))][::-1]
