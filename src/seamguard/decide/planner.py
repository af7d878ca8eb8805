"""Assessment -> desired state. Pure: no clock, no I/O.

The objective is explicit: preserve useful throughput and minimise failure
amplification, weighted by job criticality. Each action states its benefit (the FAE it
removes, weighted) and its cost (capacity it takes away, migrations it forces), both in
healthy GPU-hours per hour, and is taken only when the benefit pays for the cost. The
breaker then bounds how much the controller may disrupt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.assess.assessment import Assessment, node_cause
from seamguard.assess.states import STATE_BY_LABEL, State
from seamguard.decide.actions import Action, ActionKey, Decisions, Verb, action_key
from seamguard.assess.quality import FreezeView
from seamguard.decide.breaker import BreakerState, InEffect, Request, admit
from seamguard.decide.economics import (CheckpointContext, DegradedNodeContext, checkpoint_decision,
                                       quarantine_decision)
from seamguard.decide.policy import Policy
from seamguard.fleet.model import JOB_CLASS_BY_LABEL, JOB_CLASS_SYNCHRONY, Fleet, JobClass, Kind


@dataclass(frozen=True)
class Episode:
    """A risk episode of one training job on one node, for checkpoint_now.

    Open while the node is exposed (its own or its cooling loop's / rack's state) and until
    it has been healthy ``episode_end_healthy_ticks``; ``level`` is the exposure state the
    job's checkpoint was last asked for in this episode (0: not yet).
    """

    job: str
    node: str
    level: int = 0


@dataclass(frozen=True)
class DecideState:
    """What decide carries from tick to tick: the breaker and the jobs' risk episodes."""

    breaker: BreakerState = field(default_factory=BreakerState)
    episodes: tuple[Episode, ...] = ()
    # (job, t_s of its last checkpoint_now): bounds the work since its last checkpoint, and
    # names the request an open episode carries (its key ends in @t<int(t_s)>)
    checkpoints: tuple[tuple[str, float], ...] = ()

    def to_json(self) -> dict:
        return {"breaker": self.breaker.to_json(),
                "episodes": [[e.job, e.node, e.level] for e in self.episodes],
                "checkpoints": [list(x) for x in self.checkpoints]}

    @classmethod
    def from_json(cls, d: dict) -> DecideState:
        eps = tuple(Episode(str(j), str(n), int(lv)) for j, n, lv in d.get("episodes", []))
        ck = [(str(j), float(t)) for j, t in d.get("checkpoints", [])]
        ck += [(str(j), float(t)) for j, _, t in d.get("exposure", [])]  # before episodes: (job, level, t_s)
        return cls(BreakerState.from_json(d["breaker"]), eps, tuple(ck))


def _codes(labels: list[str]) -> np.ndarray:
    return np.array([STATE_BY_LABEL[s] for s in labels], dtype=np.int8)


def _evidence(reasons) -> tuple[tuple[str, float, float, str], ...]:
    return tuple((r.channel, r.score, r.value, r.unit) for r in reasons)


def _summary(reasons) -> str:
    return ", ".join(f"{r.channel}={r.value:.3g}" for r in reasons[:3]) or "no evidence"


_RESTRICTS_NODE = (Verb.DRAIN, Verb.LABEL_DEGRADED)


def _strictness(ak: ActionKey) -> tuple[int, frozenset[str]]:
    """drain 3 > a label admitting no job class 2 > a label admitting some 1."""
    if ak.verb == Verb.DRAIN:
        return 3, frozenset()
    classes = frozenset(c for c in ak.value.split(",") if c and c != "none")
    return (2 if not (classes - {"checkpoint_restore"}) else 1), classes


def _at_least_as_strict(new: ActionKey, old: ActionKey) -> bool:
    (rn, cn), (ro, co) = _strictness(new), _strictness(old)
    return rn > ro or (rn == ro and (rn != 1 or cn <= co))


def _kept(key: str, why: str) -> Action:
    """An action in effect kept as it is (its key says all the actuator needs)."""
    ak = ActionKey.parse(key)
    params: tuple[tuple[str, str], ...] = ()
    kind = "node"
    if ak.verb == Verb.LABEL_DEGRADED:
        params = (("classes", "" if ak.value == "none" else ak.value),)
    elif ak.verb == Verb.MOVE_JOB:
        params, kind = (("domain", ak.episode), ("domain_kind", "cooling_loop")), "job"
    elif ak.verb == Verb.AVOID_LINK:
        kind = "link"
    elif ak.verb == Verb.AVOID_STORAGE:
        kind = "storage"
    elif ak.verb == Verb.CHECKPOINT_NOW:
        kind = "job"
    return Action(key=key, verb=ak.verb, target=ak.entity, target_kind=kind, params=params,
                  reason=f"seamguard: kept: {why}", cause=ak.entity)


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


def decide(fleet: Fleet, a: Assessment, policy: Policy, state: DecideState,
           in_effect: set[str], frozen: FreezeView | None = None) -> tuple[Decisions, DecideState]:
    """The desired state for this tick. ``in_effect``: keys the actuators report held;
    ``frozen``: scopes whose input failed (no new action there, those in effect stay)."""
    obj, rules = policy.objective, policy.actions
    desired: dict[str, Action] = {}
    requests: dict[str, Request] = {}
    crit = fleet.job_criticality ** obj.criticality_exponent
    node_job = fleet.node_job
    node_w = np.where(node_job >= 0, crit[np.maximum(node_job, 0)] if len(crit) else 1.0, obj.idle_criticality)
    job_size = fleet.job_gpu_count.astype(float)

    # ---- drains (quarantine) ------------------------------------------------
    # Whether a quarantine pays is the economic model's call (decide/economics.py): the
    # job's throughput the node costs plus the extra hard failures it risks, weighted by
    # criticality, against the swap stall and the capacity removed.
    prop = policy.assess.propagation
    node_slow = np.zeros(fleet.count(Kind.NODE))
    np.maximum.at(node_slow, fleet.gpu_node, a.kinds[Kind.GPU].slowdown)
    np.maximum.at(node_slow, fleet.nic_node, a.kinds[Kind.NIC].slowdown)
    drain_mask = np.isin(a.node_state, _codes(rules.drain_states))
    free = (node_job < 0) & (a.node_state == State.HEALTHY) & a.admissible.all(axis=1)
    drained_now = {ak.entity for ak in map(ActionKey.parse, in_effect) if ak.verb == Verb.DRAIN}
    if drained_now:
        free &= ~np.isin(np.array(fleet.node_names), list(drained_now))
    spares_left = int(free.sum())
    cands = np.flatnonzero(drain_mask)
    drains: list[Action] = []
    for i in sorted(cands.tolist(), key=lambda i: -a.node_gfs[i] * node_w[i]):
        name = fleet.node_names[i]
        j = int(node_job[i])
        st = State(int(a.node_state[i]))
        _, _, reasons = node_cause(fleet, a.kinds, i)
        benefit = cost = 0.0
        if j >= 0 and st != State.FAILED:
            dec = quarantine_decision(DegradedNodeContext(
                job_class=JobClass(int(fleet.job_class[j])), criticality=float(node_w[i]),
                job_gpus=int(job_size[j]), node_gpus=int(fleet.node_gpu_count[i]),
                slowdown=float(node_slow[i]), hazard_multiplier=1.0 + float(a.node_gfs[i]) ** 2,
                node_hazard_per_h=prop.hazard_per_h_at_gfs1,
                loss_per_failure_h=prop.checkpoint_interval_h / 2.0 + prop.restart_h,
                horizon_h=obj.horizon_h, swap_cost_s=obj.migrate_h * 3600.0,
                spare_available=spares_left > 0 or name in drained_now, hold_h=obj.hold_h,
                removed_capacity_value=0.0 if spares_left > 0 else 1.0))
            benefit, cost = dec.benefit_gpu_h / obj.horizon_h, dec.cost_gpu_h / obj.horizon_h
            if dec.action != "quarantine" and name not in drained_now:
                continue
            if name not in drained_now:
                spares_left -= 1
        drains.append(Action(
            key=action_key(Verb.DRAIN, name), verb=Verb.DRAIN, target=name, target_kind="node",
            reason=f"seamguard: {st.label} {_summary(reasons)}", cause=name,
            evidence=_evidence(reasons), benefit_gpu_h_per_h=round(benefit, 3), cost_gpu_h_per_h=round(cost, 3),
            criticality=float(node_w[i])))

    failed_mask = a.node_state == State.FAILED
    node_index = {n: i for i, n in enumerate(fleet.node_names)}
    # hard failures first (they bypass the rate, never a total), then the most harmful
    drains.sort(key=lambda d: not failed_mask[node_index[d.target]])
    for d in drains:
        i = node_index[d.target]
        desired[d.key] = d
        requests[d.key] = Request(d.key, nodes=(i,), hard=bool(failed_mask[i]))

    # ---- admissibility labels for degraded nodes ------------------------------
    # A node admissible for some job classes is labelled with them; one admissible for
    # none (its loop turned harmful, say) is labelled "none": no new work of any class.
    # A restriction only tightens while the risk stays: it never vanishes because the
    # node got worse. Facility trouble (the node's loop or rack) is the domain's: one
    # restriction of the whole domain, counted once by the breaker.
    loops_st = a.kinds[Kind.COOLING_LOOP].states.state
    racks_st = a.kinds[Kind.RACK].states.state
    if rules.label_degraded:
        # Storage-only trouble is handled by avoiding the path, not by relabelling nodes.
        n_cls = len(ADMISSIBILITY_COLUMNS) - 1
        jobs_ok = a.admissible[:, :n_cls]
        at_risk = (a.node_domain_state[:, :3] > State.HEALTHY).any(axis=1)
        restrict = ~jobs_ok.all(axis=1) & (jobs_ok.any(axis=1) | at_risk) & ~drain_mask
        own_ok = (a.node_domain_state[:, 0] == State.HEALTHY) & (a.node_domain_state[:, 1] == State.HEALTHY)
        for i in np.flatnonzero(restrict).tolist():
            name = fleet.node_names[i]
            classes = ",".join(c for c, ok in zip(ADMISSIBILITY_COLUMNS, a.admissible[i]) if ok)
            value = classes if jobs_ok[i].any() else "none"
            domain = ""
            if own_ok[i] and a.node_domain_state[i, 2] > State.HEALTHY:
                lp, rk = int(fleet.node_loop[i]), int(fleet.node_rack[i])
                domain = (f"{Kind.COOLING_LOOP.label}:{fleet.loop_names[lp]}" if loops_st[lp] > State.HEALTHY
                          else f"{Kind.RACK.label}:{fleet.rack_names[rk]}" if racks_st[rk] > State.HEALTHY else "")
            _, _, reasons = node_cause(fleet, a.kinds, i)
            cause = domain.partition(":")[2] or name
            act = Action(key=action_key(Verb.LABEL_DEGRADED, name, value=value), verb=Verb.LABEL_DEGRADED,
                         target=name, target_kind="node", params=(("classes", classes),),
                         reason=(f"seamguard: degraded, admissible for {classes}" if value != "none" else
                                 "seamguard: admissible for no job class (no new work)")
                                + (f" ({domain})" if domain else ""),
                         cause=cause, evidence=_evidence(reasons), criticality=float(node_w[i]))
            desired[act.key] = act
            requests[act.key] = Request(act.key, nodes=(i,), domain=domain)

    # ---- checkpoint now for exposed training jobs ------------------------------
    # Priced (decide/economics.py checkpoint_decision): the rollback a checkpoint now avoids
    # (work since the job's last checkpoint x its GPUs x P(failure before its next
    # scheduled one), the hazard from its exposed nodes' state and evidence) against the
    # write (checkpoint_write_s x its GPUs). At most once per risk episode, again only when
    # the exposure reaches a stricter state than the one it was issued for; an episode
    # ends when the job's nodes have been healthy episode_end_healthy_ticks.
    kind_ht, node_ht = healthy_ticks(fleet, a, policy)
    n_jobs = len(fleet.job_names)
    ckpt_cls = np.isin(fleet.job_class, [JOB_CLASS_BY_LABEL[c] for c in rules.checkpoint_classes])
    exposure_node = np.maximum(a.node_state, a.node_domain_state[:, 2]).astype(np.int64)
    placed = node_job >= 0
    # A node's hard-failure hazard: 0.5 x GFS^2 per hour (propagation), GFS the worst of its
    # own and its loop's and rack's, at least the threshold of the state it is in.
    hg = policy.assess.hysteresis_for(Kind.GPU)
    floor = np.where(exposure_node >= State.CHECKPOINT_UNSAFE, hg.quarantine_enter,
                     np.where(exposure_node >= State.DEGRADED, hg.degrade_enter, 0.0))
    g = np.maximum.reduce([np.nan_to_num(a.node_gfs), a.kinds[Kind.COOLING_LOOP].gfs[fleet.node_loop],
                           a.kinds[Kind.RACK].gfs[fleet.node_rack], floor])
    node_hazard = np.where(exposure_node > State.HEALTHY, prop.hazard_per_h_at_gfs1 * g * g, 0.0)
    job_hazard = np.bincount(node_job[placed], weights=node_hazard[placed], minlength=n_jobs)
    interval_s = prop.checkpoint_interval_h * 3600.0
    node_of = {n: i for i, n in enumerate(fleet.node_names)}
    episodes: dict[str, list[Episode]] = {}
    for e in state.episodes:
        episodes.setdefault(e.job, []).append(e)
    last_ckpt = dict(state.checkpoints)
    new_episodes: list[Episode] = []
    new_ckpts: dict[str, float] = {}
    issued: dict[str, tuple[str, float | None, list[Episode]]] = {}  # key asked this tick -> state before
    carried: dict[str, Action] = {}  # checkpoints asked earlier in an open episode (not new)

    def _carried(job: str, t: float) -> Action:
        return Action(key=action_key(Verb.CHECKPOINT_NOW, job, f"t{int(t)}"), verb=Verb.CHECKPOINT_NOW, target=job,
                      target_kind="job", reason=f"seamguard: checkpoint asked at t={t:.0f}s; not repeated while "
                                                "the risk episode lasts", cause=job)

    job_index = {n: j for j, n in enumerate(fleet.job_names)}
    busy = set(node_job[placed & (exposure_node > State.HEALTHY)].tolist())
    busy |= {job_index[jn] for jn in list(episodes) + list(last_ckpt) if jn in job_index}
    for j in sorted(busy):
        if not ckpt_cls[j]:
            continue
        jn = fleet.job_names[j]
        mine = np.flatnonzero(placed & (node_job == j))
        here = {fleet.node_names[i] for i in mine.tolist()}
        eps: dict[str, Episode] = {}
        for e in episodes.get(jn, []):
            i = node_of.get(e.node)
            if i is None or e.node not in here:
                continue  # the job left the node: its episode there is over
            if exposure_node[i] == State.HEALTHY and node_ht[i] >= rules.episode_end_healthy_ticks:
                continue  # sustained recovery ends the episode
            eps[e.node] = e
        for i in mine[exposure_node[mine] > State.HEALTHY].tolist():
            eps.setdefault(fleet.node_names[i], Episode(jn, fleet.node_names[i], 0))
        last = last_ckpt.get(jn)
        # asked again only where a node's exposure is stricter than what this episode asked for
        worse = [e for e in eps.values() if exposure_node[node_of[e.node]] > e.level]
        act = None
        if worse:
            since = a.t_s - last if last is not None else np.inf
            uncommitted = since if since < interval_s else interval_s / 2.0
            dec = checkpoint_decision(CheckpointContext(
                job_gpus=max(int(job_size[j]), 1), uncommitted_s=uncommitted,
                horizon_s=max(interval_s - uncommitted, 0.0), hazard_per_h=float(job_hazard[j]),
                write_s=rules.checkpoint_write_s))
            if dec.action == "checkpoint":
                worst = max((node_of[e.node] for e in worse), key=lambda i: (exposure_node[i], g[i]))
                lv = int(exposure_node[worst])
                _, _, reasons = node_cause(fleet, a.kinds, worst)
                key = action_key(Verb.CHECKPOINT_NOW, jn, f"t{int(a.t_s)}")
                act = Action(key=key, verb=Verb.CHECKPOINT_NOW, target=jn, target_kind="job",
                             reason=f"seamguard: job exposed to {State(lv).label} {fleet.node_names[worst]} "
                                    f"({_summary(reasons)}); rollback avoided {dec.benefit_gpu_h:.2f} GPU-h > "
                                    f"write {dec.cost_gpu_h:.2f} GPU-h",
                             cause=fleet.node_names[worst], evidence=_evidence(reasons),
                             benefit_gpu_h_per_h=round(dec.benefit_gpu_h / obj.horizon_h, 4),
                             cost_gpu_h_per_h=round(dec.cost_gpu_h / obj.horizon_h, 4), criticality=float(crit[j]))
                issued[key] = (jn, last, list(eps.values()))
                eps = {n: replace(e, level=max(e.level, int(exposure_node[node_of[n]]))) for n, e in eps.items()}
                last = a.t_s
        if act is None and last is not None and any(e.level > 0 for e in eps.values()):
            act = _carried(jn, last)
            carried[act.key] = act
        if act is not None:
            desired[act.key] = act
        new_episodes += [eps[n] for n in sorted(eps)]
        if last is not None and (eps or a.t_s - last < interval_s):
            new_ckpts[jn] = last

    # ---- fabric paths and storage paths -----------------------------------------
    for kind, verb, states in ((Kind.LINK, Verb.AVOID_LINK, rules.avoid_link_states),
                               (Kind.STORAGE, Verb.AVOID_STORAGE, rules.avoid_storage_states)):
        ka = a.kinds[kind]
        for i in np.flatnonzero(np.isin(ka.states.state, _codes(states))).tolist():
            if kind == Kind.LINK and fleet.link_nic[i] >= 0:
                continue  # a NIC's own link is handled by its node
            name = fleet.names(kind)[i]
            reasons = ka.reasons(i)
            act = Action(key=action_key(verb, name), verb=verb, target=name, target_kind=kind.label,
                         reason=f"seamguard: {State(int(ka.states.state[i])).label} {_summary(reasons)}",
                         cause=name, evidence=_evidence(reasons),
                         benefit_gpu_h_per_h=round(float(ka.fae[i]), 3))
            desired[act.key] = act
            requests[act.key] = Request(act.key, path=f"{'link' if kind == Kind.LINK else 'storage'}:{name}")

    # ---- move critical synchronous jobs off a degraded cooling domain --------------
    move_cls = np.isin(fleet.job_class, [JOB_CLASS_BY_LABEL[c] for c in rules.move_job_classes])
    sync = JOB_CLASS_SYNCHRONY[fleet.job_class]
    loops = a.kinds[Kind.COOLING_LOOP]
    bad = np.isin(loops.states.state, _codes(rules.move_job_domain_states))
    # Capacity a move can land on: healthy idle nodes and nodes of work that tolerates a
    # warm loop (less synchronous, less critical), all off the troubled loops.
    off_bad = ~bad[fleet.node_loop]
    landing_free = int((free & off_bad).sum())
    for lp in np.flatnonzero(bad).tolist():
        on_loop = placed & (fleet.node_loop == lp)
        reasons = loops.reasons(lp)
        jobs_here = np.unique(node_job[on_loop])
        for j in sorted(jobs_here.tolist(), key=lambda j: -fleet.job_criticality[j]):
            if not move_cls[j] or fleet.job_criticality[j] < rules.move_job_min_criticality:
                continue
            jn, ln = fleet.job_names[j], fleet.loop_names[lp]
            key = action_key(Verb.MOVE_JOB, jn, ln)
            if frozen is not None and frozen.frozen(Kind.COOLING_LOOP, lp) and key not in in_effect:
                continue
            need = int((on_loop & (node_job == j)).sum())
            tolerant = placed & off_bad & (node_job != j) & (a.node_state == State.HEALTHY)
            tj = np.maximum(node_job, 0)
            tolerant &= (sync[tj] < sync[j]) & (fleet.job_criticality[tj] < fleet.job_criticality[j])
            room = landing_free + int(tolerant.sum())
            if key not in in_effect and need > room:
                continue  # a synchronous job half-moved still runs at its slowest rank
            landing_free = max(0, landing_free - need)
            # The loop's GFS predicts throttling (up to a 30 % slower step for the whole
            # job) and thermal trips; a move costs one swap stall and removes no capacity.
            g = float(loops.gfs[lp])
            dec = quarantine_decision(DegradedNodeContext(
                job_class=JobClass(int(fleet.job_class[j])), criticality=float(crit[j]),
                job_gpus=int(job_size[j]), node_gpus=need * int(fleet.node_gpu_count.max()),
                slowdown=0.3 * g, hazard_multiplier=1.0 + g * g, node_hazard_per_h=prop.hazard_per_h_at_gfs1,
                loss_per_failure_h=prop.checkpoint_interval_h / 2.0 + prop.restart_h,
                horizon_h=obj.horizon_h, swap_cost_s=obj.migrate_h * 3600.0, spare_available=True,
                hold_h=obj.hold_h, removed_capacity_value=0.0))
            b, cost = dec.benefit_gpu_h / obj.horizon_h, dec.cost_gpu_h / obj.horizon_h
            if dec.action != "quarantine" and key not in in_effect:
                continue
            desired[key] = Action(key=key, verb=Verb.MOVE_JOB, target=jn, target_kind="job",
                                  params=(("domain", ln), ("domain_kind", "cooling_loop")),
                                  reason=f"seamguard: {ln} {State(int(loops.states.state[lp])).label} "
                                         f"({_summary(reasons)})",
                                  cause=ln, evidence=_evidence(reasons), benefit_gpu_h_per_h=round(b, 3),
                                  cost_gpu_h_per_h=round(cost, 3), criticality=float(crit[j]))
            requests[key] = Request(key, domain=f"{Kind.COOLING_LOOP.label}:{ln}")

    # ---- the freeze: nothing new where the input failed; what is in effect stays ------
    n_frozen = 0
    if frozen is not None and frozen.scopes:
        for k in list(desired):
            if k in in_effect or k in carried:
                continue
            act = desired[k]
            kind = {"node": Kind.NODE, "link": Kind.LINK, "storage": Kind.STORAGE}.get(act.target_kind)
            if act.target_kind == "job":
                kind, target = (Kind.COOLING_LOOP, act.cause) if act.verb == Verb.MOVE_JOB else (Kind.NODE, act.cause)
            else:
                target = act.target
            try:
                idx = fleet.index_of(kind, target) if kind is not None else -1
            except KeyError:
                idx = -1
            if idx >= 0 and frozen.frozen(kind, idx):
                del desired[k]
                requests.pop(k, None)
                n_frozen += 1
        for k in sorted(in_effect - set(desired)):
            ak = ActionKey.parse(k)
            if ak.verb.one_shot:
                continue
            kind = {Verb.DRAIN: Kind.NODE, Verb.LABEL_DEGRADED: Kind.NODE, Verb.AVOID_LINK: Kind.LINK,
                    Verb.AVOID_STORAGE: Kind.STORAGE}.get(ak.verb)
            target = ak.entity
            if ak.verb == Verb.MOVE_JOB:
                kind, target = Kind.COOLING_LOOP, ak.episode
            try:
                idx = fleet.index_of(kind, target) if kind is not None else -1
            except KeyError:
                idx = -1
            if idx >= 0 and frozen.frozen(kind, idx):
                desired[k] = _kept(k, "its input is missing (failsafe freeze); not reverted for want of data")

    # A checkpoint the freeze held back was not asked: the job's episodes stay as they were.
    for k, (jn, before, eps_before) in issued.items():
        if k not in desired:
            new_episodes = [e for e in new_episodes if e.job != jn] + eps_before
            if before is None:
                new_ckpts.pop(jn, None)
            else:
                new_ckpts[jn] = before
                if any(e.level > 0 for e in eps_before):
                    desired[_carried(jn, before).key] = _carried(jn, before)

    # ---- the breaker: everything that takes capacity away, in one count ---------------
    now = InEffect()
    for k in in_effect:
        ak = ActionKey.parse(k)
        if ak.verb in _RESTRICTS_NODE and ak.entity in node_index:
            now.nodes.add(node_index[ak.entity])
        elif ak.verb == Verb.AVOID_LINK:
            now.paths.add(f"link:{ak.entity}")
        elif ak.verb == Verb.AVOID_STORAGE:
            now.paths.add(f"storage:{ak.entity}")
    for d in state.breaker.domains:
        head, _, name = d.partition(":")
        try:
            st = loops_st[fleet.index_of(Kind.COOLING_LOOP, name)] if head == Kind.COOLING_LOOP.label \
                else racks_st[fleet.index_of(Kind.RACK, name)]
        except KeyError:
            continue
        if st > State.HEALTHY:
            now.domains.add(d)
    pending = [r for k, r in requests.items() if k not in in_effect]
    breaker, _, held_why = admit(state.breaker, fleet, policy.breaker, a.t_s, pending, now)
    held = []
    for k, why in held_why.items():
        act = desired.pop(k)
        held.append(replace(act, reason=f"{act.reason}; held: {why}"))

    # ---- restrictions only tighten while the risk stays ----------------------------
    risk = (a.node_domain_state[:, :3] > State.HEALTHY).any(axis=1) | (a.node_state > State.HEALTHY)
    by_node: dict[int, list[ActionKey]] = {}
    for k in desired:
        ak = ActionKey.parse(k)
        if ak.verb in _RESTRICTS_NODE and ak.entity in node_index:
            by_node.setdefault(node_index[ak.entity], []).append(ak)
    for k in sorted(in_effect - set(desired)):
        old = ActionKey.parse(k)
        if old.verb not in _RESTRICTS_NODE or old.entity not in node_index:
            continue
        i = node_index[old.entity]
        if not risk[i]:
            continue  # the risk is gone: the restriction is lifted
        mine = by_node.get(i, [])
        if any(_at_least_as_strict(n, old) for n in mine):
            continue
        for n in mine:  # a looser replacement while the risk stays: keep the old one instead
            desired.pop(str(n), None)
        desired[k] = _kept(k, f"{old.entity} is still at risk; a restriction only tightens while it is")
        by_node[i] = [old]

    # ---- restrictions are lifted only after sustained recovery -----------------------
    # Once its entity is healthy again a restriction stays until that entity has been
    # healthy release_after_healthy_ticks (the state machine's recovery ticks included),
    # unless a new restriction of the same node replaces it.
    rel = rules.release_after_healthy_ticks
    restricted_nodes = {ActionKey.parse(k).entity for k in desired
                        if ActionKey.parse(k).verb in _RESTRICTS_NODE}
    for k in sorted(in_effect - set(desired)):
        ak = ActionKey.parse(k)
        try:
            if ak.verb in _RESTRICTS_NODE:
                if ak.entity in restricted_nodes:
                    continue
                ht, what = int(node_ht[node_index[ak.entity]]), ak.entity
            elif ak.verb == Verb.AVOID_LINK:
                ht, what = int(kind_ht[Kind.LINK][fleet.index_of(Kind.LINK, ak.entity)]), ak.entity
            elif ak.verb == Verb.AVOID_STORAGE:
                ht, what = int(kind_ht[Kind.STORAGE][fleet.index_of(Kind.STORAGE, ak.entity)]), ak.entity
            elif ak.verb == Verb.MOVE_JOB:
                ht, what = int(kind_ht[Kind.COOLING_LOOP][fleet.index_of(Kind.COOLING_LOOP, ak.episode)]), ak.episode
            else:
                continue
        except KeyError:
            continue
        if 0 < ht < rel:
            desired[k] = _kept(k, f"{what} healthy for {ht} of {rel} ticks; lifted after sustained recovery")

    decisions = Decisions(t_s=a.t_s, desired=desired, held=held, breaker_tripped=breaker.tripped,
                          breaker_reason=breaker.reason, frozen=frozen.scopes if frozen is not None else (),
                          held_by_freeze=n_frozen)
    return decisions, replace(state, breaker=breaker, episodes=tuple(new_episodes),
                              checkpoints=tuple(sorted(new_ckpts.items())))
