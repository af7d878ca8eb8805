"""One SQLite connection on one thread of its own, so the gateway's event loop never waits on SQLite.

The gateway's SQLite files (the single-replica store, each replica's ledger) are local disk,
but a lock held by another process (a backup, an operator's `sqlite3` shell, a second
gateway on the same file) used to block the event loop for the whole busy timeout, one
request after the other. Here every statement runs on the connection's own thread, in the
order it was submitted (a transaction is one submitted function, so two never interleave),
with a short busy timeout; and a job queued while the one ahead of it found the file locked
fails at once instead of stacking another wait (a queue that is only long, with no lock,
waits its turn). The caller awaits `run` and
gets the function's result, or `sqlite3.OperationalError` naming the file.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
BUSY_TIMEOUT_S = 0.5  # a write lock held longer than this by another process: the caller is refused
SQLITE_BUSY, SQLITE_LOCKED = 5, 6  # primary result codes


class SqliteThread:
    def __init__(self, path: str | Path, busy_timeout_s: float = BUSY_TIMEOUT_S, name: str = "gateway-sqlite") -> None:
        self.path = str(path)
        self.busy_timeout_s = busy_timeout_s
        self._ex = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._busy_at = -1.0  # when a job last found the file locked (monotonic; written on the thread)
        self.db: sqlite3.Connection = self._ex.submit(self._open).result()

    def _open(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _call(self, queued_at: float | None, fn: Callable[..., T], args: tuple) -> T:
        if queued_at is not None and self._busy_at >= queued_at:
            # a job ahead of it hit a lock while it waited in line: do not add another wait
            raise sqlite3.OperationalError(f"database is locked (a job ahead of this one waited "
                                           f"{self.busy_timeout_s:g} s for it)")
        try:
            return fn(self.db, *args)
        except sqlite3.Error as e:
            if (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED):
                self._busy_at = time.monotonic()
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    async def run(self, fn: Callable[..., T], *args: object, patient: bool = False) -> T:
        """``fn(db, *args)`` on the connection's thread; the awaiting coroutine never blocks. ``patient``:
        run it even after a wait in line (giving tokens back is never refused for being late)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._ex, self._call, None if patient else time.monotonic(), fn, args)

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """The same from synchronous code (startup, admin reads, close); waits at most its own busy timeout
        plus the jobs ahead of it."""
        return self._ex.submit(self._call, time.monotonic(), fn, args).result()

    def close(self) -> None:
        try:
            self._ex.submit(self.db.close).result()
        finally:
            self._ex.shutdown(wait=True)


def write_probe(db: sqlite3.Connection) -> None:
    """Take the write lock and give it back: raises while another connection holds it."""
    db.execute("BEGIN IMMEDIATE")
    db.execute("ROLLBACK")
