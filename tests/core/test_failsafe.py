"""Issue 14: a controller that fails safe — inputs that fail, restrictions that only tighten.

Each test reproduces a defect an operator hit: a telemetry outage that labelled every
node and checkpointed every job, and a cooling loop that turned harmful and lost the
restriction on its nodes.
"""

import numpy as np

from seamguard.assess.states import State
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.decide.actions import ActionKey, Verb
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.ledger import Ledger
from seamguard.observe import make_frame
from seamguard.observe.signals import REGISTRY
from seamguard.twin.telemetry import Twin, TwinConfig

from .world import World

FLEET = generate_fleet(FleetShape(gpus=256), seed=3)
BIG = generate_fleet(FleetShape(gpus=2048), seed=3)


def _outage_frame(fleet, t_s):
    """Prometheus unreachable: every signal absent (NaN), every query flagged."""
    flags = tuple(f"prometheus:{s}:retryable: connection refused" for s in REGISTRY)
    return make_frame(fleet, t_s, {}, flags)


def _go_dark(fleet, frame, nodes):
    """Every per-GPU, per-NIC and per-link series of ``nodes`` missing in ``frame``."""
    edge = fleet.link_nic >= 0
    link_node = np.full(fleet.link_nic.shape[0], -1)
    link_node[edge] = fleet.nic_node[fleet.link_nic[edge]]
    owner = {Kind.GPU: fleet.gpu_node, Kind.NIC: fleet.nic_node, Kind.LINK: link_node}
    for name, arr in frame.values.items():
        sig = REGISTRY.get(name)
        if sig is not None and sig.kind in owner:
            arr[np.isin(owner[sig.kind], nodes)] = np.nan


def test_telemetry_outage_takes_no_new_action_and_records_the_freeze(tmp_path):
    twin = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4)
    world = World()
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(FLEET, default_policy(mode="enforce"), [world], ledger, tick_s=5.0)
    sick = np.flatnonzero(FLEET.gpu_node == 5)
    for i in range(12):  # a real fault first: node 5 drained on evidence
        f = twin.step()
        if i >= 3:
            twin.gpu_sbe[sick] += 20
        ctl.tick(f)
    before = set(world.held)
    assert f"drain:{FLEET.node_names[5]}" in before
    n_applied = len(world.applied)
    t = f.t_s
    reports = []
    for i in range(20):  # ten minutes of outage
        t += 5.0
        reports.append(ctl.tick(_outage_frame(FLEET, t)))
    assert not any(r.error for r in reports)
    assert world.applied[n_applied:] == [], "an outage caused new actions"
    assert world.held == before, "an action in effect was reverted because data vanished"
    assert all(r.decisions.frozen for r in reports)
    assert "fleet" in {s.scope for s in reports[-1].decisions.frozen}
    assert ctl.failsafe.frozen_scopes()
    events = [e["event"] for e in ledger.failsafe_events()]
    assert "frozen" in events
    # data comes back: after the re-warm ticks the freeze lifts, still with no new action
    for i in range(15):
        twin.t_s = t
        f = twin.step()
        t = f.t_s
        twin.gpu_sbe[sick] += 20
        rep = ctl.tick(f)
    assert not rep.decisions.frozen
    assert "resumed" in [e["event"] for e in ledger.failsafe_events()]
    new = [k for k in world.applied[n_applied:] if not k.startswith("checkpoint_now:")]
    assert new == [], new


def test_one_node_absent_while_its_peers_report_is_still_evidence():
    twin = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4)
    world = World()
    ctl = Controller(FLEET, default_policy(mode="enforce"), [world], None, tick_s=5.0)
    gone = np.flatnonzero(FLEET.gpu_node == 7)
    nics = np.flatnonzero(FLEET.nic_node == 7)
    for i in range(10):
        f = twin.step()
        if i >= 3:
            f.values["DCGM_FI_DEV_GPU_TEMP"][gone] = np.nan
            f.values["node_infiniband_state_id"][nics] = np.nan
        rep = ctl.tick(f)
    assert not rep.decisions.frozen
    assert int(rep.assessment.node_state[7]) != State.HEALTHY
    assert any(ActionKey.parse(k).entity == FLEET.node_names[7] for k in world.held)


def test_harmful_cooling_loop_tightens_its_nodes_restrictions_never_drops_them():
    twin = Twin(BIG, [], TwinConfig(tick_s=5.0), seed=4)
    world = World()
    ctl = Controller(BIG, default_policy(mode="enforce"), [world], None, tick_s=5.0)
    loop = BIG.loop_names[2]
    on_loop = [BIG.node_names[i] for i in np.flatnonzero(BIG.node_loop == 2)]
    for _ in range(3):
        ctl.tick(twin.step())
    ctl.pin(Kind.COOLING_LOOP, loop, State.DEGRADED, "test: loop losing flow")
    for _ in range(3):
        ctl.tick(twin.step())

    def restriction(node):
        keys = [ActionKey.parse(k) for k in world.held]
        if any(k.verb == Verb.DRAIN and k.entity == node for k in keys):
            return 99
        labels = [k for k in keys if k.verb == Verb.LABEL_DEGRADED and k.entity == node]
        if not labels:
            return 0
        classes = [c for c in labels[0].value.split(",") if c and c != "none"]
        return 10 - len(classes)  # fewer admissible classes: stricter

    degraded = {n: restriction(n) for n in on_loop}
    assert all(v > 0 for v in degraded.values()), "a degraded loop restricts its nodes"
    ctl.pin(Kind.COOLING_LOOP, loop, State.HARMFUL, "test: loop harmful")
    for _ in range(4):
        rep = ctl.tick(twin.step())
        assert not rep.error
        for n in on_loop:
            assert restriction(n) > degraded[n], f"{n} lost or kept its restriction while its loop got worse"


def test_a_freeze_is_scoped_to_the_loop_that_went_dark():
    twin = Twin(BIG, [], TwinConfig(tick_s=5.0), seed=4)
    world = World()
    ctl = Controller(BIG, default_policy(mode="enforce"), [world], None, tick_s=5.0)
    dark_nodes = np.flatnonzero(BIG.node_loop == 3)
    for i in range(12):
        f = twin.step()
        if i >= 3:  # every series of those nodes (GPUs, NICs, their links) and the loop's flow
            _go_dark(BIG, f, dark_nodes)
            f.values["seamguard_coolant_flow_lpm"][3] = np.nan
        rep = ctl.tick(f)
    scopes = {s.scope for s in rep.decisions.frozen}
    assert f"cooling_loop:{BIG.loop_names[3]}" in scopes and "fleet" not in scopes
    assert not world.held, world.held


def test_a_node_is_dark_only_when_every_series_expected_of_it_is_missing():
    from seamguard.assess.quality import PRESENCE_SIGNALS, dark_nodes

    f = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4).step()
    expected = set(f.values) | set(PRESENCE_SIGNALS)
    assert not dark_nodes(FLEET, f, expected).any()
    # no GPU telemetry anywhere (no NVML, no dcgm-exporter): the agents' NIC and link series still report
    for name in list(f.values):
        if REGISTRY[name].kind == Kind.GPU:
            f.values[name][:] = np.nan
    assert not dark_nodes(FLEET, f, expected).any()
    # node 5's NICs and links go quiet too: now every series of node 5 is missing, and only node 5 is dark
    _go_dark(FLEET, f, [5])
    assert list(np.flatnonzero(dark_nodes(FLEET, f, expected))) == [5]
    # a node whose GPUs stopped reporting while its NICs report has failed GPUs, not failed telemetry
    g = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4).step()
    for name in g.values:
        if REGISTRY[name].kind == Kind.GPU:
            g.values[name][FLEET.gpu_node == 9] = np.nan
    assert not dark_nodes(FLEET, g, expected).any()


def test_a_loop_with_no_gpu_telemetry_is_not_frozen_while_its_agents_report():
    from seamguard.assess.quality import FailsafeConfig, bad_scopes

    f = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4).step()
    for name in list(f.values):
        if REGISTRY[name].kind == Kind.GPU:
            del f.values[name]  # never scraped: no GPU exporter on this cluster
    bad, _ = bad_scopes(FLEET, f, FailsafeConfig(), ())
    assert not [s for s in bad if s == "fleet" or s.startswith(("cooling_loop:", "rack:"))], bad
