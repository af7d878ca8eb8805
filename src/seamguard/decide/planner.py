"""Assessment -> desired state. Pure: no clock, no I/O.

The objective is explicit: preserve useful throughput and minimise failure
amplification, weighted by job criticality. Each action states its benefit (the FAE it
removes, weighted) and its cost (capacity it takes away, migrations it forces), both in
healthy GPU-hours per hour, and is taken only when the benefit pays for the cost. The
breaker then bounds how much the controller may disrupt.

``decide`` is the sequence of stages, each a pure function below (or in
decide/checkpoints.py, decide/freeze.py, decide/restrictions.py, decide/shed.py): drains
and labels by economics, checkpoint_now per risk episode, fabric/storage avoidance,
move_job, shedding, the freeze, the breaker, restrictions that only tighten, release
after sustained recovery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.assess.assessment import Assessment, node_cause
from seamguard.assess.quality import FreezeView
from seamguard.assess.states import STATE_BY_LABEL, State
from seamguard.decide.actions import Action, ActionKey, Decisions, Verb, action_key
from seamguard.decide.breaker import BreakerState, InEffect, Request, admit, admit_returns
from seamguard.decide.checkpoints import (
    Episode,
    exposure,
    plan_checkpoints,
    plan_move_checkpoints,
    undo_unasked,
)
from seamguard.decide.economics import (
    DegradedNodeContext,
    EconomicDecision,
    quarantine_decision,
)
from seamguard.decide.durations import FaultClock, Remaining, onsets
from seamguard.decide.explain import evidence as _evidence
from seamguard.decide.explain import kept
from seamguard.decide.explain import summary as _summary
from seamguard.decide.freeze import apply_freeze
from seamguard.decide.intervals import plan_checkpoint_intervals
from seamguard.decide.policy import ActionRules, Policy
from seamguard.decide.restrictions import (
    RESTRICTS_NODE,
    at_risk,
    only_tighten,
    release_dwell,
)
from seamguard.decide.schedule import (
    Schedule,
    checkpoints_with_slip,
    drain_slip_s,
    move_slip_s,
    schedule,
    shed_priority,
    slip_evidence,
    slip_gpu_h,
    with_slip,
)
from seamguard.decide.shed import loop_fault, loop_nodes, plan_sheds
from seamguard.fleet.model import (
    JOB_CLASS_BY_LABEL,
    JOB_CLASS_SYNCHRONY,
    Fleet,
    JobClass,
    Kind,
)

__all__ = ["DecideState", "Episode", "decide", "healthy_ticks"]

# A stage's output: the actions it wants, each with what the breaker counts of it.
Planned = list[tuple[Action, Request]]


@dataclass(frozen=True)
class DecideState:
    """What decide carries from tick to tick: the breaker and the jobs' risk episodes."""

    breaker: BreakerState = field(default_factory=BreakerState)
    episodes: tuple[Episode, ...] = ()
    # (job, t_s of its last checkpoint_now): bounds the work since its last checkpoint, and
    # names the request an open episode carries (its key ends in @t<int(t_s)>)
    checkpoints: tuple[tuple[str, float], ...] = ()
    # (move key, t_s of the checkpoint_now asked before it): carried until the move is in effect
    move_checkpoints: tuple[tuple[str, float], ...] = ()
    # ("kind:name", t_s it left healthy) of each node and cooling loop out of healthy: a fault's age,
    # which its expected remaining duration is priced at (decide/durations.py)
    onsets: tuple[tuple[str, float], ...] = ()

    def to_json(self) -> dict:
        return {"breaker": self.breaker.to_json(),
                "episodes": [[e.job, e.node, e.level, e.hazard_per_h] for e in self.episodes],
                "checkpoints": [list(x) for x in self.checkpoints],
                "move_checkpoints": [list(x) for x in self.move_checkpoints],
                "onsets": [list(x) for x in self.onsets]}

    @classmethod
    def from_json(cls, d: dict) -> DecideState:
        eps = tuple(Episode(str(e[0]), str(e[1]), int(e[2]), float(e[3]) if len(e) > 3 else 0.0)
                    for e in d.get("episodes", []))
        ck = [(str(j), float(t)) for j, t in d.get("checkpoints", [])]
        ck += [(str(j), float(t)) for j, _, t in d.get("exposure", [])]  # before episodes: (job, level, t_s)
        mv = tuple((str(k), float(t)) for k, t in d.get("move_checkpoints", []))
        on = tuple((str(k), float(t)) for k, t in d.get("onsets", []))
        return cls(BreakerState.from_json(d["breaker"]), eps, tuple(ck), mv, on)


def _codes(labels: list[str]) -> np.ndarray:
    """State labels from the policy as the assessment's int8 state codes."""
    return np.array([STATE_BY_LABEL[s] for s in labels], dtype=np.int8)


def healthy_ticks(fleet: Fleet, a: Assessment, policy: Policy) -> tuple[dict[Kind, np.ndarray], np.ndarray]:
    """Ticks each entity has been healthy, per kind, and per node (its worst component).

    An entity in ``healthy`` has been healthy for the ticks it has dwelt there plus the
    ``recover_ticks`` of calm evidence its state machine needed to get there, so the
    state machine's own hysteresis counts once, not on top. 0 while not healthy. A node is
    as healthy as the least healthy of its GPUs, NICs, their leaf links, its rack and its
    cooling loop (the domains that decide its restrictions).
    """
    out: dict[Kind, np.ndarray] = {}
    for kind, ka in a.kinds.items():
        sv = ka.states
        rec = policy.assess.hysteresis_for(kind).recover_ticks
        out[kind] = np.where(sv.state == State.HEALTHY, sv.dwell.astype(np.int64) + rec, 0)
    big = np.iinfo(np.int64).max
    node = np.full(fleet.count(Kind.NODE), big, dtype=np.int64)
    np.minimum.at(node, fleet.gpu_node, out[Kind.GPU])
    np.minimum.at(node, fleet.nic_node, out[Kind.NIC])
    edge = fleet.link_nic >= 0
    np.minimum.at(node, fleet.nic_node[fleet.link_nic[edge]], out[Kind.LINK][edge])
    node = np.minimum(node, np.minimum(out[Kind.COOLING_LOOP][fleet.node_loop], out[Kind.RACK][fleet.node_rack]))
    return out, node


def criticality_weights(fleet: Fleet, policy: Policy) -> tuple[np.ndarray, np.ndarray]:
    """(per job, per node) weights of harm: criticality^exponent; a node weighs its job's, idle ones idle_criticality."""
    obj = policy.objective
    crit = fleet.job_criticality ** obj.criticality_exponent
    node_job = fleet.node_job
    node_w = np.where(node_job >= 0, crit[np.maximum(node_job, 0)] if len(crit) else 1.0, obj.idle_criticality)
    return crit, node_w


def spare_nodes(fleet: Fleet, a: Assessment, in_effect: set[str]) -> tuple[np.ndarray, set[str]]:
    """(healthy idle nodes fit for any work and not drained, the nodes drained now): where evacuated work lands."""
    free = (fleet.node_job < 0) & (a.node_state == State.HEALTHY) & a.admissible.all(axis=1)
    drained_now = {ak.entity for ak in map(ActionKey.parse, in_effect) if ak.verb == Verb.DRAIN}
    if drained_now:
        free &= ~np.isin(np.array(fleet.node_names), list(drained_now))
    return free, drained_now


def quarantine_pays(fleet: Fleet, a: Assessment, policy: Policy, i: int, weight: float, slowdown: float,
                    spares_left: int, drained: bool, sched: Schedule | None = None,
                    remaining_h: float | None = None) -> EconomicDecision:
    """The economics of draining node ``i`` (decide/economics.py): the job's loss and hazard vs swap and capacity,
    plus the deadline slip the swap saves (:func:`drain_slip_s`, 0 without a deadline); the loss and hazard
    over ``remaining_h``, the fault's expected remaining time (None: the planning horizon)."""
    obj, prop = policy.objective, policy.assess.propagation
    j = int(fleet.node_job[i])
    saved = drain_slip_s(fleet, a, policy, i, slowdown, sched)
    return quarantine_decision(DegradedNodeContext(
        job_class=JobClass(int(fleet.job_class[j])), criticality=weight,
        job_gpus=int(float(fleet.job_gpu_count[j])), node_gpus=int(fleet.node_gpu_count[i]),
        slowdown=slowdown, hazard_multiplier=1.0 + float(a.node_gfs[i]) ** 2,
        node_hazard_per_h=prop.hazard_per_h_at_gfs1,
        loss_per_failure_h=prop.checkpoint_interval_h / 2.0 + prop.restart_h,
        horizon_h=obj.horizon_h if remaining_h is None else remaining_h, swap_cost_s=obj.migrate_h * 3600.0,
        spare_available=spares_left > 0 or drained, hold_h=obj.hold_h,
        removed_capacity_value=0.0 if spares_left > 0 else 1.0,
        slip_saved_gpu_h=slip_gpu_h(fleet, sched, j, saved[0]) if sched is not None else 0.0))


def component_kind(fleet: Fleet, name: str) -> Kind:
    """GPU or NIC, whichever ``name`` is (node_cause's worst component); NODE when neither."""
    for kind in (Kind.GPU, Kind.NIC):
        try:
            fleet.index_of(kind, name)
            return kind
        except KeyError:
            continue
    return Kind.NODE


def node_fault(fleet: Fleet, a: Assessment, i: int, clock: FaultClock | None) -> Remaining | None:
    """The expected remaining time of node ``i``'s fault: its worst component's domain (gpu, nic), else the
    node's, class hard once failed, gray before; None without a clock."""
    if clock is None:
        return None
    dom = component_kind(fleet, node_cause(fleet, a.kinds, i)[0]).label
    cls = "hard" if a.node_state[i] == State.FAILED else "gray"
    return clock.remaining(f"{Kind.NODE.label}:{fleet.node_names[i]}", ((dom, cls), (Kind.NODE.label, cls)))


def plan_drains(fleet: Fleet, a: Assessment, policy: Policy, node_w: np.ndarray, drain_mask: np.ndarray,
                free: np.ndarray, drained_now: set[str], sched: Schedule | None = None,
                clock: FaultClock | None = None) -> Planned:
    """Drain (quarantine) nodes in a drain state where it pays; failed nodes first, then the most harmful.

    Whether a quarantine pays is the economic model's call: the job's throughput the node
    costs plus the extra hard failures it risks over the fault's expected remaining time
    (``clock``, decide/durations.py; without one the planning horizon), weighted by criticality,
    against the swap stall and the capacity removed. A failed or idle node is drained outright;
    one drained already stays drained. Each new drain of a busy node uses up a spare.
    """
    horizon_h = policy.objective.horizon_h
    node_slow = np.zeros(fleet.count(Kind.NODE))
    np.maximum.at(node_slow, fleet.gpu_node, a.kinds[Kind.GPU].slowdown)
    np.maximum.at(node_slow, fleet.nic_node, a.kinds[Kind.NIC].slowdown)
    spares_left = int(free.sum())
    drains: list[Action] = []
    for i in sorted(np.flatnonzero(drain_mask).tolist(), key=lambda i: -a.node_gfs[i] * node_w[i]):
        name, st = fleet.node_names[i], State(int(a.node_state[i]))
        _, _, reasons = node_cause(fleet, a.kinds, i)
        benefit = cost = 0.0
        slip: tuple[tuple[str, float, float, str], ...] = ()
        rem = None
        if fleet.node_job[i] >= 0 and st != State.FAILED:
            rem = node_fault(fleet, a, i, clock)
            dec = quarantine_pays(fleet, a, policy, i, float(node_w[i]), float(node_slow[i]), spares_left,
                                  name in drained_now, sched, None if rem is None else rem.remaining_s / 3600.0)
            saved = drain_slip_s(fleet, a, policy, i, float(node_slow[i]), sched)
            slip = slip_evidence(sched, int(fleet.node_job[i]), saved) if sched is not None else ()
            benefit, cost = dec.benefit_gpu_h / horizon_h, dec.cost_gpu_h / horizon_h
            if dec.action != "quarantine" and name not in drained_now:
                continue
            if name not in drained_now:
                spares_left -= 1
        drains.append(Action(
            key=action_key(Verb.DRAIN, name), verb=Verb.DRAIN, target=name, target_kind="node",
            reason=f"seamguard: {st.label} {_summary(reasons)}"
                   + (f"; deadline slip saved {slip[2][1]:.0f} s of {fleet.job_names[fleet.node_job[i]]}"
                      if len(slip) > 2 and slip[2][1] else "") + (f"; {rem.why()}" if rem is not None else ""),
            cause=name, evidence=_evidence(reasons) + slip + ((rem.evidence(name),) if rem is not None else ()),
            benefit_gpu_h_per_h=round(benefit, 3), cost_gpu_h_per_h=round(cost, 3),
            criticality=float(node_w[i])))
    failed = a.node_state == State.FAILED
    node_index = fleet.index_table(Kind.NODE)
    # hard failures first (they bypass the rate, never a total), then the most harmful
    drains.sort(key=lambda d: not failed[node_index[d.target]])
    return [(d, Request(d.key, nodes=(node_index[d.target],), hard=bool(failed[node_index[d.target]])))
            for d in drains]


def facility_domain(fleet: Fleet, a: Assessment, i: int) -> str:
    """The facility domain ("cooling_loop:<name>" / "rack:<name>") a node's trouble belongs to, "" if its own."""
    nds = a.node_domain_state
    if not (nds[i, 0] == State.HEALTHY and nds[i, 1] == State.HEALTHY and nds[i, 2] > State.HEALTHY):
        return ""
    lp, rk = int(fleet.node_loop[i]), int(fleet.node_rack[i])
    if a.kinds[Kind.COOLING_LOOP].states.state[lp] > State.HEALTHY:
        return f"{Kind.COOLING_LOOP.label}:{fleet.loop_names[lp]}"
    if a.kinds[Kind.RACK].states.state[rk] > State.HEALTHY:
        return f"{Kind.RACK.label}:{fleet.rack_names[rk]}"
    return ""


def plan_labels(fleet: Fleet, a: Assessment, node_w: np.ndarray, drain_mask: np.ndarray) -> Planned:
    """label_degraded: the job classes a degraded node may still take ("none": no new work of any class).

    Storage-only trouble is handled by avoiding the path, not by relabelling nodes. Facility
    trouble (the node's loop or rack) is the domain's: one restriction of the whole
    domain, counted once by the breaker. Drained nodes are not labelled.
    """
    n_cls = len(ADMISSIBILITY_COLUMNS) - 1
    jobs_ok = a.admissible[:, :n_cls]
    exposed = (a.node_domain_state[:, :3] > State.HEALTHY).any(axis=1)
    restrict = ~jobs_ok.all(axis=1) & (jobs_ok.any(axis=1) | exposed) & ~drain_mask
    out: Planned = []
    for i in np.flatnonzero(restrict).tolist():
        name = fleet.node_names[i]
        classes = ",".join(c for c, ok in zip(ADMISSIBILITY_COLUMNS, a.admissible[i]) if ok)
        value = classes if jobs_ok[i].any() else "none"
        domain = facility_domain(fleet, a, i)
        _, _, reasons = node_cause(fleet, a.kinds, i)
        act = Action(key=action_key(Verb.LABEL_DEGRADED, name, value=value), verb=Verb.LABEL_DEGRADED,
                     target=name, target_kind="node", params=(("classes", classes),),
                     reason=(f"seamguard: degraded, admissible for {classes}" if value != "none" else
                             "seamguard: admissible for no job class (no new work)")
                            + (f" ({domain})" if domain else ""),
                     cause=domain.partition(":")[2] or name, evidence=_evidence(reasons),
                     criticality=float(node_w[i]))
        out.append((act, Request(act.key, nodes=(i,), domain=domain)))
    return out


def rail_only_links(fleet: Fleet, drained: set[str]) -> np.ndarray:
    """Per link: a NIC's own link whose node keeps running (no drain now or planned) and has
    another NIC — a rail its jobs can stay off (act/runtime.py ``avoid_rails``) while the node
    itself is kept. Every other NIC link is its node's: the drain covers it."""
    edge = fleet.link_nic >= 0
    node = np.full(fleet.link_nic.shape[0], -1)
    node[edge] = fleet.nic_node[fleet.link_nic[edge]]
    nics = np.bincount(fleet.nic_node, minlength=fleet.count(Kind.NODE))
    kept = ~np.isin(np.array(fleet.node_names), sorted(drained)) & (nics >= 2)
    return edge & kept[np.maximum(node, 0)]


def plan_path_avoidance(fleet: Fleet, a: Assessment, rules: ActionRules, drained: set[str] = frozenset()) -> Planned:
    """avoid_link / avoid_storage for fabric links and storage paths in an avoid state.

    A NIC's own link is its node's (the drain takes it) unless ``drained`` — nodes drained now
    or by this tick's plan — leaves the node running with another NIC: then the link is
    avoided as a rail (:func:`rail_only_links`)."""
    out: Planned = []
    rail_only = rail_only_links(fleet, drained)
    for kind, verb, states in ((Kind.LINK, Verb.AVOID_LINK, rules.avoid_link_states),
                               (Kind.STORAGE, Verb.AVOID_STORAGE, rules.avoid_storage_states)):
        ka = a.kinds[kind]
        for i in np.flatnonzero(np.isin(ka.states.state, _codes(states))).tolist():
            if kind == Kind.LINK and fleet.link_nic[i] >= 0 and not rail_only[i]:
                continue  # a NIC's own link on a node being drained, or its only NIC
            name = fleet.names(kind)[i]
            reasons = ka.reasons(i)
            act = Action(key=action_key(verb, name), verb=verb, target=name, target_kind=kind.label,
                         reason=f"seamguard: {State(int(ka.states.state[i])).label} {_summary(reasons)}",
                         cause=name, evidence=_evidence(reasons),
                         benefit_gpu_h_per_h=round(float(ka.fae[i]), 3))
            out.append((act, Request(act.key, path=f"{'link' if kind == Kind.LINK else 'storage'}:{name}")))
    return out


def move_room(fleet: Fleet, a: Assessment, j: int, off_bad: np.ndarray, landing_free: int) -> int:
    """Nodes job ``j`` could land on off the troubled loops: free ones plus those of less synchronous, less critical work."""
    node_job, sync = fleet.node_job, JOB_CLASS_SYNCHRONY[fleet.job_class]
    tolerant = (node_job >= 0) & off_bad & (node_job != j) & (a.node_state == State.HEALTHY)
    tj = np.maximum(node_job, 0)
    tolerant &= (sync[tj] < sync[j]) & (fleet.job_criticality[tj] < fleet.job_criticality[j])
    return landing_free + int(tolerant.sum())


def move_pays(fleet: Fleet, policy: Policy, j: int, need: int, loop_gfs: float, weight: float,
              sched: Schedule | None = None, now_s: float = 0.0, remaining_h: float | None = None) -> EconomicDecision:
    """The economics of moving job ``j``'s ``need`` nodes off a loop of GFS ``loop_gfs``.

    The loop's GFS predicts throttling (up to a 30 % slower step for the whole job) and
    thermal trips, for as long as the loop's fault lasts (``remaining_h``, its expected
    remaining time; None: the planning horizon); a move costs one swap stall and removes no
    capacity. With a deadline the move is also worth the slip it saves (the throttling and
    the loop's hazard left behind, one swap stall paid).
    """
    obj, prop, g = policy.objective, policy.assess.propagation, loop_gfs
    saved = move_slip_s(policy, j, g, sched, now_s)
    return quarantine_decision(DegradedNodeContext(
        job_class=JobClass(int(fleet.job_class[j])), criticality=weight,
        job_gpus=int(float(fleet.job_gpu_count[j])), node_gpus=need * int(fleet.node_gpu_count.max()),
        slowdown=0.3 * g, hazard_multiplier=1.0 + g * g, node_hazard_per_h=prop.hazard_per_h_at_gfs1,
        loss_per_failure_h=prop.checkpoint_interval_h / 2.0 + prop.restart_h,
        horizon_h=obj.horizon_h if remaining_h is None else remaining_h, swap_cost_s=obj.migrate_h * 3600.0,
        spare_available=True,
        hold_h=obj.hold_h, removed_capacity_value=0.0,
        slip_saved_gpu_h=slip_gpu_h(fleet, sched, j, saved[0]) if sched is not None else 0.0))


def plan_moves(fleet: Fleet, a: Assessment, policy: Policy, crit: np.ndarray, free: np.ndarray,
               in_effect: set[str], frozen: FreezeView | None, sched: Schedule | None = None,
               clock: FaultClock | None = None) -> Planned:
    """move_job: critical synchronous jobs off a degraded cooling loop, where they fit whole and it pays
    over the loop fault's expected remaining time (``clock``; without one the planning horizon).

    Most critical first; a job half-moved still runs at its slowest rank, so a new move
    needs room for all its nodes there. A move in effect stays asked; none new on a frozen loop.
    """
    rules, horizon_h = policy.actions, policy.objective.horizon_h
    move_cls = np.isin(fleet.job_class, [JOB_CLASS_BY_LABEL[c] for c in rules.move_job_classes])
    loops, node_job = a.kinds[Kind.COOLING_LOOP], fleet.node_job
    bad = np.isin(loops.states.state, _codes(rules.move_job_domain_states))
    off_bad = ~bad[fleet.node_loop]
    landing_free = int((free & off_bad).sum())
    out: Planned = []
    for lp in np.flatnonzero(bad).tolist():
        on_loop = (node_job >= 0) & (fleet.node_loop == lp)
        reasons = loops.reasons(lp)
        rem = loop_fault(fleet, a, lp, clock)
        for j in sorted(np.unique(node_job[on_loop]).tolist(), key=lambda j: -fleet.job_criticality[j]):
            if not move_cls[j] or fleet.job_criticality[j] < rules.move_job_min_criticality:
                continue
            jn, ln = fleet.job_names[j], fleet.loop_names[lp]
            key = action_key(Verb.MOVE_JOB, jn, ln)
            if frozen is not None and frozen.frozen(Kind.COOLING_LOOP, lp) and key not in in_effect:
                continue
            need = int((on_loop & (node_job == j)).sum())
            if key not in in_effect and need > move_room(fleet, a, j, off_bad, landing_free):
                continue  # a synchronous job half-moved still runs at its slowest rank
            landing_free = max(0, landing_free - need)
            dec = move_pays(fleet, policy, j, need, float(loops.gfs[lp]), float(crit[j]), sched, a.t_s,
                            None if rem is None else rem.remaining_s / 3600.0)
            saved = move_slip_s(policy, j, float(loops.gfs[lp]), sched, a.t_s)
            slip = slip_evidence(sched, j, saved) if sched is not None else ()
            if dec.action != "quarantine" and key not in in_effect:
                continue
            act = Action(key=key, verb=Verb.MOVE_JOB, target=jn, target_kind="job",
                         params=(("domain", ln), ("domain_kind", "cooling_loop"), ("nodes", loop_nodes(fleet, lp))),
                         reason=f"seamguard: {ln} {State(int(loops.states.state[lp])).label} ({_summary(reasons)})"
                                + (f"; deadline slip saved {saved[0]:.0f} s" if slip and saved[0] else "")
                                + (f"; {rem.why()}" if rem is not None else ""),
                         cause=ln, evidence=_evidence(reasons) + slip + ((rem.evidence(ln),) if rem is not None else ()),
                         benefit_gpu_h_per_h=round(dec.benefit_gpu_h / horizon_h, 3),
                         cost_gpu_h_per_h=round(dec.cost_gpu_h / horizon_h, 3), criticality=float(crit[j]))
            out.append((act, Request(key, domain=f"{Kind.COOLING_LOOP.label}:{ln}")))
    return out


def breaker_in_effect(fleet: Fleet, a: Assessment, in_effect: set[str], domains: tuple[str, ...],
                      node_index: Mapping[str, int]) -> InEffect:
    """What the breaker counts as restricted now: nodes and paths in effect, and admitted domains still in trouble."""
    now = InEffect()
    for k in in_effect:
        ak = ActionKey.parse(k)
        if ak.verb in RESTRICTS_NODE and ak.entity in node_index:
            now.nodes.add(node_index[ak.entity])
        elif ak.verb == Verb.AVOID_LINK:
            now.paths.add(f"link:{ak.entity}")
        elif ak.verb == Verb.AVOID_STORAGE:
            now.paths.add(f"storage:{ak.entity}")
    loops_st, racks_st = a.kinds[Kind.COOLING_LOOP].states.state, a.kinds[Kind.RACK].states.state
    for d in domains:
        head, _, name = d.partition(":")
        try:
            st = loops_st[fleet.index_of(Kind.COOLING_LOOP, name)] if head == Kind.COOLING_LOOP.label \
                else racks_st[fleet.index_of(Kind.RACK, name)]
        except KeyError:
            continue
        if st > State.HEALTHY:
            now.domains.add(d)
    return now


def hold_by_breaker(desired: dict[str, Action], held_why: dict[str, str]) -> tuple[dict[str, Action], list[Action]]:
    """Move what the breaker held out of the desired state, its reason saying why (in the breaker's order)."""
    desired, held = dict(desired), []
    for k, why in held_why.items():
        act = desired.pop(k)
        held.append(replace(act, reason=f"{act.reason}; held: {why}"))
    return desired, held


def pace_returns(desired: dict[str, Action], in_effect: set[str], breaker: BreakerState, fleet: Fleet,
                 node_index: Mapping[str, int], policy: Policy, t_s: float) -> tuple[dict[str, Action], BreakerState]:
    """Let the node restrictions seamguard holds, and no longer wants, go at the breaker's return pace.

    A node returns when none of its restrictions is wanted any more (one replaced by another,
    label by drain or drain by label, is not a return). A tripped breaker bounds how many
    nodes come back per window; one past the bound is kept, with why."""
    still = {ak.entity for ak in map(ActionKey.parse, desired) if ak.verb in RESTRICTS_NODE}
    returns = [(k, ak.entity) for k, ak in ((k, ActionKey.parse(k)) for k in sorted(in_effect - set(desired)))
               if ak.verb in RESTRICTS_NODE and ak.entity in node_index and ak.entity not in still]
    breaker, _, held = admit_returns(breaker, fleet, policy.breaker, t_s, returns)
    desired = dict(desired)
    for k, why in held.items():
        desired[k] = kept(k, f"lift held: {why}")
    return desired, breaker


def fault_clock(fleet: Fleet, a: Assessment, policy: Policy, state: DecideState) -> FaultClock:
    """The tick's FaultClock: the policy's duration table, and when each node and cooling loop now out of
    healthy left it (kept from tick to tick in DecideState.onsets)."""
    loops = a.kinds[Kind.COOLING_LOOP].states.state
    bad = [f"{Kind.COOLING_LOOP.label}:{fleet.loop_names[i]}" for i in np.flatnonzero(loops > State.HEALTHY).tolist()]
    bad += [f"{Kind.NODE.label}:{fleet.node_names[i]}" for i in np.flatnonzero(a.node_state > State.HEALTHY).tolist()]
    return FaultClock(policy.objective.duration_table(), onsets(dict(state.onsets), bad, a.t_s), a.t_s,
                      policy.objective.horizon_h * 3600.0)


def decide(fleet: Fleet, a: Assessment, policy: Policy, state: DecideState,
           in_effect: set[str], frozen: FreezeView | None = None) -> tuple[Decisions, DecideState]:
    """The desired state for this tick. ``in_effect``: keys the actuators report held;
    ``frozen``: scopes whose input failed (no new action there, those in effect stay)."""
    rules = policy.actions
    node_index = fleet.index_table(Kind.NODE)
    crit, node_w = criticality_weights(fleet, policy)
    free, drained_now = spare_nodes(fleet, a, in_effect)
    kind_ht, node_ht = healthy_ticks(fleet, a, policy)
    drain_mask = np.isin(a.node_state, _codes(rules.drain_states))
    ex = exposure(fleet, a, policy)
    sched = schedule(fleet, a, policy, ex)
    clock = fault_clock(fleet, a, policy, state)
    # what takes capacity away, in the breaker's order; checkpoints take none
    restricts = plan_drains(fleet, a, policy, node_w, drain_mask, free, drained_now, sched, clock)
    if rules.label_degraded:
        restricts += plan_labels(fleet, a, node_w, drain_mask)
    ckpt = plan_checkpoints(fleet, a, policy, state.episodes, state.checkpoints, node_ht, crit, ex)
    intervals = plan_checkpoint_intervals(fleet, policy, ex, crit, in_effect,
                                          {e.job for e in ckpt.episodes})
    moves = plan_moves(fleet, a, policy, crit, free, in_effect, frozen, sched, clock)
    sheds = plan_sheds(fleet, a, policy, crit, in_effect, frozen, {act.key for act, _ in moves},
                       *shed_priority(fleet, sched), clock=clock)
    sheds = [(with_slip(act, fleet, sched), r) for act, r in sheds]
    drained = drained_now | {act.target for act, _ in restricts if act.verb == Verb.DRAIN}
    avoids = plan_path_avoidance(fleet, a, rules, drained) + moves + sheds
    desired = ({act.key: act for act, _ in restricts}
               | {k: with_slip(act, fleet, sched) for k, act in
                  (checkpoints_with_slip(ckpt.actions, set(ckpt.issued), fleet, a, policy, sched,
                                         dict(state.checkpoints)) | intervals).items()}
               | {act.key: act for act, _ in avoids})
    requests = {r.key: r for _, r in restricts + avoids}

    desired, requests, n_frozen = apply_freeze(fleet, frozen, desired, requests, in_effect, ckpt.carried)
    desired, episodes, checkpoints = undo_unasked(ckpt, desired)

    now = breaker_in_effect(fleet, a, in_effect, state.breaker.domains, node_index)
    pending = [r for k, r in requests.items() if k not in in_effect]
    breaker, _, held_why = admit(state.breaker, fleet, policy.breaker, a.t_s, pending, now)
    desired, held = hold_by_breaker(desired, held_why)

    desired = only_tighten(desired, in_effect, at_risk(a), node_index)
    desired = release_dwell(desired, in_effect, fleet, node_index, kind_ht, node_ht, rules.release_after_healthy_ticks)
    desired, breaker = pace_returns(desired, in_effect, breaker, fleet, node_index, policy, a.t_s)
    desired, move_ckpts = plan_move_checkpoints(fleet, policy, desired, in_effect, dict(state.move_checkpoints),
                                                checkpoints, ex.job_hazard_per_h, a.t_s)
    for k, t in move_ckpts.items():  # the work since the last checkpoint is bounded by the move's
        job = ActionKey.parse(k).entity
        checkpoints[job] = max(t, checkpoints.get(job, t))

    decisions = Decisions(t_s=a.t_s, desired=desired, held=held, breaker_tripped=breaker.tripped,
                          breaker_reason=breaker.reason, frozen=frozen.scopes if frozen is not None else (),
                          held_by_freeze=n_frozen)
    return decisions, replace(state, breaker=breaker, episodes=tuple(episodes),
                              checkpoints=tuple(sorted(checkpoints.items())),
                              move_checkpoints=tuple(sorted(move_ckpts.items())),
                              onsets=tuple(sorted(clock.onsets.items())))
