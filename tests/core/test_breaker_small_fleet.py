"""Issue 36: a breaker that fits a 32-node pilot and never blocks recovery.

Decision tables over the pure functions (``_node_cap``, ``admit``, ``admit_returns``),
then the controller loop on a 32-node twin: the first bad nodes drain, the next trips,
and what seamguard drained still comes back while tripped, one node per window here,
each return in the ledger.
"""

import numpy as np
import pytest

import seamguard.decide.breaker as bk
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.decide.actions import ActionKey, Verb
from seamguard.decide.breaker import BreakerState, InEffect, Request, admit, admit_returns
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.ledger import Ledger
from seamguard.twin.telemetry import Twin, TwinConfig

from .world import World

PILOT = generate_fleet(FleetShape(gpus=256), seed=3)  # 32 nodes, one loop, 8 racks of 4
CFG = default_policy().breaker
N = PILOT.node_names


def _node(name: str) -> int:
    return PILOT.index_of(Kind.NODE, name)


@pytest.mark.parametrize("frac, n, min_nodes, cap", [
    (0.05, 32, 2, 2),     # a pilot: 5 % is one node, the minimum makes it two
    (0.05, 256, 2, 12),   # a fleet: the share is the larger
    (0.50, 4, 2, 2),      # a rack of four: both say two
    (0.30, 4, 2, 2),      # a small leaf: the share says one
    (0.05, 32, 50, 32),   # never more than the domain has
    (0.05, 1, 2, 1),
    (0.05, 0, 2, 0),      # an empty domain (a spine switch) holds no node
])
def test_node_cap_is_the_share_or_the_minimum_never_past_the_domain(frac, n, min_nodes, cap):
    assert bk._node_cap(frac, n, min_nodes) == cap
    assert bk._node_caps(frac, np.array([n]), min_nodes).tolist() == [cap]


# (case, cfg update, tripped, rate window (node names), in effect (node names), requests
#  (key, node, hard), admitted, held key -> part of why, tripped after)
ADMIT = [
    ("first bad node of a pilot", {}, False, [], [], [("drain:gpu000", "gpu000", False)],
     ["drain:gpu000"], {}, False),
    ("second bad node: 1 of 32 by share, 2 by the minimum", {}, False, ["gpu000"], ["gpu000"],
     [("drain:gpu009", "gpu009", False)], ["drain:gpu009"], {}, False),
    ("third soft node within the window trips", {}, False, ["gpu000", "gpu009"], ["gpu000", "gpu009"],
     [("drain:gpu018", "gpu018", False)], [], {"drain:gpu018": "3 of 32 nodes within 3600s"}, True),
    ("a dry run asks for the same drain every tick: counted once", {}, False, ["gpu000"], [],
     [("drain:gpu000", "gpu000", False)], ["drain:gpu000"], {}, False),
    ("min_nodes 1 is the share alone", {"min_nodes": 1}, False, ["gpu000"], ["gpu000"],
     [("drain:gpu009", "gpu009", False)], [], {"drain:gpu009": "2 of 32 nodes"}, True),
    ("two in one tick, the third of the tick trips", {}, False, [], [],
     [("drain:gpu000", "gpu000", False), ("drain:gpu009", "gpu009", False), ("drain:gpu018", "gpu018", False)],
     ["drain:gpu000", "drain:gpu009"], {"drain:gpu018": "3 of 32"}, True),
    ("tripped: a new soft node is held", {}, True, ["gpu000", "gpu009"], ["gpu000", "gpu009"],
     [("drain:gpu018", "gpu018", False)], [], {"drain:gpu018": "breaker tripped"}, True),
    ("tripped: a node admitted within the window (a dry run's standing drain) is not new", {}, True,
     ["gpu000"], [], [("drain:gpu000", "gpu000", False)], ["drain:gpu000"], {}, True),
    ("tripped: a hard failure inside every total still goes", {}, True, ["gpu000", "gpu009"],
     ["gpu000", "gpu009"], [("drain:gpu027", "gpu027", True)], ["drain:gpu027"], {}, True),
    ("the rack bound holds at max(50 % of 4, 2) without tripping", {"max_fleet_fraction": 1.0}, False, [],
     ["gpu000", "gpu001"], [("drain:gpu002", "gpu002", False)], [], {"drain:gpu002": "rack-0000"}, False),
    ("the fleet total is max(20 % of 32, 2) = 6", {"max_fleet_fraction": 1.0}, False, [],
     ["gpu000", "gpu004", "gpu008", "gpu012", "gpu016", "gpu020"], [("drain:gpu024", "gpu024", True)],
     [], {"drain:gpu024": "7 of 32 nodes under restriction"}, True),
]


@pytest.mark.parametrize("case, update, tripped, window, in_effect, requests, admitted, held, tripped_after",
                         ADMIT, ids=[row[0] for row in ADMIT])
def test_admit_decision_table(case, update, tripped, window, in_effect, requests, admitted, held,
                              tripped_after):
    assert all(PILOT.node_rack[_node(n)] == 0 for n in ("gpu000", "gpu001", "gpu002"))
    cfg = CFG.model_copy(update=update)
    state = BreakerState(tripped=tripped, reason="an earlier storm" if tripped else "",
                         drained=tuple((50.0, n) for n in window))
    reqs = [Request(k, nodes=(_node(n),), hard=hard) for k, n, hard in requests]
    now = InEffect(nodes={_node(n) for n in in_effect})
    after, got, got_held = admit(state, PILOT, cfg, 100.0, reqs, now)
    assert got == admitted
    assert set(got_held) == set(held)
    for k, why in held.items():
        assert why in got_held[k], got_held[k]
    assert after.tripped == tripped_after
    assert len({n for _, n in after.drained}) == len(after.drained), "a node counted twice in the window"


# (case, tripped, enabled, returned window ((t_s, node)), returns (key, node), cfg update,
#  admitted, held keys)
RETURNS = [
    ("untripped: every return goes", False, True, [],
     [("drain:gpu000", "gpu000"), ("drain:gpu009", "gpu009"), ("drain:gpu018", "gpu018")], {},
     ["drain:gpu000", "drain:gpu009", "drain:gpu018"], []),
    ("tripped pilot: max(5 % of 32, 2) = 2 per window, in key order", True, True, [],
     [("drain:gpu018", "gpu018"), ("drain:gpu000", "gpu000"), ("drain:gpu009", "gpu009")], {},
     ["drain:gpu000", "drain:gpu009"], ["drain:gpu018"]),
    ("tripped: a node already returned in the window is not counted again", True, True, [(90.0, "gpu000")],
     [("label_degraded:gpu000=none", "gpu000"), ("drain:gpu009", "gpu009")], {},
     ["drain:gpu009", "label_degraded:gpu000=none"], []),
    ("tripped: the window is full", True, True, [(90.0, "gpu001"), (95.0, "gpu002")],
     [("drain:gpu009", "gpu009")], {}, [], ["drain:gpu009"]),
    ("tripped: a return older than the window no longer counts", True, True,
     [(100.0 - 3600.0, "gpu001"), (95.0, "gpu002")], [("drain:gpu009", "gpu009")], {}, ["drain:gpu009"], []),
    ("tripped, a larger share", True, True, [], [(f"drain:{n}", n) for n in N[:5]],
     {"max_return_fraction": 0.1}, [f"drain:{n}" for n in N[:3]], [f"drain:{n}" for n in N[3:5]]),
    ("switched off: every return goes", True, False, [(90.0, "gpu001"), (95.0, "gpu002")],
     [("drain:gpu009", "gpu009")], {}, ["drain:gpu009"], []),
]


@pytest.mark.parametrize("case, tripped, enabled, window, returns, update, admitted, held", RETURNS,
                         ids=[row[0] for row in RETURNS])
def test_admit_returns_decision_table(case, tripped, enabled, window, returns, update, admitted, held):
    cfg = CFG.model_copy(update={"enabled": enabled, **update})
    state = BreakerState(tripped=tripped, returned=tuple(window))
    after, got, got_held = admit_returns(state, PILOT, cfg, 100.0, returns)
    assert got == admitted
    assert sorted(got_held) == held
    assert all("breaker tripped" in why and "returned within 3600s" in why for why in got_held.values())
    assert after.tripped == tripped, "a return neither trips nor resets the breaker"
    kept = [(t, n) for t, n in window if t > 100.0 - cfg.window_s]
    if tripped and enabled:
        assert {n for _, n in after.returned} == {n for _, n in kept} | {
            ActionKey.parse(k).entity for k in got}
    assert BreakerState.from_json(after.to_json()) == after, "the return window survives a restart"


def test_reset_clears_the_return_window():
    state = BreakerState(tripped=True, reason="x", returned=((1.0, "gpu000"),))
    assert state.reset().returned == ()


def _drained(world: World) -> set[str]:
    return {ActionKey.parse(k).entity for k in world.held if ActionKey.parse(k).verb == Verb.DRAIN}


def test_pilot_drains_its_first_bad_nodes_and_returns_them_while_tripped(tmp_path):
    """Three soft-failing nodes on 32: two drain, the third trips the breaker. Once they
    recover, the drained ones come back while it stays tripped (2 per window: 5 % of 32 is
    one, the minimum two), each return in the ledger."""
    pol = default_policy(mode="enforce", actions={"release_after_healthy_ticks": 5})
    ledger = Ledger(tmp_path / "l.sqlite")
    world = World()
    ctl = Controller(PILOT, pol, [world], ledger, tick_s=5.0)
    twin = Twin(PILOT, [], TwinConfig(tick_s=5.0), seed=4)
    sick = ["gpu000", "gpu009", "gpu018"]
    worst: set[str] = set()
    lifts_held: list[str] = []
    for i in range(90):
        f = twin.step()
        if 2 <= i < 30:
            twin.gpu_sbe[np.isin(PILOT.gpu_node, [_node(n) for n in sick])] += 20
        rep = ctl.tick(f)
        assert not rep.error, rep.error
        worst |= _drained(world)
        lifts_held += [a.reason for k, a in rep.decisions.desired.items() if "lift held" in a.reason]
    assert worst == {"gpu000", "gpu009"}, "a 32-node pilot drains its first two bad nodes"
    assert ctl.breaker.tripped and "3 of 32" in ctl.breaker.reason
    assert _drained(world) == set(), "what seamguard drained came back while tripped"
    reverts = [a for a in ledger.actions() if a["op"] == "revert" and a["verb"] == "drain"]
    assert {a["target"] for a in reverts} == {"gpu000", "gpu009"} and all(a["status"] == "done" for a in reverts)
    assert {n for _, n in ctl.breaker.returned} == {"gpu000", "gpu009"}
    assert not lifts_held
    ledger.close()


def test_returns_past_the_pace_wait_with_why_and_a_reset_lets_them_go(tmp_path):
    """One return per window (1 % of 32, at least 1): the second drained node is kept, with
    why, across a restart, until a person resets the breaker."""
    pol = default_policy(mode="enforce", actions={"release_after_healthy_ticks": 5},
                         breaker={"max_return_fraction": 0.01, "min_nodes": 1, "max_fleet_fraction": 0.07})
    ledger = Ledger(tmp_path / "l.sqlite")
    world = World()
    ctl = Controller(PILOT, pol, [world], ledger, tick_s=5.0)
    twin = Twin(PILOT, [], TwinConfig(tick_s=5.0), seed=4)
    sick = ["gpu000", "gpu009", "gpu018"]
    waiting: list[str] = []
    for i in range(90):
        f = twin.step()
        if 2 <= i < 30:
            twin.gpu_sbe[np.isin(PILOT.gpu_node, [_node(n) for n in sick])] += 20
        rep = ctl.tick(f)
        assert not rep.error, rep.error
        waiting += [a.reason for a in rep.decisions.desired.values() if "lift held" in a.reason]
    assert ctl.breaker.tripped
    assert len(_drained(world)) == 1, "one of the two drained nodes returned; the other waits its turn"
    assert waiting and "1 of 1 nodes returned within 3600s" in waiting[-1]
    # restarted on the same ledger, the return window is still full
    ledger.close()
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(PILOT, pol, [world], ledger, tick_s=5.0)
    assert len(ctl.breaker.returned) == 1
    f = twin.step()
    ctl.tick(f)
    assert len(_drained(world)) == 1
    ctl.reset_breaker(by="alice", why="firmware storm over")
    ctl.tick(twin.step())
    assert _drained(world) == set(), "reset: the last drained node returns"
    reverts = [a for a in ledger.actions() if a["op"] == "revert" and a["verb"] == "drain"]
    assert len(reverts) == 2 and all(a["status"] == "done" for a in reverts)
    ledger.close()


def test_dry_run_on_a_pilot_does_not_trip_on_one_bad_node(tmp_path):
    """In a dry run nothing comes into effect, so the same drain is asked for every tick;
    it was counted once, when first admitted."""
    pol = default_policy(mode="dry_run")
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(PILOT, pol, [World()], ledger, tick_s=5.0)
    twin = Twin(PILOT, [], TwinConfig(tick_s=5.0), seed=4)
    held = []
    for i in range(30):
        f = twin.step()
        if i >= 2:
            twin.gpu_sbe[PILOT.gpu_node == 0] += 20
        held += ctl.tick(f).decisions.held
    assert not ctl.breaker.tripped, ctl.breaker.reason
    assert not held
    assert any(d["key"] == "drain:gpu000" for d in ledger.decisions())
    ledger.close()


def test_a_restriction_replaced_by_another_is_not_a_return():
    """Tripped, with the return window full: a label replaced by a drain (or a drain by a
    label) is lifted at once and counts nothing; a node leaving every restriction waits."""
    from seamguard.decide.explain import kept
    from seamguard.decide.planner import pace_returns

    pol = default_policy(breaker={"min_nodes": 1, "max_return_fraction": 0.01})
    full = BreakerState(tripped=True, reason="x", returned=((90.0, "gpu031"),))
    node_index = {n: i for i, n in enumerate(N)}
    in_effect = {"label_degraded:gpu000=none", "drain:gpu009", "drain:gpu018"}
    desired = {k: kept(k, "wanted") for k in ("drain:gpu000", "label_degraded:gpu009=async_batch_inference")}
    out, after = pace_returns(desired, in_effect, full, PILOT, node_index, pol, 100.0)
    assert "label_degraded:gpu000=none" not in out and "drain:gpu009" not in out, "replacements go at once"
    assert "drain:gpu018" in out and "lift held: breaker tripped: 1 of 1 nodes returned" in out["drain:gpu018"].reason
    assert after.returned == full.returned
