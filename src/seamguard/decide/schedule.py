"""The schedule stage: each job's deadline-slip forecast this tick, and the slip an action saves.

decide/slip.py holds the model (pure arrays); this module applies it to the fleet and the
assessment — work left from the runtime's progress, hazard from the job's exposure, loss per
failure from its measured rollback — and prices drains, moves, sheds and checkpoints in slip
seconds for the planner (decide/planner.py), recording each forecast as evidence. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from seamguard.assess.assessment import Assessment
from seamguard.decide.actions import Action
from seamguard.decide.checkpoints import Exposure, uncommitted_and_horizon_s
from seamguard.decide.economics import impact_fraction
from seamguard.decide.policy import Policy
from seamguard.decide.slip import (
    SlipForecast,
    checkpoint_slip_saved_s,
    slip_forecast,
    slip_saved_s,
    work_left_s,
)
from seamguard.fleet.model import Fleet, JobClass, Kind


@dataclass(frozen=True, eq=False)
class Schedule:
    """Each job's schedule-slip forecast this tick and what it was computed from (decide/slip.py)."""

    forecast: SlipForecast
    deadline_s: np.ndarray  # Unix s, NaN: none
    hazard_per_h: np.ndarray  # the job's hard-failure hazard (checkpoints.exposure)
    loss_per_failure_s: np.ndarray  # rollback (measured, else half an interval) + restart
    slip_weight: float
    job_names: list[str]

    def saved(self, j: int, now_s: float, *, speedup: float = 1.0, hazard_removed_per_h: float = 0.0,
              stall_s: float = 0.0) -> tuple[float, float, float]:
        """(slip saved, without, with) in seconds by an action on job ``j`` (zeros: no deadline or weight 0)."""
        if self.slip_weight <= 0 or j < 0 or not np.isfinite(self.forecast.expected_slip_s[j]):
            return 0.0, 0.0, 0.0
        return slip_saved_s(now_s, float(self.deadline_s[j]), float(self.forecast.work_left_s[j]),
                            float(self.hazard_per_h[j]), float(self.loss_per_failure_s[j]), speedup=speedup,
                            hazard_removed_per_h=hazard_removed_per_h, stall_s=stall_s)


def schedule(fleet: Fleet, a: Assessment, policy: Policy, ex: Exposure) -> Schedule:
    """Each job's slip forecast: work left from the runtime's step and step time (else the config's),
    failure hazard from its exposure, loss per failure from its measured rollback exposure."""
    prop, n = policy.assess.propagation, len(fleet.job_names)
    deadline, total, step_cfg = fleet.job_schedule()
    nan = np.full(n, np.nan)
    work, _ = work_left_s(total, a.job_steps_done if a.job_steps_done is not None else nan,
                          a.job_step_s if a.job_step_s is not None else nan, step_cfg)
    unc = a.job_uncommitted_s if a.job_uncommitted_s is not None else nan
    rollback = np.where(np.isfinite(unc), np.maximum(unc, 0.0), prop.checkpoint_interval_h * 3600.0 / 2.0)
    loss = rollback + prop.restart_h * 3600.0
    hazard = np.asarray(ex.job_hazard_per_h, dtype=float)
    return Schedule(slip_forecast(a.t_s, deadline, work, hazard, loss), deadline, hazard, loss,
                    policy.objective.slip_weight, fleet.job_names)


def slip_gpu_h(fleet: Fleet, sched: Schedule, j: int, saved_s: float) -> float:
    """Slip seconds saved as GPU-hours of the objective: x the job's GPUs x slip_weight / 3600."""
    return sched.slip_weight * max(saved_s, 0.0) * float(fleet.job_gpu_count[j]) / 3600.0


def slip_evidence(sched: Schedule, j: int, saved: tuple[float, float, float] | None = None
                  ) -> tuple[tuple[str, float, float, str], ...]:
    """What an action records about its job's schedule (explanations are data; `seamguard review` reads them),
    each channel suffixed ``:<job>`` (a drain's target is a node): ``deadline_slip`` (expected slip s, the
    deadline Unix s), ``deadline_miss`` (P(miss), expected finish Unix s) and, where priced,
    ``slip_saved`` (s saved, expected slip without the action)."""
    f = sched.forecast
    if j < 0 or not np.isfinite(f.expected_slip_s[j]):
        return ()
    job = sched.job_names[j]
    out = ((f"deadline_slip:{job}", round(float(f.expected_slip_s[j]), 1), float(sched.deadline_s[j]), "s"),
           (f"deadline_miss:{job}", round(float(f.p_miss[j]), 4), round(float(f.expected_finish_s[j]), 1),
            "probability"))
    if saved is not None:
        out += ((f"slip_saved:{job}", round(saved[0], 1), round(saved[1], 1), "s"),)
    return out


def drain_slip_s(fleet: Fleet, a: Assessment, policy: Policy, i: int, slowdown: float,
                 sched: Schedule | None) -> tuple[float, float, float]:
    """(slip saved, without, with) in seconds by swapping node ``i`` out from under its job: the step no
    longer slowed by it, its hazard gone, one swap stall paid."""
    if sched is None:
        return 0.0, 0.0, 0.0
    obj, prop = policy.objective, policy.assess.propagation
    j = int(fleet.node_job[i])
    impact = impact_fraction(JobClass(int(fleet.job_class[j])), int(float(fleet.job_gpu_count[j])),
                             int(fleet.node_gpu_count[i]), slowdown)
    return sched.saved(j, a.t_s, speedup=1.0 / max(1.0 - impact, 1e-3),
                       hazard_removed_per_h=prop.hazard_per_h_at_gfs1 * float(a.node_gfs[i]) ** 2,
                       stall_s=obj.migrate_h * 3600.0)


def move_slip_s(policy: Policy, j: int, loop_gfs: float, sched: Schedule | None,
                now_s: float) -> tuple[float, float, float]:
    """(slip saved, without, with) in seconds by moving job ``j`` off a loop of GFS ``loop_gfs``."""
    if sched is None:
        return 0.0, 0.0, 0.0
    obj, prop, g = policy.objective, policy.assess.propagation, loop_gfs
    return sched.saved(j, now_s, speedup=1.0 / max(1.0 - 0.3 * g, 1e-3),
                       hazard_removed_per_h=prop.hazard_per_h_at_gfs1 * g * g, stall_s=obj.migrate_h * 3600.0)


def shed_priority(fleet: Fleet, sched: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """(what a job is worth keeping on its loop, its slack s) for shedding: criticality x (1 + slip_weight x
    P(miss)), then the most slack first (a job without a deadline has all the slack there is)."""
    p = np.nan_to_num(sched.forecast.p_miss, nan=0.0)
    slack = np.where(np.isfinite(sched.forecast.slack_s), sched.forecast.slack_s, np.inf)
    return fleet.job_criticality * (1.0 + sched.slip_weight * p), slack


def checkpoint_slip_s(fleet: Fleet, a: Assessment, policy: Policy, sched: Schedule, j: int,
                      last_s: float | None) -> tuple[float, float, float]:
    """(slip saved, without, with) in seconds by job ``j``'s checkpoint_now: the rollback a failure before its
    next scheduled checkpoint would cost (as the checkpoint was priced) against the write, both as slip."""
    if not np.isfinite(sched.forecast.expected_slip_s[j]):
        return 0.0, 0.0, 0.0
    interval_s = policy.assess.propagation.checkpoint_interval_h * 3600.0
    uncommitted, horizon = uncommitted_and_horizon_s(a, j, last_s, interval_s)
    p_fail = -float(np.expm1(-float(sched.hazard_per_h[j]) * horizon / 3600.0))
    return checkpoint_slip_saved_s(a.t_s, float(sched.deadline_s[j]), float(sched.forecast.work_left_s[j]),
                                   float(sched.hazard_per_h[j]), float(sched.loss_per_failure_s[j]), p_fail,
                                   uncommitted, policy.actions.checkpoint_write_s)


def checkpoints_with_slip(actions: dict[str, Action], issued: set[str], fleet: Fleet, a: Assessment,
                          policy: Policy, sched: Schedule, last: dict[str, float]) -> dict[str, Action]:
    """checkpoint_now asked this tick (``issued``) with the slip it saves recorded (it is priced by the
    rollback against the write: a deadline weighs both sides, so it is recorded, not a term)."""
    out = dict(actions)
    for k in issued & set(actions):
        act = actions[k]
        try:
            j = fleet.index_of(Kind.JOB, act.target)
        except KeyError:
            continue
        extra = slip_evidence(sched, j, checkpoint_slip_s(fleet, a, policy, sched, j, last.get(act.target)))
        if extra:
            out[k] = replace(act, evidence=act.evidence + extra)
    return out


def with_slip(act: Action, fleet: Fleet, sched: Schedule) -> Action:
    """A job's action with its schedule forecast in its evidence (once; a priced one carries it already)."""
    if act.target_kind != "job" or any(e[0].startswith("deadline_slip:") for e in act.evidence):
        return act
    try:
        j = fleet.index_of(Kind.JOB, act.target)
    except KeyError:
        return act
    extra = slip_evidence(sched, j)
    return replace(act, evidence=act.evidence + extra) if extra else act
