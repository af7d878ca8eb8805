"""Servers the HA tests share: one PostgreSQL (Debian's package, as an unprivileged user) and
one etcd per session; each test gets its own database and etcd key prefix."""

from __future__ import annotations

import itertools

import pytest

from seamguard.testbed.multinode import EtcdServer
from seamguard.testbed.postgres_server import PostgresServer

_db_numbers = itertools.count()


@pytest.fixture(scope="session")
def postgres():
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    with EtcdServer.loopback(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def pg_url(postgres) -> str:
    """A fresh, empty PostgreSQL database."""
    return postgres.create_database(f"ledger_{next(_db_numbers)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_target(request, tmp_path) -> str:
    """The same ledger tests on both backends: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return request.getfixturevalue("pg_url")
