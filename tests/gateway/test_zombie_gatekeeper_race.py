"""The gatekeeper and the zombie detector under concurrent admissions: one departure, one step.

A throttle's write to the store takes time; admissions that read the key's record while it was in
flight read "ok", and adopting that reset the detector, which then stepped the key again on the next
request: repeated ok -> throttled steps in the ledger (no budget effect, but a ledger and an alert
that say the key was throttled five times).
"""

from __future__ import annotations

import asyncio

from seamguard.gateway.config import parse_gateway_config
from seamguard.gateway.gatekeeper import Gatekeeper, Refusal
from seamguard.gateway.ledger import GatewayLedger
from seamguard.gateway.metrics import GatewayMetrics
from seamguard.gateway.store import KeyRecord, SqliteStore
from tests.gateway.conftest import base_config
from tests.gateway.test_zombie import HOME, office_hours


class SlowWrites(SqliteStore):
    """A store whose key-state writes take a while (a remote Redis, a busy SQLite)."""

    async def set_key_record(self, key: str, rec: KeyRecord) -> None:
        await asyncio.sleep(0.05)
        await super().set_key_record(key, rec)


def test_concurrent_admissions_during_a_throttle_s_write_step_the_key_once():
    cfg = parse_gateway_config(base_config("http://127.0.0.1:9", {"type": "sqlite", "path": ":memory:"}), "t")
    now = [0.0]
    gk = Gatekeeper(cfg, SlowWrites(":memory:"), GatewayLedger(":memory:"), GatewayMetrics(), clock=lambda: now[0])
    now[0] = office_hours(gk.detector, key="b", source=HOME)  # its peak minute: 1,800 tokens
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 496}

    async def one(i: int) -> None:
        try:
            await gk.admit(gk.keys["b"], body, str(i).encode(), HOME)
        except Refusal:
            pass

    async def burst() -> None:
        for wave in range(5):  # 5 waves of 40 concurrent requests: 20x its peak within the minute
            now[0] += 1.0
            await asyncio.gather(*(one(wave * 40 + i) for i in range(40)))

    asyncio.run(burst())
    steps = [(e["from"], e["to"]) for e in reversed(gk.ledger.events(key="b", limit=100))]
    assert steps == [("ok", "throttled")], steps
