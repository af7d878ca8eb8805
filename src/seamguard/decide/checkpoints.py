"""checkpoint_now for exposed training jobs: risk episodes and pricing. Pure: no clock, no I/O.

Priced (decide/economics.py checkpoint_decision): the rollback a checkpoint now avoids
(work since the job's last checkpoint x its GPUs x P(failure before its next scheduled
one), the hazard from its exposed nodes' state and evidence) against the write
(checkpoint_write_s x its GPUs). Once per risk episode (a job on a node, open until the
node has been healthy episode_end_healthy_ticks): an episode on another of the job's nodes
is a new risk and may ask too, no sooner than Young's interval after the job's last
request. With ``reask_on_worse`` an episode already asked asks again when the evidence
worsens: the exposure reaches a stricter state than the one it was issued for, or the
job's failure hazard has grown ``reask_hazard_ratio`` times since it was asked. Any
request waits at least Young's interval at the job's hazard now, sqrt(2 x write x MTBF)
(J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
1974): checkpointing more often than that costs more in writes than it saves in rollback,
whatever one write's price says. A node already failed does not ask: no checkpoint avoids
a failure that has happened (recovery is the planner's remedy stage). A loop's or rack's
hazard counts once per job, not once per node it cools: one failing loop is one cause.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from seamguard.assess.assessment import Assessment, node_cause
from seamguard.assess.states import State
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.decide.economics import CheckpointContext, checkpoint_decision
from seamguard.decide.explain import evidence, summary
from seamguard.decide.policy import Policy
from seamguard.decide.tiers import young_interval_s
from seamguard.fleet.model import JOB_CLASS_BY_LABEL, Fleet, Kind


@dataclass(frozen=True)
class Episode:
    """A risk episode of one training job on one node, for checkpoint_now.

    Open while the node is exposed (its own or its cooling loop's / rack's state) and until
    it has been healthy ``episode_end_healthy_ticks``; ``level`` is the exposure state the
    job's checkpoint was last asked for in this episode (0: not yet), ``hazard_per_h`` the
    job's failure hazard then.
    """

    job: str
    node: str
    level: int = 0
    hazard_per_h: float = 0.0


# key of a checkpoint asked this tick -> (job, t_s of its checkpoint before, its episodes before)
Issued = dict[str, tuple[str, "float | None", list[Episode]]]


@dataclass(frozen=True, eq=False)
class Exposure:
    """Per node: the state a job there is exposed to, its GFS, its hazard; per job: the hazard summed."""

    node_state: np.ndarray  # int64, max of the node's own state and its domains' (loop, rack)
    node_gfs: np.ndarray  # worst of own / loop / rack GFS, at least its state's entry threshold
    job_hazard_per_h: np.ndarray  # hard failures per hour over the job's exposed nodes


@dataclass(frozen=True)
class CheckpointPlan:
    """What the checkpoint stage decided this tick, and the episode bookkeeping it carries on."""

    actions: dict[str, Action]  # new and carried checkpoint_now, in job order
    carried: frozenset[str]  # keys of checkpoints asked earlier in an open episode (not new)
    issued: Issued  # checkpoints asked this tick, with the job's state before (to undo if not asked)
    episodes: list[Episode]
    checkpoints: dict[str, float]  # job -> t_s of its last checkpoint_now


_PAIRS: weakref.WeakKeyDictionary[Fleet, tuple[np.ndarray, np.ndarray]] = weakref.WeakKeyDictionary()


def _job_domain_pairs(fleet: Fleet) -> tuple[np.ndarray, np.ndarray]:
    """(job, loop) and (job, rack) of the placed nodes, once each, as [2, k] in (job, domain)
    order: a function of the placement alone (a new placement is a new Fleet), worked out
    once per fleet rather than by a row-wise unique every tick."""
    got = _PAIRS.get(fleet)
    if got is None:
        placed = np.flatnonzero(fleet.node_job >= 0)
        jobs = fleet.node_job[placed].astype(np.int64)
        out = []
        for dom_of_node, n_dom in ((fleet.node_loop, fleet.count(Kind.COOLING_LOOP)),
                                   (fleet.node_rack, fleet.count(Kind.RACK))):
            width = max(n_dom, 1)
            key = np.sort(jobs * width + dom_of_node[placed])
            key = key[np.r_[True, key[1:] != key[:-1]]] if key.size else key
            out.append(np.stack([key // width, key % width]))
        got = _PAIRS[fleet] = (out[0], out[1])
    return got


def exposure(fleet: Fleet, a: Assessment, policy: Policy) -> Exposure:
    """How exposed each node is, and the hard-failure hazard per hour that exposure puts on each job.

    Hard-failure hazard of an entity: 0.5 x GFS^2 per hour (propagation), GFS at least the
    threshold of the state it is in. A job's hazard sums its nodes' own hazards and, once
    each, the hazards of the loops and racks its nodes are in.
    """
    h1 = policy.assess.propagation.hazard_per_h_at_gfs1
    hg = policy.assess.hysteresis_for(Kind.GPU)

    def hazard(state: np.ndarray, gfs: np.ndarray) -> np.ndarray:
        floor = np.where(state >= State.CHECKPOINT_UNSAFE, hg.quarantine_enter,
                         np.where(state >= State.DEGRADED, hg.degrade_enter, 0.0))
        g = np.maximum(np.nan_to_num(gfs), floor)
        return np.where(state > State.HEALTHY, h1 * g * g, 0.0)

    loop, rack = a.kinds[Kind.COOLING_LOOP], a.kinds[Kind.RACK]
    ex = np.maximum(a.node_state, a.node_domain_state[:, 2]).astype(np.int64)
    g = np.maximum.reduce([np.nan_to_num(a.node_gfs), loop.gfs[fleet.node_loop], rack.gfs[fleet.node_rack]])
    g = np.maximum(g, np.where(ex >= State.CHECKPOINT_UNSAFE, hg.quarantine_enter,
                               np.where(ex >= State.DEGRADED, hg.degrade_enter, 0.0)))
    n_jobs = len(fleet.job_names)
    placed = np.flatnonzero(fleet.node_job >= 0)
    jobs = fleet.node_job[placed]
    own = hazard(a.node_state.astype(np.int64), a.node_gfs)
    job_hazard = np.bincount(jobs, weights=own[placed], minlength=n_jobs)
    for pairs, dom in zip(_job_domain_pairs(fleet), (loop, rack)):
        dom_h = hazard(dom.states.state.astype(np.int64), dom.gfs)
        job_hazard += np.bincount(pairs[0], weights=dom_h[pairs[1]], minlength=n_jobs)
    return Exposure(ex, g, job_hazard)


def reask_spacing_s(write_s: float, hazard_per_h: float) -> float:
    """Young's interval at the job's hazard now (inf with no hazard): the soonest to ask again."""
    return young_interval_s(write_s, 3600.0 / hazard_per_h) if hazard_per_h > 0 else float("inf")


def jobs_to_consider(fleet: Fleet, ex: Exposure, policy: Policy, episodes: dict[str, list[Episode]],
                     last_ckpt: dict[str, float]) -> list[int]:
    """Checkpointable jobs that are exposed now or still carry an episode or a recent checkpoint."""
    ckpt_cls = np.isin(fleet.job_class, [JOB_CLASS_BY_LABEL[c] for c in policy.actions.checkpoint_classes])
    node_job = fleet.node_job
    job_index = {n: j for j, n in enumerate(fleet.job_names)}
    busy = set(node_job[(node_job >= 0) & (ex.node_state > State.HEALTHY)].tolist())
    busy |= {job_index[jn] for jn in list(episodes) + list(last_ckpt) if jn in job_index}
    return [j for j in sorted(busy) if ckpt_cls[j]]


def open_episodes(fleet: Fleet, j: int, prior: list[Episode], ex: Exposure, node_ht: np.ndarray,
                  end_healthy_ticks: int, node_of: Mapping[str, int]) -> dict[str, Episode]:
    """The job's episodes still open, by node: kept unless it left the node or the node recovered for good; new ones opened where exposed."""
    jn = fleet.job_names[j]
    mine = np.flatnonzero((fleet.node_job >= 0) & (fleet.node_job == j))
    here = {fleet.node_names[i] for i in mine.tolist()}
    eps: dict[str, Episode] = {}
    for e in prior:
        i = node_of.get(e.node)
        if i is None or e.node not in here:
            continue  # the job left the node: its episode there is over
        if ex.node_state[i] == State.HEALTHY and node_ht[i] >= end_healthy_ticks:
            continue  # sustained recovery ends the episode
        eps[e.node] = e
    for i in mine[ex.node_state[mine] > State.HEALTHY].tolist():
        eps.setdefault(fleet.node_names[i], Episode(jn, fleet.node_names[i], 0))
    return eps


def carried_checkpoint(job: str, t: float, cause: str) -> Action:
    """A checkpoint asked earlier in an open episode, carried as it is (not asked again).

    ``cause`` is what the job was asked for (its exposed node, the moved job's cause): a job
    is never the cause of an action taken on its behalf (issue 37)."""
    return Action(key=action_key(Verb.CHECKPOINT_NOW, job, f"t{int(t)}"), verb=Verb.CHECKPOINT_NOW, target=job,
                  target_kind="job", reason=f"seamguard: checkpoint asked at t={t:.0f}s; not repeated while "
                                            "the risk episode lasts", cause=cause)


def _worst_episode_node(eps) -> str:
    """The node of the episode asked at the highest exposure level: what a carried checkpoint is for."""
    return max(eps, key=lambda e: e.level).node


def uncommitted_and_horizon_s(a: Assessment, j: int, last: float | None, interval_s: float) -> tuple[float, float]:
    """The job's work since its last checkpoint and the time until its next one, seconds.

    Measured where the job's runtime reports its rollback exposure
    (``seamguard_job_uncommitted_seconds``); a job past the policy's interval is taken to
    checkpoint one interval from now. Otherwise assumed: the time since seamguard's own
    last request, or half an interval (a job at a random point of its cycle)."""
    measured = float(a.job_uncommitted_s[j]) if a.job_uncommitted_s is not None else float("nan")
    if np.isfinite(measured):
        uncommitted = max(measured, 0.0)
        return uncommitted, interval_s - uncommitted if uncommitted < interval_s else interval_s
    since = a.t_s - last if last is not None else np.inf
    uncommitted = since if since < interval_s else interval_s / 2.0
    return uncommitted, max(interval_s - uncommitted, 0.0)


def price_checkpoint(fleet: Fleet, a: Assessment, policy: Policy, ex: Exposure, j: int, worse: list[int],
                     last: float | None, crit: np.ndarray) -> Action | None:
    """checkpoint_now for a job whose exposure got worse, if the rollback it avoids outweighs the write."""
    obj, prop = policy.objective, policy.assess.propagation
    interval_s = prop.checkpoint_interval_h * 3600.0
    uncommitted, horizon = uncommitted_and_horizon_s(a, j, last, interval_s)
    dec = checkpoint_decision(CheckpointContext(
        job_gpus=max(int(float(fleet.job_gpu_count[j])), 1), uncommitted_s=uncommitted,
        horizon_s=horizon, hazard_per_h=float(ex.job_hazard_per_h[j]),
        write_s=policy.actions.checkpoint_write_s))
    if dec.action != "checkpoint":
        return None
    worst = max(worse, key=lambda i: (ex.node_state[i], ex.node_gfs[i]))
    lv = int(ex.node_state[worst])
    _, _, reasons = node_cause(fleet, a.kinds, worst)
    jn = fleet.job_names[j]
    return Action(key=action_key(Verb.CHECKPOINT_NOW, jn, f"t{int(a.t_s)}"), verb=Verb.CHECKPOINT_NOW, target=jn,
                  target_kind="job",
                  reason=f"seamguard: job exposed to {State(lv).label} {fleet.node_names[worst]} "
                         f"({summary(reasons)}); rollback avoided {dec.benefit_gpu_h:.2f} GPU-h > "
                         f"write {dec.cost_gpu_h:.2f} GPU-h",
                  cause=fleet.node_names[worst], evidence=evidence(reasons),
                  benefit_gpu_h_per_h=round(dec.benefit_gpu_h / obj.horizon_h, 4),
                  cost_gpu_h_per_h=round(dec.cost_gpu_h / obj.horizon_h, 4), criticality=float(crit[j]))


@dataclass(frozen=True)
class JobCheckpoint:
    """One job's checkpoint decision this tick and its episodes after it."""

    action: Action | None
    carried: bool  # the action is a checkpoint asked earlier, carried
    issued: tuple[str, float | None, list[Episode]] | None  # (job, last before, episodes before) if asked now
    episodes: list[Episode]  # sorted by node
    last_s: float | None  # t_s of its last checkpoint_now


def worsened(e: Episode, state_now: int, job_hazard_per_h: float, ratio: float) -> bool:
    """The evidence worsened since this episode's checkpoint: a stricter state, or the job's hazard ``ratio`` x."""
    if state_now > e.level:
        return True
    return e.level > 0 and e.hazard_per_h > 0 and job_hazard_per_h >= ratio * e.hazard_per_h


def job_checkpoint(fleet: Fleet, a: Assessment, policy: Policy, ex: Exposure, j: int, prior: list[Episode],
                   last: float | None, node_ht: np.ndarray, crit: np.ndarray,
                   node_of: Mapping[str, int]) -> JobCheckpoint:
    """Ask one job for a checkpoint where an episode got stricter and it pays; else carry the one asked."""
    jn = fleet.job_names[j]
    eps = open_episodes(fleet, j, prior, ex, node_ht, policy.actions.episode_end_healthy_ticks, node_of)
    hazard = float(ex.job_hazard_per_h[j])
    # An episode not asked yet asks (a new fault on another of the job's nodes is a new risk);
    # one already asked asks again only with reask_on_worse.
    worse = [node_of[e.node] for e in eps.values()
             if ex.node_state[node_of[e.node]] < State.FAILED
             and (e.level == 0 or policy.actions.reask_on_worse)
             and worsened(e, int(ex.node_state[node_of[e.node]]), hazard, policy.actions.reask_hazard_ratio)]
    spaced = last is None or a.t_s - last >= reask_spacing_s(policy.actions.checkpoint_write_s, hazard)
    act = price_checkpoint(fleet, a, policy, ex, j, worse, last, crit) if worse and spaced else None
    issued = None
    if act is not None:
        issued = (jn, last, list(eps.values()))
        eps = {n: replace(e, level=max(e.level, int(ex.node_state[node_of[n]])), hazard_per_h=hazard)
               for n, e in eps.items()}
        last = a.t_s
    carried = act is None and last is not None and any(e.level > 0 for e in eps.values())
    if carried:
        act = carried_checkpoint(jn, last, _worst_episode_node(eps.values()))
    return JobCheckpoint(act, carried, issued, [eps[n] for n in sorted(eps)], last)


def plan_checkpoints(fleet: Fleet, a: Assessment, policy: Policy, episodes: tuple[Episode, ...],
                     checkpoints: tuple[tuple[str, float], ...], node_ht: np.ndarray,
                     crit: np.ndarray, ex: Exposure | None = None) -> CheckpointPlan:
    """checkpoint_now for every exposed training job, at most once per risk episode unless it worsens."""
    ex = exposure(fleet, a, policy) if ex is None else ex
    interval_s = policy.assess.propagation.checkpoint_interval_h * 3600.0
    by_job: dict[str, list[Episode]] = {}
    for e in episodes:
        by_job.setdefault(e.job, []).append(e)
    last_ckpt = dict(checkpoints)
    node_of = fleet.index_table(Kind.NODE)
    actions: dict[str, Action] = {}
    carried: set[str] = set()
    issued: Issued = {}
    new_episodes: list[Episode] = []
    new_ckpts: dict[str, float] = {}
    for j in jobs_to_consider(fleet, ex, policy, by_job, last_ckpt):
        jn = fleet.job_names[j]
        jc = job_checkpoint(fleet, a, policy, ex, j, by_job.get(jn, []), last_ckpt.get(jn), node_ht, crit, node_of)
        if jc.action is not None:
            actions[jc.action.key] = jc.action
            if jc.carried:
                carried.add(jc.action.key)
            if jc.issued is not None:
                issued[jc.action.key] = jc.issued
        new_episodes += jc.episodes
        if jc.last_s is not None and (jc.episodes or a.t_s - jc.last_s < interval_s):
            new_ckpts[jn] = jc.last_s
    return CheckpointPlan(actions, frozenset(carried), issued, new_episodes, new_ckpts)


def undo_unasked(plan: CheckpointPlan, desired: dict[str, Action]
                 ) -> tuple[dict[str, Action], list[Episode], dict[str, float]]:
    """A checkpoint the freeze held back was not asked: the job's episodes stay as they were."""
    desired, episodes, ckpts = dict(desired), list(plan.episodes), dict(plan.checkpoints)
    for k, (jn, before, eps_before) in plan.issued.items():
        if k in desired:
            continue
        episodes = [e for e in episodes if e.job != jn] + eps_before
        if before is None:
            ckpts.pop(jn, None)
        else:
            ckpts[jn] = before
            if any(e.level > 0 for e in eps_before):
                carried = carried_checkpoint(jn, before, _worst_episode_node(eps_before))
                desired[carried.key] = carried
    return desired, episodes, ckpts


def plan_move_checkpoints(fleet: Fleet, policy: Policy, desired: dict[str, Action], in_effect: set[str],
                          asked: dict[str, float], last_ckpt: dict[str, float], hazard_per_h: np.ndarray,
                          t_s: float) -> tuple[dict[str, Action], dict[str, float]]:
    """checkpoint_now for a checkpointable job a move is about to requeue, asked once per move.

    A move kills the job and restarts it from its last persisted checkpoint: everything since is
    lost for certain, so the checkpoint is not priced against a hazard as an episode's is. It is
    asked on the move's first tick (the reconciler applies checkpoints before moves, and the Slurm
    actuator waits ``checkpoint_grace_s`` before the requeue) and carried under the same key while
    the move is on its way, so it is never asked twice; once the move is in effect (requeued) or
    no longer desired, nothing is carried. A job asked for a checkpoint less than Young's interval
    at its hazard ago (this tick's episode request included; at most the policy's checkpoint
    interval) is not asked again: that request is the move's. ``asked``: move key -> t_s of the
    checkpoint request the move carries; ``last_ckpt``: job -> t_s of its last request."""
    ckpt_cls = {JOB_CLASS_BY_LABEL[c] for c in policy.actions.checkpoint_classes}
    job_index = {n: j for j, n in enumerate(fleet.job_names)}
    interval_s = policy.assess.propagation.checkpoint_interval_h * 3600.0
    out, now_asked = dict(desired), {}
    for k, act in desired.items():
        if act.verb != Verb.MOVE_JOB or k in in_effect:
            continue
        j = job_index.get(act.target)
        if j is None or int(fleet.job_class[j]) not in ckpt_cls:
            continue
        t = asked.get(k)
        if t is None:
            last = last_ckpt.get(act.target)
            spacing_s = min(reask_spacing_s(policy.actions.checkpoint_write_s, float(hazard_per_h[j])), interval_s)
            if last is not None and t_s - last < spacing_s:
                t = last  # the job's recent request serves the move
            else:
                t = t_s
                key = action_key(Verb.CHECKPOINT_NOW, act.target, f"t{int(t)}")
                out[key] = Action(
                    key=key, verb=Verb.CHECKPOINT_NOW, target=act.target, target_kind="job", cause=act.cause,
                    criticality=act.criticality,
                    reason=f"seamguard: before {k} (a requeue loses everything since the last persisted checkpoint)")
        carried = carried_checkpoint(act.target, t, act.cause or act.target)
        out.setdefault(carried.key, carried)
        now_asked[k] = t
    return out, now_asked
