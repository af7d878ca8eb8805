"""Peer groups that cannot fool themselves (issue 37, point 2): decision tables.

- an entity is never its own peer (leave-one-out median and MAD, exact);
- a group with fewer than 3 others gives no peer verdict: the entity is judged by its own
  history (a 2-uplink fabric still sees its slow uplink);
- when a share of one parent's children move together (half the uplinks through one spine,
  every NIC link on one leaf: the group's median sits between the halves), the parent is
  flagged and the children are explained by it: one alarm, on the parent, not N.
"""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.assess import State, assess, initial_states
from seamguard.assess.baselines import Baselines
from seamguard.assess.stats import loo_median, loo_robust_z
from seamguard.decide import default_policy
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe import History
from seamguard.twin.telemetry import Twin, TwinConfig

TICK = 30.0
POL = default_policy()
LAT = "seamguard_fabric_link_latency_us"


# ---- leave-one-out statistics ---------------------------------------------------------------
# (values of one group, entity, its peer median, its peer count): never itself in its own median
LOO_CASES = [
    ([10.0, 20.0], 0, 20.0, 1),  # two members: each one's peer is the other
    ([10.0, 10.0, 40.0], 2, 10.0, 2),  # the outlier's median is the others' (was 10 with itself too)
    ([10.0, 12.0, 40.0, 41.0], 3, 12.0, 3),  # half the group high: the high one sees the low half's middle
    ([10.0, np.nan, 14.0, 16.0], 1, 14.0, 3),  # no value of its own: every member with one is a peer
]


@pytest.mark.parametrize("values,i,median,peers", LOO_CASES)
def test_leave_one_out_median_never_holds_the_entity(values, i, median, peers):
    x = np.array(values)
    med, n = loo_median(x, np.zeros(len(x), dtype=np.int64), 1)
    assert med[i] == pytest.approx(median) and n[i] == peers


def test_leave_one_out_z_matches_a_direct_computation_and_needs_three_peers():
    rng = np.random.default_rng(7)
    x = rng.normal(50.0, 2.0, 400)
    x[rng.integers(0, 400, 30)] = np.nan
    g = rng.integers(0, 60, 400)  # groups of 0..15 members: many too small
    z, med, peers = loo_robust_z(x, g, 60, floor=0.1)
    for i in range(400):
        others = x[(g == g[i]) & (np.arange(400) != i) & np.isfinite(x)]
        assert peers[i] == len(others)
        if len(others) < 3 or not np.isfinite(x[i]):
            assert np.isnan(z[i])
            continue
        m = np.median(others)
        scale = max(1.4826 * np.median(np.abs(others - m)), 0.1)
        assert med[i] == pytest.approx(m) and z[i] == pytest.approx((x[i] - m) / scale)


# ---- the assess stage over a twin ------------------------------------------------------------
class Loop:
    def __init__(self, fleet, seed: int = 4) -> None:
        self.fleet = fleet
        self.twin = Twin(fleet, [], TwinConfig(tick_s=TICK, warm_gpu_share=0.0), seed=seed)
        self.hist = History(TICK, 2, POL.assess.history_depths(TICK))
        self.states = initial_states(fleet)
        self.base: Baselines | None = None
        self.flagged: dict[Kind, set[int]] = {}

    def tick(self, slow: np.ndarray | None = None, factor: float = 1.0):
        frame = self.twin.step()
        if slow is not None:
            frame.values[LAT][slow] *= factor
        a = assess(self.fleet, frame, self.hist, self.states, POL.assess, base=self.base)
        self.hist.push(frame)
        self.states = {k: a.kinds[k].states for k in a.kinds}
        self.base = a.baselines
        for t in a.transitions:
            if t.to_state != State.HEALTHY and t.kind != Kind.NODE:
                self.flagged.setdefault(t.kind, set()).add(t.index)
        return a

    def run(self, ticks: int, slow=None, factor: float = 1.0):
        for _ in range(ticks):
            a = self.tick(slow, factor)
        return a


WARM_TICKS = POL.assess.baselines.warm_samples + 5


def _two_rail_fleet(spines: int):
    # 2 rails: 2 leaves, each holds half of the NIC links; every leaf has one uplink per spine.
    return generate_fleet(FleetShape(gpus=64, gpus_per_node=8, nodes_per_rack=4, racks_per_loop=2, rails=2,
                                     nodes_per_unit=32, spines=spines, nodes_per_storage_path=4), seed=2)


def test_a_tier_of_two_uplinks_still_sees_its_slow_uplink_by_its_own_floor():
    """2 uplinks: each has one peer, so the tier cannot judge it (before: a median that held
    itself, z never reached its floor, nothing was flagged); its own floor does."""
    fleet = _two_rail_fleet(spines=1)
    uplinks = np.flatnonzero(fleet.link_nic < 0)
    assert len(uplinks) == 2
    loop = Loop(fleet)
    loop.run(WARM_TICKS)
    a = loop.run(6, slow=uplinks[:1], factor=3.0)
    assert a.kinds[Kind.LINK].states.state[uplinks[0]] != State.HEALTHY
    assert loop.flagged.get(Kind.LINK, set()) == {int(uplinks[0])}
    assert not loop.flagged.get(Kind.SWITCH)  # one of two children moved: its own fault, not the spine's


def test_every_nic_link_of_one_leaf_is_one_alarm_on_the_leaf():
    """Half of the NIC-link tier sits on leaf 0; all of it slows 2.5x. The tier's median sits
    between the halves; the leaf is flagged and its links are explained by it, not flagged."""
    fleet = _two_rail_fleet(spines=2)
    leaf0 = int(fleet.link_leaf[0])
    on_leaf = np.flatnonzero((fleet.link_nic >= 0) & (fleet.link_leaf == leaf0))
    assert len(on_leaf) * 2 == int((fleet.link_nic >= 0).sum())
    loop = Loop(fleet)
    loop.run(WARM_TICKS)
    a = loop.run(6, slow=on_leaf, factor=2.5)
    assert loop.flagged.get(Kind.SWITCH) == {leaf0}
    assert not loop.flagged.get(Kind.LINK)
    links = a.kinds[Kind.LINK].evidence
    assert (links.column("explained_by")[on_leaf] == leaf0).all()
    reasons = a.kinds[Kind.SWITCH].reasons(leaf0)
    assert reasons and reasons[0].channel == "children_moved" and reasons[0].value == pytest.approx(
        len(on_leaf) / (len(on_leaf) + 2))  # its NIC links moved, its 2 uplinks did not


def test_half_the_uplinks_through_one_spine_flag_the_spine_not_the_links():
    """Two spines: every leaf's uplink to spine 0 slows 2.5x, half of the uplink tier."""
    fleet = _two_rail_fleet(spines=2)
    spine0 = int(fleet.link_spine[fleet.link_nic < 0][0])
    through = np.flatnonzero(fleet.link_spine == spine0)
    loop = Loop(fleet)
    loop.run(WARM_TICKS)
    a = loop.run(6, slow=through, factor=2.5)
    assert loop.flagged.get(Kind.SWITCH) == {spine0}
    assert not loop.flagged.get(Kind.LINK)
    assert (a.kinds[Kind.LINK].evidence.column("explained_by")[through] == spine0).all()


def test_one_slow_uplink_of_many_is_the_links_own_fault():
    fleet = _two_rail_fleet(spines=4)
    uplinks = np.flatnonzero(fleet.link_nic < 0)
    loop = Loop(fleet)
    loop.run(WARM_TICKS)
    a = loop.run(6, slow=uplinks[:1], factor=3.0)
    assert loop.flagged.get(Kind.LINK) == {int(uplinks[0])}
    assert not loop.flagged.get(Kind.SWITCH)
    assert np.isnan(a.kinds[Kind.LINK].evidence.column("explained_by")).all()
