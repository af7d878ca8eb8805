"""Shared parents (issue 37, point 2): when a share of one parent's children move together beyond
what independent child faults explain, the parent is flagged and explains them — decision tables
for the rule itself (two-member parents, half-the-group shifts, fleet-wide moves) and for each
facility parent: a cooling loop over its nodes, a rack (its manifold and power feed) over its
nodes — and a group of two (two storage paths), judged by each member's own history. Switches over
their links: tests/core/test_peer_groups.py; storage paths over their probers:
tests/core/test_agent_channels.py (the probe share).
"""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.assess.evidence import Evidence
from seamguard.assess.parents import ParentConfig, chance_alone, facility_parents, parent_shift
from seamguard.fleet import FleetShape, Kind, generate_fleet

CFG = ParentConfig()


def _table(groups: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(moved, parent) for parents given as (children, moved children)."""
    moved, parent = [], []
    for p, (kids, k) in enumerate(groups):
        moved += [True] * k + [False] * (kids - k)
        parent += [p] * kids
    return np.array(moved), np.array(parent)


# (parents as (children, moved), which are flagged)
RULE = [
    ([(2, 2)] + [(2, 0)] * 7, {0}),  # a parent of two: both moved together, nothing else moved
    ([(2, 1)] + [(2, 0)] * 7, set()),  # one of two: the child's own fault (a parent of two cannot tell)
    ([(8, 4)] + [(8, 0)] * 3, {0}),  # half the group shifts: the median sits between the halves
    ([(8, 3)] + [(8, 0)] * 3, set()),  # under half: the others' median still sees each one
    ([(4, 2)], {0}),  # the only parent: independent faults at the floor rate (2 %) rarely pair up
    ([(4, 2)] + [(4, 1)] * 9, set()),  # a quarter of every other parent's children moved: two here is chance
    ([(8, 4)] * 4, set()),  # every parent half moved: a fleet-wide move (load), nobody's parent
    ([(8, 8), (8, 4), (8, 0), (8, 0)], {0, 1}),  # two parents at once
]


@pytest.mark.parametrize("groups,flagged", RULE)
def test_a_parent_is_flagged_when_its_children_move_beyond_chance(groups, flagged):
    moved, parent = _table(groups)
    share, n_moved, score = parent_shift(moved, np.where(moved, 0.8, 0.0), parent, len(groups), CFG)
    assert set(np.flatnonzero(score > 0).tolist()) == flagged
    assert n_moved.tolist() == [float(k) for _, k in groups]
    assert np.allclose(score[list(flagged)], 0.8)  # the moved children's mean strength


def test_chance_alone_is_the_binomial_tail_at_the_other_parents_median_rate():
    # parent 0: 3 of 6 moved; the others moved 1/10, 2/20 and 8/8 (a parent's own fault) -> median 0.1
    p = chance_alone(np.array([3.0, 1.0, 2.0, 8.0]), np.array([6.0, 10.0, 20.0, 8.0]), CFG)
    rate = 0.1
    direct = sum(__import__("math").comb(6, j) * rate ** j * (1 - rate) ** (6 - j) for j in range(3, 7))
    assert p[0] == pytest.approx(direct)
    assert chance_alone(np.array([0.0]), np.array([4.0]), CFG)[0] == 1.0  # nothing moved: no evidence


# ---- facility parents over synthetic GPU evidence ----------------------------------------------------
FLEET = generate_fleet(FleetShape(gpus=256, gpus_per_node=8, nodes_per_rack=4, racks_per_loop=2,
                                  nodes_per_storage_path=8), seed=3)
CH = ("thermal_throttle", "thermal_drift", "temp_peer_z", "clock_deficit", "power_violation", "sbe_rate")
G = FLEET.count(Kind.GPU)


def _ev(kind: Kind, score: np.ndarray) -> Evidence:
    n = score.shape[0]
    chans = CH if kind == Kind.GPU else ("own",)
    return Evidence(kind, chans, ("x",) * len(chans), score, score.copy(), np.zeros(n, bool), np.zeros(n, bool))


def _gpus(nodes) -> np.ndarray:
    return np.flatnonzero(np.isin(FLEET.gpu_node, list(nodes)))


def _run(hot_nodes=(), capped_nodes=(), ecc_gpu: int | None = None):
    s = np.zeros((G, len(CH)))
    s[_gpus(hot_nodes), 0] = 0.8  # throttling
    s[_gpus(hot_nodes), 3] = 0.6  # and so its clock is down
    s[_gpus(capped_nodes), 4] = 0.7  # power brake
    s[_gpus(capped_nodes), 3] = 0.6
    if ecc_gpu is not None:
        s[ecc_gpu, 5] = 0.9
    gpu = _ev(Kind.GPU, s)
    out = facility_parents(FLEET, gpu, _ev(Kind.RACK, np.zeros((FLEET.count(Kind.RACK), 1))),
                           _ev(Kind.COOLING_LOOP, np.zeros((FLEET.count(Kind.COOLING_LOOP), 1))), CFG)
    return gpu, out


def _flagged(e: Evidence) -> set[int]:
    return set(np.flatnonzero(e.score[:, e.channels.index("children_moved")] > 0).tolist())


RACK0 = np.flatnonzero(FLEET.node_rack == 0).tolist()
LOOP0 = np.flatnonzero(FLEET.node_loop == 0).tolist()


def test_the_fleet_has_the_shape_the_tables_assume():
    assert len(RACK0) == 4 and len(LOOP0) == 8 and FLEET.count(Kind.COOLING_LOOP) == 4
    assert set(FLEET.node_rack[LOOP0].tolist()) == {0, 1}


def test_half_a_racks_nodes_braked_together_is_the_racks_power_feed():
    gpu, (g, rack, loop) = _run(capped_nodes=RACK0[:2], ecc_gpu=int(_gpus(RACK0[:1])[0]))
    assert _flagged(rack) == {0} and not _flagged(loop)
    r0 = rack.channels.index("children_moved")
    assert rack.value[0, r0] == pytest.approx(0.5) and rack.value[0, r0 + 1] == 2  # share, nodes
    braked = _gpus(RACK0[:2])
    assert (g.score[braked, CH.index("power_violation")] == 0).all()
    assert (g.score[braked, CH.index("clock_deficit")] == 0).all()  # the brake's clock deficit is the brake's
    assert (g.column("explained_by_rack")[braked] == 0).all()
    assert np.isnan(np.delete(g.column("explained_by_rack"), braked)).all()
    assert g.score[braked[0], CH.index("sbe_rate")] == pytest.approx(0.9)  # its own ECC fault stays its own


def test_one_nodes_power_brake_is_the_nodes_not_its_racks():
    gpu, (g, rack, loop) = _run(capped_nodes=RACK0[:1])
    assert not _flagged(rack) and not _flagged(loop)
    assert g is gpu  # nothing explained: the GPU evidence is untouched


def test_a_two_node_rack_needs_both_nodes():
    fleet = generate_fleet(FleetShape(gpus=128, gpus_per_node=8, nodes_per_rack=2, racks_per_loop=2,
                                      nodes_per_storage_path=8), seed=3)
    two = np.flatnonzero(fleet.node_rack == 0).tolist()
    assert len(two) == 2
    for capped, flagged in ((two[:1], set()), (two, {0})):
        s = np.zeros((fleet.count(Kind.GPU), len(CH)))
        s[np.isin(fleet.gpu_node, capped), 4] = 0.7
        _, rack, _ = facility_parents(fleet, _ev(Kind.GPU, s), _ev(Kind.RACK, np.zeros((fleet.count(Kind.RACK), 1))),
                                      _ev(Kind.COOLING_LOOP, np.zeros((fleet.count(Kind.COOLING_LOOP), 1))), CFG)
        assert _flagged(rack) == flagged


def test_every_node_of_a_loop_throttling_is_the_loops_not_each_racks():
    _, (g, rack, loop) = _run(hot_nodes=LOOP0)
    assert _flagged(loop) == {0} and not _flagged(rack)
    hot = _gpus(LOOP0)
    assert (g.score[hot, CH.index("thermal_throttle")] == 0).all()
    assert (g.column("explained_by_loop")[hot] == 0).all() and np.isnan(g.column("explained_by_rack")[hot]).all()


def test_heat_confined_to_one_rack_of_a_loop_is_the_racks():
    _, (g, rack, loop) = _run(hot_nodes=RACK0)  # half the loop's nodes, all of one rack's
    assert _flagged(rack) == {0} and not _flagged(loop)
    assert (g.column("explained_by_rack")[_gpus(RACK0)] == 0).all()


def test_half_a_loops_nodes_across_both_racks_is_the_loops():
    half = [n for r in (0, 1) for n in np.flatnonzero(FLEET.node_rack == r)[:2].tolist()]
    _, (g, rack, loop) = _run(hot_nodes=half)
    assert _flagged(loop) == {0} and not _flagged(rack)


def test_scattered_hot_nodes_across_the_fleet_are_nobodys_parent():
    # one node per loop: each loop's share is an eighth
    one_each = [int(np.flatnonzero(FLEET.node_loop == lp)[0]) for lp in range(FLEET.count(Kind.COOLING_LOOP))]
    gpu, (g, rack, loop) = _run(hot_nodes=one_each)
    assert not _flagged(loop) and not _flagged(rack) and g is gpu


# ---- through the assess stage: a rack that throttles together is one alarm, on the rack ---------------
def test_a_rack_throttling_together_is_one_alarm_on_the_rack_through_assess():
    """Every GPU at load in rack 0 throttles (its violation counter runs, its clock 30 % down) while
    the loop's flow and supply read normal: rack 0 is flagged, its GPUs are explained by it (on
    7e17a8a each of them was flagged instead and the rack never was)."""
    from seamguard.assess import State, assess, initial_states
    from seamguard.decide import default_policy
    from seamguard.observe import History
    from seamguard.twin.telemetry import Twin, TwinConfig

    pol, tick = default_policy(), 30.0
    fleet = generate_fleet(FleetShape(gpus=128, gpus_per_node=8, nodes_per_rack=4, racks_per_loop=2,
                                      nodes_per_storage_path=4), seed=2)
    twin = Twin(fleet, [], TwinConfig(tick_s=tick, warm_gpu_share=0.0), seed=4)
    hist, states, base = History(tick, 2, pol.assess.history_depths(tick)), initial_states(fleet), None
    rack0 = np.flatnonzero(fleet.gpu_rack == 0)
    viol, flagged = np.zeros(fleet.count(Kind.GPU)), {}
    warm = pol.assess.baselines.warm_samples + 5
    for t in range(warm + 8):
        frame = twin.step()
        if t >= warm:
            viol[rack0] += tick * 0.5e6
            frame.values["DCGM_FI_DEV_SM_CLOCK"][rack0] *= 0.7
        frame.values["DCGM_FI_DEV_THERMAL_VIOLATION"] = frame.values["DCGM_FI_DEV_THERMAL_VIOLATION"] + viol
        a = assess(fleet, frame, hist, states, pol.assess, base=base)
        hist.push(frame)
        states, base = {k: a.kinds[k].states for k in a.kinds}, a.baselines
        for tr in a.transitions:
            if tr.to_state != State.HEALTHY and tr.kind != Kind.NODE:
                flagged.setdefault(tr.kind, set()).add(tr.index)
    assert flagged.get(Kind.RACK) == {0} and not flagged.get(Kind.COOLING_LOOP)
    assert not flagged.get(Kind.GPU, set()) & set(rack0.tolist())
    g = a.kinds[Kind.GPU].evidence
    at_load = rack0[fleet.gpu_job[rack0] >= 0]
    assert (g.column("explained_by_rack")[at_load] == 0).all()
    reasons = a.kinds[Kind.RACK].reasons(0)
    assert reasons and reasons[0].channel == "children_moved" and reasons[0].value == pytest.approx(
        len(np.unique(fleet.gpu_node[at_load])) / 4)  # the share of its nodes that moved


# ---- a group of two: no peer verdict, the entity's own history --------------------------------------
@pytest.mark.parametrize("factor,flagged", [(1.0, None), (4.0, {0})])
def test_a_storage_path_with_one_peer_is_judged_by_its_own_floor(factor, flagged):
    """Two storage paths: each has one peer, so no peer ratio (NaN); path 0 slower than 4x its own
    floor for longer than its burst allowance is flagged by its own history, path 1 is not."""
    from seamguard.assess import State, assess, initial_states
    from seamguard.decide import default_policy
    from seamguard.observe import History
    from seamguard.twin.telemetry import Twin, TwinConfig

    pol, tick = default_policy(), 30.0
    fleet = generate_fleet(FleetShape(gpus=64, gpus_per_node=8, nodes_per_rack=4, racks_per_loop=2,
                                      nodes_per_storage_path=4), seed=2)
    assert fleet.count(Kind.STORAGE) == 2
    twin = Twin(fleet, [], TwinConfig(tick_s=tick, warm_gpu_share=0.0), seed=4)
    hist, states, base = History(tick, 2, pol.assess.history_depths(tick)), initial_states(fleet), None
    warm, found = pol.assess.baselines.warm_samples + 5, {}
    for t in range(warm + 16):  # 8 min slow: past the path's burst allowance
        frame = twin.step()
        if t >= warm:
            frame.values["seamguard_storage_write_latency_ms"][0] *= factor
        a = assess(fleet, frame, hist, states, pol.assess, base=base)
        hist.push(frame)
        states, base = {k: a.kinds[k].states for k in a.kinds}, a.baselines
        for tr in a.transitions:
            if tr.to_state != State.HEALTHY and tr.kind == Kind.STORAGE:
                found.setdefault(tr.kind, set()).add(tr.index)
    e = a.kinds[Kind.STORAGE].evidence
    assert np.isnan(e.column("latency_ratio")).all()  # one peer: no peer verdict
    assert found.get(Kind.STORAGE) == flagged
