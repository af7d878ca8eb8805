"""Issue 15 point 3, action hygiene: a decision that has not changed is not a new action.

- checkpoint_now is priced (rollback avoided vs the write) and asked at most once per
  risk episode of a job on a node, again only when the exposure gets stricter;
- the ledger records a held action when it becomes held and when it stops being held;
- a restriction is lifted only after its entity has been healthy for the policy's dwell,
  the state machine's own recovery ticks counted once.
"""

import math

import numpy as np
import pytest

from seamguard.act import LogActuator
from seamguard.act.base import ActionResult
from seamguard.assess.states import State
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.decide.actions import Verb
from seamguard.decide.economics import CheckpointContext, checkpoint_decision
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.ledger import Ledger
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=512), seed=2)
JOB = "job-00-high_sync_training"


class World:
    """An in-memory actuator: what it holds is what is in effect."""

    name = "world"
    verbs = frozenset(Verb)

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.log: list[tuple[int, str, str]] = []  # (tick, op, key)
        self.tick = 0

    def observe(self) -> set[str]:
        return set(self.held)

    def apply(self, action):
        self.held.add(action.key)
        self.log.append((self.tick, "apply", action.key))
        return ActionResult(True, "ok")

    def revert(self, key):
        self.held.discard(key)
        self.log.append((self.tick, "revert", key))
        return ActionResult(True, "ok")


def _job_node(fleet, job: str) -> int:
    return int(np.flatnonzero(fleet.node_job == fleet.job_names.index(job))[0])


def _checkpoints(log: LogActuator, job: str) -> list[str]:
    return [r["key"] for r in log.records() if r["op"] == "apply" and r["verb"] == "checkpoint_now"
            and r["target"] == job]


# ---- checkpoint_now: once per risk episode ------------------------------------------------

def test_flapping_node_gets_one_checkpoint_per_episode(tmp_path):
    """A node of a training job flaps degraded <-> healthy for two hours (healthy gaps shorter
    than an episode's end), then stays healthy past the episode's end, then flaps once more:
    two episodes, two checkpoint requests (the code before asked once per flap)."""
    tick_s = 15.0
    pol = default_policy(mode="enforce")
    end = pol.actions.episode_end_healthy_ticks
    log = LogActuator(tmp_path / "actions.jsonl")
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(FLEET, pol, [log], ledger, tick_s=tick_s)
    twin = Twin(FLEET, [], TwinConfig(tick_s=tick_s), seed=4)
    node = _job_node(FLEET, JOB)
    gpu = FLEET.gpu_names[int(np.flatnonzero(FLEET.gpu_node == node)[0])]
    # (ticks pinned degraded, ticks free afterwards): eight flaps ~35 min apart, a long calm, one more
    flaps = [(20, 60)] * 8 + [(1, end + 60), (20, 40)]
    starts, t = [], 0
    for bad, calm in flaps:
        starts.append(t)
        for k in range(bad + calm):
            if k == 0:
                ctl.pin(Kind.GPU, gpu, State.DEGRADED, "test: flapping GPU")
            if k == bad:
                ctl.unpin(Kind.GPU, gpu)
            rep = ctl.tick(twin.step())
            assert not rep.error, rep.error
            t += 1
    keys = _checkpoints(log, JOB)
    # the node went back to healthy between flaps (a real flap, not one long degradation)
    healthy_again = [tr for tr in ledger.transitions(entity=gpu) if tr["to_state"] == "healthy"]
    assert len(healthy_again) >= 9
    assert len(keys) == 2, keys
    assert len(set(keys)) == 2
    # one decided row per request in the ledger, no churn while the episode lasts
    decided = [d for d in ledger.decisions(event="decided") if d["verb"] == "checkpoint_now" and d["target"] == JOB]
    assert sorted(d["key"] for d in decided) == sorted(keys)


def test_one_request_per_episode_through_escalation_and_a_restart(tmp_path):
    """Degraded, then quarantined, then failed on the same node: one request for the whole
    episode (a failed node asks none); a controller restarted from the ledger does not ask
    again. With reask_on_worse the stricter state asks once more, when it pays."""
    tick_s = 15.0
    for reask, expected in ((False, 1), (True, 2)):
        base = default_policy(mode="enforce")
        pol = base.model_copy(update={"actions": base.actions.model_copy(update={"reask_on_worse": reask})})
        log = LogActuator(tmp_path / f"actions-{reask}.jsonl")
        path = tmp_path / f"l-{reask}.sqlite"
        ctl = Controller(FLEET, pol, [log], Ledger(path), tick_s=tick_s)
        twin = Twin(FLEET, [], TwinConfig(tick_s=tick_s), seed=4)
        node = _job_node(FLEET, JOB)
        gpu = FLEET.gpu_names[int(np.flatnonzero(FLEET.gpu_node == node)[0])]
        ctl.pin(Kind.GPU, gpu, State.DEGRADED, "test")
        for _ in range(30):
            ctl.tick(twin.step())
        assert len(_checkpoints(log, JOB)) == 1
        ctl.pin(Kind.GPU, gpu, State.QUARANTINE, "test")
        for _ in range(60):  # past Young's interval at the quarantined node's hazard
            ctl.tick(twin.step())
        assert len(_checkpoints(log, JOB)) == expected, reask
        ctl.pin(Kind.GPU, gpu, State.FAILED, "test")
        for _ in range(30):
            ctl.tick(twin.step())
        assert len(_checkpoints(log, JOB)) == expected, reask
        ctl.ledger.close()
        ctl2 = Controller(FLEET, pol, [log], Ledger(path), tick_s=tick_s)
        assert ctl2.pins  # restored: still failed
        for _ in range(30):
            ctl2.tick(twin.step())
        assert len(_checkpoints(log, JOB)) == expected, reask
        ctl2.ledger.close()


# ---- checkpoint_now: only when it pays --------------------------------------------------------

def _expected_benefit(gpus, uncommitted_s, horizon_s, hazard_per_h):
    return (1.0 - math.exp(-hazard_per_h * horizon_s / 3600.0)) * uncommitted_s * gpus / 3600.0


@pytest.mark.parametrize("uncommitted_s, horizon_s, hazard_per_h, write_s, pays", [
    (900.0, 900.0, 0.125, 20.0, True),     # degraded node, half an interval uncommitted: 28 s > 20 s
    (900.0, 900.0, 0.125, 60.0, False),    # same exposure, a slow write: 28 s < 60 s
    (30.0, 1770.0, 0.5, 20.0, False),      # just checkpointed: little to lose
    (900.0, 900.0, 0.0, 20.0, False),      # no hazard, no benefit
    (300.0, 1500.0, 5.0, 20.0, True),      # failure near-certain: 264 s > 20 s
    (600.0, 0.0, 5.0, 20.0, False),        # the scheduled checkpoint is due now anyway
])
def test_checkpoint_economics_decision_table(uncommitted_s, horizon_s, hazard_per_h, write_s, pays):
    gpus = 256
    d = checkpoint_decision(CheckpointContext(job_gpus=gpus, uncommitted_s=uncommitted_s, horizon_s=horizon_s,
                                              hazard_per_h=hazard_per_h, write_s=write_s))
    assert d.benefit_gpu_h == pytest.approx(_expected_benefit(gpus, uncommitted_s, horizon_s, hazard_per_h))
    assert d.cost_gpu_h == pytest.approx(gpus * write_s / 3600.0)
    assert (d.action == "checkpoint") is pays


@pytest.mark.parametrize("write_s, asked", [(20.0, True), (120.0, False)])
def test_checkpoint_that_costs_more_than_it_saves_is_not_asked(tmp_path, write_s, asked):
    """The same degraded exposure (default 30 min cadence: 15 min uncommitted, P(failure in
    the next 15 min) about 3 %, i.e. ~28 s of rollback per GPU): a 20 s write pays, a 120 s
    one does not."""
    pol = default_policy(mode="enforce", actions={"checkpoint_write_s": write_s})
    log = LogActuator(tmp_path / "actions.jsonl")
    ctl = Controller(FLEET, pol, [log], None, tick_s=15.0)
    twin = Twin(FLEET, [], TwinConfig(tick_s=15.0), seed=4)
    node = _job_node(FLEET, JOB)
    gpu = FLEET.gpu_names[int(np.flatnonzero(FLEET.gpu_node == node)[0])]
    ctl.pin(Kind.GPU, gpu, State.DEGRADED, "test")
    for _ in range(20):
        ctl.tick(twin.step())
    assert bool(_checkpoints(log, JOB)) is asked


# ---- the ledger: one row per change, also for held actions ---------------------------------

def test_held_drain_is_two_ledger_rows_not_one_per_tick(tmp_path):
    """Three sick nodes in one rack of four: the rack bound (50 %) holds the third drain, tick
    after tick, without tripping the fleet. One `held_by_breaker` row when it becomes held;
    when one of the others recovers and is returned, the third is admitted: one `decided`
    row. The code before wrote a held row on every tick."""
    fleet = FLEET
    rack = np.flatnonzero(fleet.node_rack == fleet.node_rack[5])
    sick_nodes = [int(n) for n in rack if n != 5][:2] + [5]
    pol = default_policy(mode="enforce", breaker={"window_s": 120})  # a short rate window: the rack bound holds
    ledger = Ledger(tmp_path / "l.sqlite")
    world = World()
    ctl = Controller(fleet, pol, [world], ledger, tick_s=5.0)
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    first = np.isin(fleet.gpu_node, sick_nodes[:1])
    rest = np.isin(fleet.gpu_node, sick_nodes[1:])
    held_ticks, held_keys = 0, set()
    for i in range(130):
        f = twin.step()
        if 3 <= i < 20:
            twin.gpu_sbe[first] += 20
        if i >= 3:
            twin.gpu_sbe[rest] += 20
        rep = ctl.tick(f)
        drains = {a.key for a in rep.decisions.held if a.verb == Verb.DRAIN}
        held_ticks += bool(drains)
        held_keys |= drains
    assert not ctl.breaker.tripped
    assert len(held_keys) == 1 and held_ticks >= 30
    key = held_keys.pop()
    assert key in world.held, "admitted once the rack had room"
    rows = [d for d in reversed(ledger.decisions()) if d["key"] == key]
    assert [r["event"] for r in rows] == ["held_by_breaker", "decided"]
    assert all(d["key"] != key for d in ledger.decisions(event="held_by_breaker")[1:])


def test_held_action_whose_cause_goes_away_is_withdrawn_once(tmp_path):
    fleet = FLEET
    # one node per window (the least a breaker allows), taken by node 0 first
    pol = default_policy(mode="enforce", breaker={"max_fleet_fraction": 0.01, "min_nodes": 1})
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(fleet, pol, [World()], ledger, tick_s=5.0)
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    sick = np.isin(fleet.gpu_node, [5])
    key = "drain:" + fleet.node_names[5]
    held_ticks = 0
    for i in range(90):
        f = twin.step()
        if i < 20:
            twin.gpu_sbe[fleet.gpu_node == 0] += 20
        if 3 <= i < 20:
            twin.gpu_sbe[sick] += 20
        rep = ctl.tick(f)
        held_ticks += any(a.key == key for a in rep.decisions.held)
    assert held_ticks >= 30
    events = [d["event"] for d in reversed(ledger.decisions()) if d["key"] == key]
    # a row when it becomes held and one when it stops (the drain's economics may flip at the
    # margin for a tick, which is a change and recorded as one): never a row per tick
    assert events[0] == "held_by_breaker" and events[-1] == "withdrawn"
    assert all(a != b for a, b in zip(events, events[1:])), events
    assert len(events) <= 4, events
    last = next(d for d in ledger.decisions() if d["key"] == key)
    assert "held by the breaker" in last["reason"] and last["target"] == fleet.node_names[5]


# ---- restrictions: lifted after sustained recovery ----------------------------------------------

def _drain_then_recover(policy, ticks=140):
    """A node drained for correctable-error storms, then quiet: (tick its GPU went healthy,
    tick the drain was reverted)."""
    fleet = FLEET
    world = World()
    ctl = Controller(fleet, policy, [world], None, tick_s=5.0)
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    node = 3
    gpus = np.flatnonzero(fleet.gpu_node == node)
    key = "drain:" + fleet.node_names[node]
    healthy_at = None
    for i in range(ticks):
        world.tick = i
        f = twin.step()
        if 3 <= i < 15:
            twin.gpu_sbe[gpus] += 20
        rep = ctl.tick(f)
        for tr in rep.assessment.transitions:
            if tr.kind == Kind.GPU and tr.index in gpus and tr.to_state == State.HEALTHY:
                healthy_at = i
    applied = [t for t, op, k in world.log if k == key and op == "apply"]
    reverted = [t for t, op, k in world.log if k == key and op == "revert"]
    assert applied, "the sick node was drained"
    assert healthy_at is not None and reverted, (healthy_at, reverted)
    return healthy_at, reverted[0]


def test_restriction_is_not_lifted_on_the_first_healthy_tick():
    pol = default_policy(mode="enforce")
    rel = pol.actions.release_after_healthy_ticks
    rec = pol.assess.hysteresis_for(Kind.GPU).recover_ticks
    healthy_at, reverted_at = _drain_then_recover(pol)
    assert reverted_at > healthy_at
    # the state machine's recovery ticks count toward the dwell once, not on top of it
    assert reverted_at - healthy_at == rel - rec


def test_dwell_holds_when_assess_recovers_on_one_calm_tick():
    """With a state machine tuned to recover on one calm tick, the policy's dwell alone keeps
    the restriction: one healthy tick after a bad one does not lift it."""
    pol = default_policy(mode="enforce", assess={"hysteresis": {"gpu": {"recover_ticks": 1, "min_dwell_ticks": 0}}})
    healthy_at, reverted_at = _drain_then_recover(pol)
    assert reverted_at - healthy_at == pol.actions.release_after_healthy_ticks - 1


def test_removed_policy_field_is_named():
    from seamguard.decide import PolicyError, parse_policy
    with pytest.raises(PolicyError, match="severe_checkpoint_interval_s was removed"):
        parse_policy({"actions": {"severe_checkpoint_interval_s": 120}}, "p.yaml")
