"""Shared fixtures: a served controller on a small twin, ticked by hand so tests know
exactly which simulated minute they look at, behind a real HTTP server on loopback."""

from __future__ import annotations

import pytest

from seamguard.fleet.model import Kind
from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.sources import TwinSource
from seamguard.twin.faults import FaultKind

TOKEN = "test-token-0123456789"


def fault_entity(source: TwinSource, kind: FaultKind) -> str:
    spec = next(f for f in source.faults if f.kind == kind)
    return source.fleet.names(spec.entity_kind)[spec.index]


@pytest.fixture(scope="module")
def runner():
    """512 GPUs, a 6-minute fault scenario, advanced 70 ticks (350 simulated seconds)."""
    r = Runner(TwinSource(gpus=512, minutes=6.0, seed=0), speed=0)
    r.advance(70)
    r.start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def server(runner):
    s = Server(runner, TOKEN).start()
    yield s
    s.stop()


@pytest.fixture()
def auth():
    return {"Authorization": f"Bearer {TOKEN}"}


__all__ = ["Kind", "TOKEN", "fault_entity"]
