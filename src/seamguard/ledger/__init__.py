"""The durable record of transitions, decisions, actions and controller state.

Embedded SQLite by default (one controller, one machine); PostgreSQL when the ledger is a
``postgresql://`` URL (the replicas of an HA controller share it). `open_ledger` and
`open_reader` pick the backend from the target.
"""

from __future__ import annotations

from pathlib import Path

from seamguard.ledger.postgres import PgLedger, PgLedgerReader, is_postgres_url
from seamguard.ledger.sqlite import Fence, Fenced, Ledger, LedgerError, LedgerReader


def open_ledger(target: str | Path) -> Ledger:
    """The writer for a SQLite path or a PostgreSQL URL."""
    return PgLedger(str(target)) if is_postgres_url(target) else Ledger(target)


def open_reader(target: str | Path) -> LedgerReader | PgLedgerReader:
    """A read-only reader (one connection per thread) for a SQLite path or a PostgreSQL URL."""
    return PgLedgerReader(str(target)) if is_postgres_url(target) else LedgerReader(target)


__all__ = ["Fence", "Fenced", "Ledger", "LedgerError", "LedgerReader", "PgLedger", "PgLedgerReader",
           "is_postgres_url", "open_ledger", "open_reader"]
