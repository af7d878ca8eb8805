"""Issue 14: one breaker that counts everything, survives a crash, and cannot be switched off by accident."""

import numpy as np
import pytest

from seamguard.control import Controller
from seamguard.decide import PolicyError, default_policy, parse_policy
from seamguard.decide.actions import ActionKey, Verb
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.ledger import Ledger
from seamguard.twin.telemetry import Twin, TwinConfig

from .world import World

SMALL = generate_fleet(FleetShape(gpus=256), seed=3)
BIG = generate_fleet(FleetShape(gpus=2048), seed=3)


class Killed(BaseException):
    """kill -9: nothing after it runs (not even the controller's own error handling)."""


class Crashing(World):
    def __init__(self, world: World, after: int) -> None:
        self.world, self.after, self.n = world, after, 0

    def observe(self):
        return self.world.observe()

    def apply(self, action):
        res = self.world.apply(action)
        self.n += action.verb == Verb.DRAIN
        if action.verb == Verb.DRAIN and self.n == self.after:
            raise Killed()
        return res

    def revert(self, key):
        return self.world.revert(key)


def _nodes(world: World, fleet, verbs=(Verb.DRAIN, Verb.LABEL_DEGRADED)) -> set[int]:
    out = set()
    for k in world.held:
        ak = ActionKey.parse(k)
        if ak.verb in verbs and ak.entity in fleet.node_names:
            out.add(fleet.index_of(Kind.NODE, ak.entity))
    return out


def _cap(frac: float, n: int) -> int:
    return int(np.floor(frac * n + 1e-9))


def test_hard_failure_on_every_gpu_is_bounded_by_the_breaker():
    fleet = SMALL
    pol = default_policy(mode="enforce")
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    world = World()
    ctl = Controller(fleet, pol, [world], None, tick_s=5.0)
    for i in range(6):
        f = twin.step()
        if i >= 2:
            f.values["DCGM_FI_DEV_XID_ERRORS"][:] = 79
        ctl.tick(f)
    drained = _nodes(world, fleet, (Verb.DRAIN,))
    n = fleet.count(Kind.NODE)
    assert drained, "hard failures are still acted on"
    assert len(drained) <= _cap(pol.breaker.max_in_effect_fleet_fraction, n)
    for lp in range(len(fleet.loop_names)):
        on = np.flatnonzero(fleet.node_loop == lp)
        assert len(drained & set(on.tolist())) <= max(_cap(pol.breaker.max_in_effect_loop_fraction, len(on)),
                                                      _cap(pol.breaker.max_in_effect_fleet_fraction, n))
    assert ctl.breaker.tripped


@pytest.mark.parametrize("order", ["one_loop", "fleet"])
def test_slow_storm_never_exceeds_the_bound_in_effect(order):
    fleet = BIG
    # A short rate window: the storm stays under the rate, only the total can stop it.
    pol = default_policy(mode="enforce", breaker={"window_s": 120})
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    world = World()
    ctl = Controller(fleet, pol, [world], None, tick_s=5.0)
    n = fleet.count(Kind.NODE)
    # Spread over racks (one node per rack per round) so that the loop and fleet totals,
    # not the rack's, are what stops it.
    def rack_rounds(nodes):
        rank = np.array([np.sum(fleet.node_rack[nodes[:k]] == fleet.node_rack[nodes[k]]) for k in range(len(nodes))])
        return nodes[np.argsort(rank, kind="stable")]
    if order == "one_loop":
        storm = rack_rounds(np.flatnonzero(fleet.node_loop == 1))
    else:  # spread over every loop and rack
        storm = rack_rounds(np.arange(fleet.count(Kind.NODE)))[:90]
    cap_fleet = _cap(pol.breaker.max_in_effect_fleet_fraction, n)
    cap_loop = _cap(pol.breaker.max_in_effect_loop_fraction, 32)
    cap_rack = _cap(pol.breaker.max_in_effect_rack_fraction, 4)
    worst_fleet = worst_loop = worst_rack = 0
    for i in range(4 * len(storm) + 10):
        f = twin.step()
        sick = storm[: max(0, (i - 3) // 4)]
        twin.gpu_sbe[np.isin(fleet.gpu_node, sick)] += 20
        ctl.tick(f)
        nodes = _nodes(world, fleet)
        worst_fleet = max(worst_fleet, len(nodes))
        per_loop = np.bincount(fleet.node_loop[list(nodes)], minlength=len(fleet.loop_names)) if nodes else [0]
        worst_loop = max(worst_loop, int(np.max(per_loop)))
        if nodes:
            worst_rack = max(worst_rack, int(np.bincount(fleet.node_rack[list(nodes)]).max()))
    assert worst_fleet <= cap_fleet
    assert worst_rack <= cap_rack
    assert worst_loop <= cap_loop
    # A storm inside one loop is held at the loop's bound and the rest of the fleet goes on;
    # one that reaches the fleet-wide bound trips the breaker for everything.
    assert ctl.breaker.tripped == (order == "fleet")
    if order == "one_loop":
        assert worst_loop == cap_loop


def test_a_bound_of_one_rack_holds_there_and_does_not_trip_the_fleet():
    fleet = BIG
    pol = default_policy(mode="enforce")
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    world = World()
    ctl = Controller(fleet, pol, [world], None, tick_s=5.0)
    rack0 = np.flatnonzero(fleet.node_rack == 0)  # 4 nodes: the rack bound (50 %) admits 2
    elsewhere = int(np.flatnonzero(fleet.node_rack == 9)[0])
    held = []
    for i in range(20):
        f = twin.step()
        if i >= 2:
            twin.gpu_sbe[np.isin(fleet.gpu_node, rack0)] += 20
        if i >= 10:
            twin.gpu_sbe[fleet.gpu_node == elsewhere] += 20
        held += [a.reason for a in ctl.tick(f).decisions.held]
    nodes = _nodes(world, fleet, (Verb.DRAIN,))
    assert len(nodes & set(rack0.tolist())) == 2
    assert any("rack" in r and "held:" in r for r in held)
    assert not ctl.breaker.tripped
    assert elsewhere in nodes, "a node in another rack is still drained"


def test_kill_between_actuation_and_persist_neither_exceeds_nor_repeats_nor_loses(tmp_path):
    fleet = BIG
    pol = default_policy(mode="enforce")
    world = World()
    sick_nodes = np.arange(0, 256, 8)[:30]  # 30 nodes, far past the 12 the rate allows
    sick = np.isin(fleet.gpu_node, sick_nodes)
    path = tmp_path / "l.sqlite"

    def frames():
        twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
        for i in range(16):
            f = twin.step()
            if i >= 3:
                twin.gpu_sbe[sick] += 20
            yield f

    crashes = 0
    for after in (3, 4, 0):  # die after the 3rd drain reached the world, again after the 4th, then run to the end
        ledger = Ledger(path)
        act = Crashing(world, after) if after else world
        ctl = Controller(fleet, pol, [act], ledger, tick_s=5.0)
        try:
            for i, f in enumerate(frames()):
                if i >= ctl.tick_no:
                    ctl.tick(f)
        except Killed:
            crashes += 1
        ledger.close()
    assert crashes == 2
    drains = [k for k in world.applied if k.startswith("drain:")]
    assert len(drains) == len(set(drains)), "a drain was applied twice"
    limit = _cap(pol.breaker.max_fleet_fraction, fleet.count(Kind.NODE))
    assert len(_nodes(world, fleet, (Verb.DRAIN,))) <= limit
    ledger = Ledger(path)
    ctl = Controller(fleet, pol, [world], ledger, tick_s=5.0)
    assert ctl.breaker.tripped
    admitted = {n for _, n in ctl.breaker.drained}
    drained = {fleet.node_names[i] for i in _nodes(world, fleet, (Verb.DRAIN,))}
    assert drained == admitted, "an admitted drain was lost, or one ran without being counted"


def test_tripped_breaker_reset_records_who_and_why(tmp_path):
    fleet = BIG
    pol = default_policy(mode="enforce")
    ledger = Ledger(tmp_path / "l.sqlite")
    world = World()
    ctl = Controller(fleet, pol, [world], ledger, tick_s=5.0)
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    sick = np.isin(fleet.gpu_node, np.arange(0, 256, 8))
    for i in range(10):
        f = twin.step()
        if i >= 3:
            twin.gpu_sbe[sick] += 20
        ctl.tick(f)
    assert ctl.breaker.tripped
    ctl.reset_breaker(by="alice", why="storm was a firmware push; rolled back")
    assert not ctl.breaker.tripped
    ev = [e for e in ledger.failsafe_events() if e["event"] == "breaker_reset"]
    assert ev and ev[0]["by"] == "alice" and "firmware" in ev[0]["detail"]
    assert any(e["event"] == "breaker_tripped" for e in ledger.failsafe_events())


@pytest.mark.parametrize("breaker, field", [
    ({"max_fleet_fraction": True}, "breaker.max_fleet_fraction"),
    ({"max_loop_fraction": False}, "breaker.max_loop_fraction"),
    ({"window_s": 1e-6}, "breaker.window_s"),
    ({"window_s": "3600"}, "breaker.window_s"),
    ({"max_fleet_fraction": 0}, "breaker.max_fleet_fraction"),
    ({"max_fleet_fraction": float("nan")}, "breaker.max_fleet_fraction"),
    ({"max_in_effect_fleet_fraction": 1.5}, "breaker.max_in_effect_fleet_fraction"),
    ({"enabled": "no"}, "breaker.enabled"),
])
def test_policy_values_that_disable_the_breaker_are_rejected(breaker, field):
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        parse_policy({"breaker": breaker}, "p.yaml")


def test_breaker_off_only_when_asked_and_then_with_a_warning(caplog):
    pol = parse_policy({"breaker": {"enabled": False}}, "p.yaml")
    assert pol.breaker.enabled is False
    with caplog.at_level("WARNING"):
        Controller(SMALL, pol, [], None, tick_s=5.0)
    assert "breaker" in caplog.text and "disabled" in caplog.text


def test_window_below_one_tick_is_rejected_by_the_controller():
    pol = default_policy(breaker={"window_s": 60})
    with pytest.raises(PolicyError, match="window_s"):
        Controller(SMALL, pol, [], None, tick_s=120.0)
