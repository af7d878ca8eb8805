"""Read-only queries over the controller's SQLite ledger for the API.

The ledger is the durable record of transitions, decisions and actions; the API reads
it through its own read-only connection per thread (WAL lets readers run beside the
controller's writes) and bounds every query by the snapshot's tick, so a response
never shows a decision newer than the states it is shown with.
"""

from __future__ import annotations

import json
import sqlite3
import threading


class LedgerReader:
    def __init__(self, path: str, timeout_s: float = 5.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self.timeout_s,
                                 check_same_thread=False)
            self._local.db = db
        return db

    def transitions(self, upto_tick: int, entity: str | None = None, kind: str | None = None,
                    non_healthy_only: bool = False, limit: int = 100, offset: int = 0) -> list[dict]:
        """Newest first."""
        q = ("SELECT tick, t_s, kind, entity, from_state, to_state, gfs, prs, fae, reasons FROM transitions "
             "WHERE tick <= ?")
        args: list = [upto_tick]
        if entity is not None:
            q += " AND entity = ?"
            args.append(entity)
        if kind is not None:
            q += " AND kind = ?"
            args.append(kind)
        if non_healthy_only:
            q += " AND (to_state != 'healthy' OR from_state != 'healthy')"
        q += " ORDER BY id DESC LIMIT ? OFFSET ?"
        args += [limit, offset]
        out = []
        for r in self._db().execute(q, args):
            out.append({"tick": r[0], "t_s": r[1], "kind": r[2], "entity": r[3], "from_state": r[4],
                        "to_state": r[5], "gfs": r[6], "prs": r[7], "fae": r[8],
                        "reasons": [{"channel": c, "score": s, "value": _num(v), "unit": u}
                                    for c, s, v, u in json.loads(r[9] or "[]")]})
        return out

    def decisions(self, upto_tick: int, entity: str | None = None, event: str | None = None,
                  limit: int = 100, offset: int = 0) -> list[dict]:
        q = ("SELECT tick, t_s, key, event, verb, target, reason, cause, evidence, benefit, cost, criticality "
             "FROM decisions WHERE tick <= ?")
        args: list = [upto_tick]
        if entity is not None:
            q += " AND (target = ? OR cause = ?)"
            args += [entity, entity]
        if event is not None:
            q += " AND event = ?"
            args.append(event)
        q += " ORDER BY id DESC LIMIT ? OFFSET ?"
        args += [limit, offset]
        return [{"tick": r[0], "t_s": r[1], "key": r[2], "event": r[3], "verb": r[4], "target": r[5],
                 "reason": r[6] or "", "cause": r[7] or "",
                 "evidence": [{"channel": c, "score": s, "value": _num(v), "unit": u}
                              for c, s, v, u in json.loads(r[8] or "[]")],
                 "benefit_gpu_h_per_h": r[9], "cost_gpu_h_per_h": r[10], "criticality": r[11]}
                for r in self._db().execute(q, args)]

    def actions(self, upto_tick: int, entity: str | None = None, status: str | None = None,
                limit: int = 100, offset: int = 0) -> list[dict]:
        """Actions joined with the reason of the decision that asked for them."""
        q = ("SELECT a.tick, a.t_s, a.op, a.key, a.verb, a.actuator, a.status, a.detail, d.target, d.reason, d.cause "
             "FROM actions a LEFT JOIN (SELECT key, target, reason, cause, MAX(id) FROM decisions "
             "WHERE event = 'decided' GROUP BY key) d ON d.key = a.key WHERE a.tick <= ?")
        args: list = [upto_tick]
        if entity is not None:
            q += " AND (d.target = ? OR d.cause = ?)"
            args += [entity, entity]
        if status is not None:
            q += " AND a.status = ?"
            args.append(status)
        q += " ORDER BY a.id DESC LIMIT ? OFFSET ?"
        args += [limit, offset]
        return [{"tick": r[0], "t_s": r[1], "op": r[2], "key": r[3], "verb": r[4], "actuator": r[5],
                 "status": r[6], "detail": r[7] or "",
                 "target": r[8] or r[3].split(":", 1)[-1].split("@")[0],
                 "reason": r[9] or "", "cause": r[10] or ""}
                for r in self._db().execute(q, args)]


def _num(v: object) -> float | None:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if f != f or f in (float("inf"), float("-inf")) else f
