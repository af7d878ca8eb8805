"""The gateway's record of key-state changes: who throttled, suspended or restored a key, why, on what evidence.

A ``gateway_events`` table in SQLite (WAL), beside the controller's ledger tables when it
shares their file. With the SQLite store it lives in the store's file; with Redis each
replica keeps its own file (the state itself is shared through Redis, the record of which
replica's detector or which operator changed it is local to that replica).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS gateway_events (
  id INTEGER PRIMARY KEY, wall_time REAL NOT NULL, key TEXT NOT NULL, tenant TEXT NOT NULL,
  from_state TEXT NOT NULL, to_state TEXT NOT NULL, reason TEXT NOT NULL, evidence TEXT NOT NULL,
  actor TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS gateway_events_key ON gateway_events(key, id);
"""


class GatewayLedger:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def record(self, wall_time: float, key: str, tenant: str, from_state: str, to_state: str, reason: str,
               evidence: dict[str, float], actor: str) -> None:
        self.db.execute("INSERT INTO gateway_events(wall_time, key, tenant, from_state, to_state, reason, evidence, "
                        "actor) VALUES(?,?,?,?,?,?,?,?)",
                        (wall_time, key, tenant, from_state, to_state, reason, json.dumps(evidence), actor))

    def events(self, key: str | None = None, limit: int = 100) -> list[dict]:
        q = "SELECT wall_time, key, tenant, from_state, to_state, reason, evidence, actor FROM gateway_events"
        args: list = []
        if key is not None:
            q += " WHERE key=?"
            args.append(key)
        q += " ORDER BY id DESC LIMIT ?"
        return [{"wall_s": r[0], "key": r[1], "tenant": r[2], "from": r[3], "to": r[4], "reason": r[5],
                 "evidence": json.loads(r[6]), "by": r[7]} for r in self.db.execute(q, [*args, limit])]

    def close(self) -> None:
        self.db.close()
