"""Operator pins in the controller: a pinned entity is held in its state, drives decisions
like any other, is recorded with the operator's note, and is released by unpin."""

from __future__ import annotations

import pytest

from seamguard.assess.overrides import PIN_CHANNEL
from seamguard.assess.states import State
from seamguard.control import Controller
from seamguard.decide.policy import default_policy
from seamguard.fleet.model import Kind
from seamguard.ledger.sqlite import Ledger
from seamguard.twin.actuator import TwinActuator
from seamguard.twin.telemetry import Twin, TwinConfig
from seamguard.fleet.generate import FleetShape, generate_fleet


def _tick(ctl, twin):
    frame = twin.step()
    ctl.set_fleet(twin.placement_fleet())  # the twin moves work off drained nodes
    return ctl.tick(frame)


def _setup(tmp_path):
    fleet = generate_fleet(FleetShape(gpus=256), seed=1)
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=1)
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(fleet, default_policy(mode="enforce"), [TwinActuator(twin)], ledger=ledger, tick_s=5.0,
                     mode="enforce")
    return fleet, twin, ctl, ledger


def test_pin_holds_state_drives_a_drain_and_is_recorded(tmp_path):
    fleet, twin, ctl, ledger = _setup(tmp_path)
    for _ in range(3):
        _tick(ctl, twin)
    gpu = "gpu010/gpu3"
    i = fleet.index_of(Kind.GPU, gpu)
    assert ctl.states[Kind.GPU].state[i] == State.HEALTHY
    ctl.pin(Kind.GPU, gpu, State.QUARANTINE, "reseat pending")
    rep = _tick(ctl, twin)
    assert rep.error == ""
    a = rep.assessment
    assert a.kinds[Kind.GPU].states.state[i] == State.QUARANTINE
    node = fleet.index_of(Kind.NODE, "gpu010")
    assert a.node_state[node] == State.QUARANTINE
    assert not a.admissible[node, 0]
    assert "drain:gpu010" in rep.decisions.desired
    tr = [t for t in a.transitions if t.entity == gpu]
    assert len(tr) == 1 and tr[0].reasons[0].channel.startswith(PIN_CHANNEL) and "reseat pending" in tr[0].reasons[0].channel
    rows = ledger.transitions(entity=gpu)  # newest first
    assert rows and rows[0]["to_state"] == "quarantine" and "reseat pending" in rows[0]["reasons"][0]["channel"]
    # Held across ticks although the evidence is clean.
    for _ in range(20):
        rep = _tick(ctl, twin)
    assert rep.assessment.kinds[Kind.GPU].states.state[i] == State.QUARANTINE
    # Released: the state machine carries on and, with clean evidence, recovers.
    assert ctl.unpin(Kind.GPU, gpu) is not None
    for _ in range(30):
        rep = _tick(ctl, twin)
    assert rep.assessment.kinds[Kind.GPU].states.state[i] == State.HEALTHY
    # The drain is lifted once the node has stayed healthy for the release dwell.
    for _ in range(ctl.policy.actions.release_after_healthy_ticks):
        rep = _tick(ctl, twin)
    assert "drain:gpu010" not in rep.decisions.desired


def test_pin_rejects_unknown_entities_and_kinds_without_a_state_machine(tmp_path):
    _, _, ctl, _ = _setup(tmp_path)
    with pytest.raises(KeyError, match="no gpu named"):
        ctl.pin(Kind.GPU, "nope", State.HEALTHY, "x")
    with pytest.raises(ValueError, match="cannot pin a node"):
        ctl.pin(Kind.NODE, "gpu000", State.HEALTHY, "x")
    assert ctl.unpin(Kind.GPU, "gpu000/gpu0") is None


# ---- pins survive a restart: the ledger keeps them ------------------------------------------------


def test_pins_are_recorded_in_the_ledger_and_restored_by_a_new_controller(tmp_path):
    fleet, twin, ctl, ledger = _setup(tmp_path)
    for _ in range(3):
        _tick(ctl, twin)
    held, released = "gpu010/gpu3", "gpu020/gpu1"
    ctl.pin(Kind.GPU, held, State.QUARANTINE, "reseat pending", by="alice", since_wall_s=1234.5)
    ctl.pin(Kind.GPU, released, State.FAILED, "false alarm?", by="bob")
    assert ctl.unpin(Kind.GPU, released, by="carol") is not None
    assert ctl.unpin(Kind.GPU, released) is None  # nothing to release: no event
    rows = ledger.pins()
    assert [(r["kind"], r["name"], r["state"], r["note"], r["by"], r["created_wall_s"], r["tick"]) for r in rows] == \
        [("gpu", held, "quarantine", "reseat pending", "alice", 1234.5, 3)]
    events = ledger.pin_events()  # newest first: the audit trail keeps the pin that is gone
    assert [(e["event"], e["entity"], e["state"], e["by"]) for e in events] == [
        ("unpinned", released, "failed", "carol"), ("pinned", released, "failed", "bob"),
        ("pinned", held, "quarantine", "alice")]
    _tick(ctl, twin)
    ledger.close()

    # A new controller on the same ledger: the pin is back and still forces the state.
    ledger2 = Ledger(tmp_path / "l.sqlite")
    ctl2 = Controller(fleet, default_policy(mode="enforce"), [TwinActuator(twin)], ledger=ledger2, tick_s=5.0,
                      mode="enforce")
    i = fleet.index_of(Kind.GPU, held)
    assert list(ctl2.pins) == [(Kind.GPU, i)]
    p = ctl2.pins[(Kind.GPU, i)]
    assert (p.entity, p.state, p.note, p.by, p.since_wall_s) == (held, State.QUARANTINE, "reseat pending", "alice",
                                                                 1234.5)
    for _ in range(5):
        rep = _tick(ctl2, twin)
    assert rep.error == ""
    assert rep.assessment.kinds[Kind.GPU].states.state[i] == State.QUARANTINE
    assert rep.assessment.kinds[Kind.GPU].states.state[fleet.index_of(Kind.GPU, released)] == State.HEALTHY
    assert ctl2.unpin(Kind.GPU, held) is not None
    assert ledger2.pins() == []
    ledger2.close()
    ctl3 = Controller(fleet, default_policy(mode="enforce"), [], ledger=Ledger(tmp_path / "l.sqlite"), tick_s=5.0)
    assert ctl3.pins == {}  # unpinned before the restart: stays unpinned
    ctl3.ledger.close()


def test_a_recorded_pin_the_new_fleet_lacks_is_skipped_with_a_warning_and_kept(tmp_path, caplog):
    big = generate_fleet(FleetShape(gpus=256), seed=1)
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(big, default_policy(), [], ledger=ledger, tick_s=5.0)
    ctl.pin(Kind.GPU, "gpu030/gpu2", State.FAILED, "dead fan")  # node 30 exists only in the big fleet
    ctl.pin(Kind.GPU, "gpu001/gpu0", State.DEGRADED, "watch it")
    ledger.close()

    small = generate_fleet(FleetShape(gpus=64), seed=1)
    with pytest.raises(KeyError):
        small.index_of(Kind.GPU, "gpu030/gpu2")
    ledger2 = Ledger(tmp_path / "l.sqlite")
    with caplog.at_level("WARNING", logger="seamguard.control"):
        ctl2 = Controller(small, default_policy(), [], ledger=ledger2, tick_s=5.0)
    assert [p.entity for p in ctl2.pins.values()] == ["gpu001/gpu0"]
    msg = [r.getMessage() for r in caplog.records if "not restored" in r.getMessage()]
    assert len(msg) == 1 and "gpu030/gpu2" in msg[0] and "no gpu named" in msg[0] and "dead fan" in msg[0]
    # Kept in the ledger (a restart on the big fleet would restore it) and the skip is an event.
    assert {r["name"] for r in ledger2.pins()} == {"gpu030/gpu2", "gpu001/gpu0"}
    ev = ledger2.pin_events(entity="gpu030/gpu2")
    assert ev[0]["event"] == "not_restored" and "no gpu named" in ev[0]["detail"] and ev[0]["note"] == "dead fan"
    rep = ctl2.tick(_clean_frame(small))
    assert rep.error == ""
    assert rep.assessment.kinds[Kind.GPU].states.state[small.index_of(Kind.GPU, "gpu001/gpu0")] == State.DEGRADED
    ledger2.close()
    ctl3 = Controller(big, default_policy(), [], ledger=Ledger(tmp_path / "l.sqlite"), tick_s=5.0)
    assert {p.entity for p in ctl3.pins.values()} == {"gpu030/gpu2", "gpu001/gpu0"}
    ctl3.ledger.close()


def _clean_frame(fleet):
    return Twin(fleet, [], TwinConfig(tick_s=5.0), seed=1).step()


def test_a_pin_survives_a_service_restart_on_the_same_ledger(tmp_path):
    from fastapi.testclient import TestClient

    from seamguard.app.service.api import create_app
    from seamguard.app.runner import Runner
    from seamguard.app.sources import TwinSource

    from .conftest import TOKEN

    auth = {"Authorization": f"Bearer {TOKEN}"}
    path = tmp_path / "ledger.sqlite"
    gpu, other = "gpu003/gpu5", "gpu004/gpu0"

    def serve() -> Runner:
        r = Runner(TwinSource(gpus=256, minutes=2.0, seed=0), speed=0, ledger_path=path)
        r.start()
        return r

    r1 = serve()
    try:
        r1.advance(3)
        with TestClient(create_app(r1, TOKEN), base_url="http://127.0.0.1") as c:
            assert c.put(f"/api/v1/pins/gpu/{gpu}", json={"state": "quarantine", "note": "reseat pending"},
                         headers=auth).status_code == 200
            assert c.put(f"/api/v1/pins/gpu/{other}", json={"state": "failed", "note": "x"},
                         headers=auth).status_code == 200
            assert c.delete(f"/api/v1/pins/gpu/{other}", headers=auth).status_code == 200
            r1.advance(1)
            assert c.get(f"/api/v1/entities/gpu/{gpu}").json()["entity"]["state"] == "quarantine"
    finally:
        r1.stop()

    r2 = serve()
    try:
        with TestClient(create_app(r2, TOKEN), base_url="http://127.0.0.1") as c:
            # Restored before the first tick of the new service.
            pins = c.get("/api/v1/pins").json()
            assert [(p["entity"], p["state"], p["note"], p["by"]) for p in pins] == \
                [(gpu, "quarantine", "reseat pending", "operator")]
            assert c.get("/api/v1/summary").json()["pins"] == 1
            r2.advance(3)
            d = c.get(f"/api/v1/entities/gpu/{gpu}").json()
            assert d["entity"]["state"] == "quarantine" and d["entity"]["pinned"]
            assert d["pin"]["note"] == "reseat pending" and "reseat pending" in d["why"]
            assert c.get(f"/api/v1/entities/gpu/{other}").json()["entity"]["pinned"] is False
            assert c.delete(f"/api/v1/pins/gpu/{gpu}", headers=auth).status_code == 200
            assert c.get("/api/v1/pins").json() == []
        events = [(e["event"], e["entity"]) for e in r2.ledger.pin_events()]
        assert events == [("unpinned", gpu), ("unpinned", other), ("pinned", other), ("pinned", gpu)]
    finally:
        r2.stop()

    r3 = serve()
    try:
        assert r3.snapshot().pins == ()
    finally:
        r3.stop()
