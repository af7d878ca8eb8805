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
    rows = ledger.transitions(entity=gpu)
    assert rows and rows[-1]["to"] == "quarantine" and "reseat pending" in rows[-1]["reasons"][0][0]
    # Held across ticks although the evidence is clean.
    for _ in range(20):
        rep = _tick(ctl, twin)
    assert rep.assessment.kinds[Kind.GPU].states.state[i] == State.QUARANTINE
    # Released: the state machine carries on and, with clean evidence, recovers.
    assert ctl.unpin(Kind.GPU, gpu) is not None
    for _ in range(30):
        rep = _tick(ctl, twin)
    assert rep.assessment.kinds[Kind.GPU].states.state[i] == State.HEALTHY
    assert "drain:gpu010" not in rep.decisions.desired


def test_pin_rejects_unknown_entities_and_kinds_without_a_state_machine(tmp_path):
    _, _, ctl, _ = _setup(tmp_path)
    with pytest.raises(KeyError, match="no gpu named"):
        ctl.pin(Kind.GPU, "nope", State.HEALTHY, "x")
    with pytest.raises(ValueError, match="cannot pin a node"):
        ctl.pin(Kind.NODE, "gpu000", State.HEALTHY, "x")
    assert ctl.unpin(Kind.GPU, "gpu000/gpu0") is None
