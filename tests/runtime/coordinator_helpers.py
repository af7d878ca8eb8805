"""Shared set-up of coordinator tests that need a job already running."""

from __future__ import annotations

import json

from seamguard.runtime import keys


def run_first_generation(c, writer, workers: list[int]) -> None:
    """Drive coordinator ``c`` to a running job: every worker of ``workers`` registers,
    generation 0 is planned, its ranks report no state, resume fresh and recover. ``writer``
    is the store handle the workers' writes go through."""
    for w in workers:
        writer.set(keys.worker_addr(w), "h:1")
    c.tick()
    for w in c.plan.ranks:
        writer.set(keys.have(0, w), json.dumps({"own": [], "replicas": {}}))
    c.tick()
    for w in c.plan.ranks:
        writer.set(keys.recovered(0, w), json.dumps({"ok": True, "checksum": "ab", "step": 0}))
    c.tick()
    assert c.phase == "running"
