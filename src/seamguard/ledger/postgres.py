"""The durable record on PostgreSQL, shared by the replicas of an HA controller.

`ledger: postgresql://user@host/db` in a run config puts the ledger here instead of the
embedded SQLite file (ledger/sqlite.py stays the default for one machine). The tables,
the queries and the fencing are sqlite.py's: this module only translates the dialect
(``?`` placeholders to psycopg's ``%s``, SQLite's types to PostgreSQL's) and opens the
connection (psycopg 3, autocommit, so each write outside a transaction commits at once,
as SQLite's does).

Fencing (`Ledger.take_fence`) reads the fence row ``FOR UPDATE`` inside each write's
transaction: a new leader's takeover waits for a write in flight and every later write of
the old leader is refused, so the ledger's order of terms is the order of their writes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from seamguard.ledger.sqlite import FENCE_COLUMNS, SCHEMA, Ledger, LedgerError, PerThreadReads

URL_SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT_S = 10
# Every replica creates the schema at start; one at a time (concurrent CREATE TABLE IF NOT
# EXISTS can fail in PostgreSQL on the catalog's unique index).
_SCHEMA_LOCK_ID = 0x5EA3_6A2D


def is_postgres_url(target: object) -> bool:
    return isinstance(target, str) and urlsplit(target).scheme in URL_SCHEMES


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def pg_schema(sqlite_schema: str) -> str:
    """sqlite.py's schema in PostgreSQL's types: row ids from a sequence, 8-byte floats and
    integers, bytea for the snapshot blob."""
    s = re.sub(r"\bid INTEGER PRIMARY KEY,", "id BIGSERIAL PRIMARY KEY,", sqlite_schema)
    s = re.sub(r"\bREAL\b", "DOUBLE PRECISION", s)
    s = re.sub(r"\bBLOB\b", "BYTEA", s)
    return re.sub(r"\bINTEGER\b", "BIGINT", s)


def _placeholders(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgConnection:
    """The few calls the ledger makes of a sqlite3 connection, on a psycopg one."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(_placeholders(sql), tuple(params) if params else None)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(_placeholders(sql), rows)

    def close(self) -> None:
        self.conn.close()


def _connect(url: str, read_only: bool = False) -> _PgConnection:
    import psycopg  # imported here: only a PostgreSQL ledger needs it

    options = "-c default_transaction_read_only=on" if read_only else None
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                               application_name="seamguard", options=options)
    except psycopg.Error as e:
        raise LedgerError(f"{redact(url)}: cannot connect to the PostgreSQL ledger: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    return _PgConnection(conn)


class PgLedger(Ledger):
    """`Ledger` on PostgreSQL: same methods, same rows."""

    BEGIN = "BEGIN"
    FENCE_READ = "SELECT token, holder FROM fence WHERE id = 1 FOR UPDATE"

    def _connect(self) -> Any:
        import psycopg

        db = _connect(self.path)
        try:
            db.execute("BEGIN")
            db.execute("SELECT pg_advisory_xact_lock(%d)" % _SCHEMA_LOCK_ID)
            db.conn.execute(pg_schema(SCHEMA))
            for table, column in FENCE_COLUMNS:
                db.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} BIGINT")
            db.execute("COMMIT")
        except psycopg.Error as e:
            db.close()
            raise LedgerError(f"{self.where}: not a usable seamguard ledger (PostgreSQL: "
                              f"{str(e).strip().splitlines()[0]})") from None
        return db

    @property
    def where(self) -> str:
        return redact(self.path)


class PgLedgerReader(PerThreadReads):
    """The record, read-only, from any thread: one read-only connection per thread
    (`LedgerReader`'s contract, on PostgreSQL)."""

    def __init__(self, url: str) -> None:
        self.path = url
        super().__init__()

    def _open(self) -> Any:
        return _connect(self.path, read_only=True)
