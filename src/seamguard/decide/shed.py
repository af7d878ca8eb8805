"""Shedding: the lowest-criticality jobs off a cooling loop that is losing flow. Pure.

A loop losing flow removes less heat than its racks make; every job left on it runs
hotter, throttles and trips sooner. `plan_moves` moves the critical synchronous jobs off
it where there is room; this stage takes load off the loop itself: the jobs whose
criticality is at most ``shed_job_max_criticality``, lowest first, up to
``shed_job_max_loop_fraction`` of the loop's nodes, leave it whether or not there is room
elsewhere (they wait, pending, until there is). A shed is a ``move_job`` of that job off
that loop (same key, same breaker domain, freeze and release rules), with the parameter
``mode=shed``; an actuator does the same thing for both: checkpoint, then requeue with the
loop's nodes excluded.

This is a rule with explicit thresholds, not an economic decision: the heat a job adds to
a loop is not modelled, so the benefit recorded (the loop's FAE times the share of its busy
nodes the job holds) is an estimate, and the cost (the job's GPUs times its weight: its
throughput while it waits) is what the user pays. Both are recorded, neither gates it. What
does gate a new shed is time: the load comes off the loop only once the job is requeued, so a
loop whose fault is expected to end within that (``objective.migrate_h``, the fault's expected
remaining time from decide/durations.py) is not shed from; the figure is in the shed's evidence.
"""

from __future__ import annotations

import numpy as np

from seamguard.assess.assessment import Assessment
from seamguard.assess.quality import FreezeView
from seamguard.assess.states import STATE_BY_LABEL, State
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.decide.breaker import Request
from seamguard.decide.durations import FaultClock, Remaining
from seamguard.decide.explain import evidence as _evidence
from seamguard.decide.explain import summary as _summary
from seamguard.decide.policy import Policy
from seamguard.fleet.model import Fleet, Kind


def loop_nodes(fleet: Fleet, lp: int) -> str:
    """The names of every node cooled by loop ``lp``, comma-separated (what an actuator excludes)."""
    return ",".join(fleet.node_names[i] for i in np.flatnonzero(fleet.node_loop == lp).tolist())


def loop_fault(fleet: Fleet, a: Assessment, lp: int, clock: FaultClock | None) -> Remaining | None:
    """The expected remaining time of cooling loop ``lp``'s fault (hard once failed, gray before); None
    without a clock."""
    if clock is None:
        return None
    cls = "hard" if a.kinds[Kind.COOLING_LOOP].states.state[lp] == State.FAILED else "gray"
    return clock.remaining(f"{Kind.COOLING_LOOP.label}:{fleet.loop_names[lp]}", ((Kind.COOLING_LOOP.label, cls),))


def shed_order(fleet: Fleet, on_loop: np.ndarray, max_criticality: float, keep_value: np.ndarray | None = None,
               slack_s: np.ndarray | None = None) -> list[int]:
    """Jobs on the loop at or below ``max_criticality``: least worth keeping first (``keep_value``, default
    the criticality; the planner raises it for a job at risk of missing its deadline), then the most
    slack to its deadline (``slack_s``, inf without one), then by name."""
    value = fleet.job_criticality if keep_value is None else keep_value
    slack = np.full(len(fleet.job_names), np.inf) if slack_s is None else slack_s
    jobs = [int(j) for j in np.unique(fleet.node_job[on_loop]) if fleet.job_criticality[j] <= max_criticality]
    return sorted(jobs, key=lambda j: (float(value[j]), -float(slack[j]), fleet.job_names[j]))


def plan_sheds(fleet: Fleet, a: Assessment, policy: Policy, crit: np.ndarray, in_effect: set[str],
               frozen: FreezeView | None, moving: set[str], keep_value: np.ndarray | None = None,
               slack_s: np.ndarray | None = None, clock: FaultClock | None = None) -> list[tuple[Action, Request]]:
    """move_job (mode=shed) for the lowest-criticality jobs on loops in ``shed_job_domain_states``.

    ``moving``: keys plan_moves already asks (a job moved is not also shed). A shed in effect
    stays asked (and counts against the loop's share); none new off a frozen loop.
    ``keep_value`` / ``slack_s``: the order among them (:func:`shed_order`). ``clock``: none new where
    the loop's fault is expected to end before a requeue (``objective.migrate_h``) would take load off it.
    """
    rules = policy.actions
    states = np.array([STATE_BY_LABEL[s] for s in rules.shed_job_domain_states], dtype=np.int8)
    loops, node_job = a.kinds[Kind.COOLING_LOOP], fleet.node_job
    out: list[tuple[Action, Request]] = []
    for lp in np.flatnonzero(np.isin(loops.states.state, states)).tolist():
        ln = fleet.loop_names[lp]
        on_loop = (node_job >= 0) & (fleet.node_loop == lp)
        budget = int(np.floor(rules.shed_job_max_loop_fraction * int((fleet.node_loop == lp).sum())))
        busy = max(int(on_loop.sum()), 1)
        order = [j for j in shed_order(fleet, on_loop, rules.shed_job_max_criticality, keep_value, slack_s)
                 if action_key(Verb.MOVE_JOB, fleet.job_names[j], ln) not in moving]
        need = {j: int((on_loop & (node_job == j)).sum()) for j in order}
        held = {j for j in order if action_key(Verb.MOVE_JOB, fleet.job_names[j], ln) in in_effect}
        used = sum(need[j] for j in held)  # sheds in effect count first: they stay
        frozen_loop = frozen is not None and frozen.frozen(Kind.COOLING_LOOP, lp)
        reasons = loops.reasons(lp)
        rem = loop_fault(fleet, a, lp, clock)
        ending = rem is not None and rem.remaining_s <= policy.objective.migrate_h * 3600.0
        for j in order:
            if j not in held:
                if frozen_loop or ending or used + need[j] > budget:
                    continue
                used += need[j]
            jn = fleet.job_names[j]
            key = action_key(Verb.MOVE_JOB, jn, ln)
            gpus = float(fleet.job_gpu_count[j])
            act = Action(key=key, verb=Verb.MOVE_JOB, target=jn, target_kind="job",
                         params=(("domain", ln), ("domain_kind", Kind.COOLING_LOOP.label),
                                 ("nodes", loop_nodes(fleet, lp)), ("mode", "shed")),
                         reason=(f"seamguard: shed from {ln} {State(int(loops.states.state[lp])).label} "
                                 f"(criticality {float(fleet.job_criticality[j]):g}; {_summary(reasons)})"
                                 + (f"; {rem.why()}" if rem is not None else "")),
                         cause=ln, evidence=_evidence(reasons) + ((rem.evidence(ln),) if rem is not None else ()),
                         benefit_gpu_h_per_h=round(float(loops.fae[lp]) * need[j] / busy, 3),
                         cost_gpu_h_per_h=round(gpus * float(crit[j]), 3), criticality=float(crit[j]))
            out.append((act, Request(key, domain=f"{Kind.COOLING_LOOP.label}:{ln}")))
    return out
