"""The ledger's read path: one set of queries, used by the writer and by the read-only
reader the service gives its API threads."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from seamguard.act import LogActuator
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.fleet import FleetShape, generate_fleet
from seamguard.ledger.sqlite import Ledger, LedgerReader
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=128), seed=2)


def _run(tmp_path, ticks=25):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ctl = Controller(FLEET, default_policy(mode="enforce"), [LogActuator(tmp_path / "a.jsonl")], ledger, tick_s=5.0)
    twin = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4)
    for i in range(ticks):
        f = twin.step()
        if i >= 3:
            twin.gpu_sbe[:16] += 20  # two nodes' GPUs go bad: transitions, decisions, actions
        ctl.tick(f)
    return ledger, ctl


def test_writer_and_read_only_reader_answer_the_same(tmp_path):
    ledger, _ = _run(tmp_path)
    reader = LedgerReader(ledger.path)
    try:
        trs = reader.transitions()
        assert trs and trs == ledger.transitions()
        assert reader.decisions() == ledger.decisions() != []
        assert reader.actions() == ledger.actions() != []
        # Newest first, bounded by tick, filtered, paged.
        ticks = [t["tick"] for t in trs]
        assert ticks == sorted(ticks, reverse=True)
        mid = ticks[len(ticks) // 2]
        assert all(t["tick"] <= mid for t in reader.transitions(upto_tick=mid))
        e = trs[0]["entity"]
        assert {t["entity"] for t in reader.transitions(entity=e)} == {e}
        assert {t["kind"] for t in reader.transitions(kind="node")} <= {"node"}
        assert all("healthy" != t["to_state"] or "healthy" != t["from_state"]
                   for t in reader.transitions(non_healthy_only=True))
        assert reader.transitions(limit=2, offset=1) == trs[1:3]
        acts = reader.actions(status="done")
        assert acts and all(a["status"] == "done" for a in acts)
        node = acts[0]["target"]
        assert all(node in (d["target"], d["cause"]) for d in reader.decisions(entity=node))
        assert {d["event"] for d in reader.decisions(event="decided")} == {"decided"}
    finally:
        reader.close()
        ledger.close()


def test_the_reader_cannot_write(tmp_path):
    ledger, _ = _run(tmp_path, ticks=2)
    reader = LedgerReader(ledger.path)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._read_db().execute("DELETE FROM transitions")
    reader.close()
    ledger.close()


def test_reader_threads_read_while_the_controller_writes(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ctl = Controller(FLEET, default_policy(mode="enforce"), [LogActuator(tmp_path / "a.jsonl")], ledger, tick_s=5.0)
    twin = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4)
    reader = LedgerReader(ledger.path)
    stop = threading.Event()
    errors: list[Exception] = []
    seen: list[int] = []

    def read() -> None:
        try:
            while not stop.is_set():
                rows = reader.transitions(limit=50) + reader.actions(limit=50)
                seen.append(len(rows))
                reader.decisions(limit=50)
        except Exception as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(25):
            f = twin.step()
            if i >= 3:
                twin.gpu_sbe[:16] += 20
            assert ctl.tick(f).error == ""
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert seen and max(seen) > 0
    assert len(reader._all) == 3  # one connection per reading thread
    reader.close()
    ledger.close()
