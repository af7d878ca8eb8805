"""A shorter checkpoint interval for a training job while its nodes are at risk. Pure.

``checkpoint_now`` writes one checkpoint when a job becomes exposed; the risk then lasts
(a GPU degrading for hours, a cooling loop losing flow). While it lasts the job's optimal
interval is shorter: Young's ``sqrt(2 x write x MTTF)`` at the hazard its exposed nodes
put on it (the hazard ``checkpoints.exposure`` prices ``checkpoint_now`` with). The
decision is level-triggered: ``checkpoint_interval:<job>=<seconds>`` held while the
exposure lasts, reverted (the job's own interval again) when it ends. The interval is a
rung of a ladder of halvings of the job's assumed interval
(``assess.propagation.checkpoint_interval_h``), so the key changes only when the hazard
moves by a factor, not with every tick's noise; it is chosen only where it saves more
rollback than its extra writes cost, both in GPU-hours per hour of the job.
"""

from __future__ import annotations

import math

import numpy as np

from seamguard.assess.states import State
from seamguard.decide.actions import Action, ActionKey, Verb, action_key
from seamguard.decide.checkpoints import Exposure
from seamguard.decide.explain import kept
from seamguard.decide.policy import Policy
from seamguard.decide.tiers import young_interval_s
from seamguard.fleet.model import JOB_CLASS_BY_LABEL, Fleet

MAX_HALVINGS = 6  # at most 1/64 of the job's own interval


def ladder_interval_s(own_s: float, young_s: float, write_s: float) -> float | None:
    """The longest rung of ``own_s / 2^k`` at or below Young's interval (None: the job's own is short enough).

    Never below twice the write: Young's first-order optimum assumes the write is short
    against the interval."""
    if young_s >= own_s:
        return None
    k = min(math.ceil(math.log2(own_s / young_s)), MAX_HALVINGS)
    while k > 1 and own_s / 2 ** k < 2 * write_s:
        k -= 1
    rung = own_s / 2 ** k
    return rung if rung >= 2 * write_s else None


def gpu_h_per_h(hazard_per_h: float, interval_s: float, write_s: float) -> float:
    """Expected share of a GPU lost at an interval: rollback (half an interval per failure) plus writes."""
    return hazard_per_h * interval_s / 2 / 3600.0 + write_s / interval_s


def plan_checkpoint_intervals(fleet: Fleet, policy: Policy, ex: Exposure, crit: np.ndarray,
                              in_effect: set[str], in_episode: set[str]) -> dict[str, Action]:
    """checkpoint_interval for each exposed job of a checkpointed class where the shorter interval pays.

    One in effect stays while its job is exposed or its risk episode is open
    (``in_episode``: the jobs with an open episode, checkpoints.open_episodes), though this
    tick's hazard alone would not ask for it (a dip in the evidence, a restarted
    controller's first ticks): a job's interval changes rung by rung and goes back only
    when its risk episode ends. Within the episode the interval only tightens: a hazard that
    dips for a tick (node evidence wobbling across a rung's boundary) keeps the shorter rung
    in effect instead of loosening and tightening it again every tick."""
    rules = policy.actions
    if not rules.adapt_checkpoint_interval:
        return {}
    out = _wanted(fleet, policy, ex, crit)
    asked = {a.target: (k, float(a.param("interval_s"))) for k, a in out.items()}
    job_index = {n: j for j, n in enumerate(fleet.job_names)}
    for k in sorted(in_effect):
        ak = ActionKey.parse(k)
        if ak.verb != Verb.CHECKPOINT_INTERVAL or ak.entity not in job_index:
            continue
        if ak.entity in asked:
            new_key, new_s = asked[ak.entity]
            if new_key != k and new_s > float(ak.value):
                del out[new_key]
                out[k] = kept(k, f"{ak.entity}'s interval only tightens while it is at risk (wanted {new_s:.0f} s)")
        elif ak.entity in in_episode or ex.job_hazard_per_h[job_index[ak.entity]] > 0:
            out[k] = kept(k, f"{ak.entity} is in a risk episode; its own interval comes back when the episode ends")
    return out


def _wanted(fleet: Fleet, policy: Policy, ex: Exposure, crit: np.ndarray) -> dict[str, Action]:
    rules = policy.actions
    own_s = policy.assess.propagation.checkpoint_interval_h * 3600.0
    ckpt_cls = np.isin(fleet.job_class, [JOB_CLASS_BY_LABEL[c] for c in rules.checkpoint_classes])
    out: dict[str, Action] = {}
    for j in np.flatnonzero(ckpt_cls & (ex.job_hazard_per_h > 0)).tolist():
        hazard = float(ex.job_hazard_per_h[j])
        young = young_interval_s(rules.checkpoint_write_s, 3600.0 / hazard)
        rung = ladder_interval_s(own_s, young, rules.checkpoint_write_s)
        if rung is None:
            continue
        gpus = max(int(float(fleet.job_gpu_count[j])), 1)
        saved = gpus * hazard * (own_s - rung) / 2 / 3600.0
        extra = gpus * rules.checkpoint_write_s * (1 / rung - 1 / own_s)
        if saved <= extra:
            continue
        nodes = np.flatnonzero((fleet.node_job == j) & (ex.node_state > State.HEALTHY))
        worst = int(nodes[np.lexsort((ex.node_gfs[nodes], ex.node_state[nodes]))[-1]]) if nodes.size else -1
        cause = fleet.node_names[worst] if worst >= 0 else fleet.job_names[j]
        jn = fleet.job_names[j]
        out_key = action_key(Verb.CHECKPOINT_INTERVAL, jn, value=f"{rung:.0f}")
        out[out_key] = Action(
            key=out_key, verb=Verb.CHECKPOINT_INTERVAL, target=jn, target_kind="job",
            params=(("interval_s", f"{rung:.0f}"),),
            reason=(f"seamguard: job exposed (hazard {hazard:.3g}/h, worst {cause} "
                    f"{State(int(ex.node_state[worst])).label if worst >= 0 else ''}): checkpoint every "
                    f"{rung:.0f} s instead of {own_s:.0f} s (Young's {young:.0f} s at a "
                    f"{rules.checkpoint_write_s:g} s write); rollback saved {saved:.3g} > extra writes "
                    f"{extra:.3g} GPU-h/h"),
            cause=cause, evidence=(("job_hazard", hazard, hazard, "per_h"), ("young_interval", young, young, "s")),
            benefit_gpu_h_per_h=round(saved, 4), cost_gpu_h_per_h=round(extra, 4), criticality=float(crit[j]))
    return out
