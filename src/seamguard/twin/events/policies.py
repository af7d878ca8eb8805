"""The policies the event twin compares, each a strategy built from named parts.

Why this file exists: a policy is what a team would actually run, put together from three
parts the simulator calls without knowing which policy it runs:

* an **interval rule** — a fixed interval, Young/Daly's from the job's failure rate, or the
  pure checkpoint planner :func:`seamguard.decide.tiers.plan_checkpoint` (tier and
  Daly interval; ``decide`` has no interval entry point of its own yet);
* a **recovery** — requeue and restart the whole job from storage, restart every rank in
  place from a peer's memory (NVRx / torchft style), or seamguard's live recovery;
* a **control plane** or none — seamguard's detection of gray failures and precursors,
  whose drain / keep and checkpoint-now calls are the live controller's own economic
  rules (:func:`seamguard.decide.economics.quarantine_decision` and
  :func:`~seamguard.decide.economics.checkpoint_decision`, which
  ``decide.planner.quarantine_pays`` and ``decide.checkpoints.price_checkpoint`` call);

and links that either fail over to the other rail or stall. Every cost a part pays is a
field of :class:`~seamguard.twin.events.config.CostModel`. :func:`build_policy` is the one
place a policy's name is looked at. Callers: :mod:`seamguard.twin.events.simulator`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from seamguard.decide.economics import (
    CheckpointContext,
    DegradedNodeContext,
    checkpoint_decision,
    quarantine_decision,
)
from seamguard.decide.tiers import (
    Mode,
    PlannerInput,
    StoragePath,
    TierCosts,
    plan_checkpoint,
)
from seamguard.reliability import Scope, daly_interval_s
from seamguard.twin.events.calibration import HANG_CAUSES, FailureModel
from seamguard.twin.events.config import ClusterConfig, CostModel, PolicyParams
from seamguard.twin.events.detection import DetectionModel

if TYPE_CHECKING:  # the simulator's run and job; imported for types only
    from seamguard.twin.events.simulator import _Job, _Run

__all__ = [
    "ControlPlane",
    "FixedInterval",
    "InJobRestart",
    "Links",
    "LiveRecovery",
    "PlannerInterval",
    "Policy",
    "RequeueRestart",
    "StragglerDetection",
    "YoungDalyInterval",
    "all_scope_hazards",
    "build_policy",
    "tier_costs",
]

CKPT = "checkpoint_overhead"


def tier_costs(pp: PolicyParams) -> TierCosts:
    """Checkpoint tier costs the planner chooses among, from the policy's costs."""
    c = pp.cost_model
    return TierCosts(full_write_s=pp.full_write_s, full_restore_s=pp.full_write_s,
                     in_memory_stall_s=pp.in_memory_stall_s, in_memory_restore_s=c.load_s,
                     # Replication to a peer runs after the local copy; we charge a
                     # quarter of the copy as extra stall (assumption, see docs).
                     peer_extra_stall_s=0.25 * pp.in_memory_stall_s,
                     backstop_async=True)


def all_scope_hazards(cfg: ClusterConfig) -> dict[Scope, float]:
    """Per-node hazard (1/s) of every hard failure, by the scope of what it destroys."""
    fm = cfg.failures
    out: dict[Scope, float] = defaultdict(float)
    for c in fm.causes:
        out[c.scope] += c.rate_per_node_day() / 86_400.0
    trip = fm.cooling_event_per_loop_day * fm.cooling_trip_probability / cfg.nodes_per_loop
    out[Scope.DOMAIN] += trip / 86_400.0
    return dict(out)


# ------------------------------------------------------------------ interval rules

@dataclass(frozen=True)
class FixedInterval:
    """A fixed compute interval between checkpoints, each stalling ``write_blocking_s``."""

    mode: str = Mode.FULL.value

    def plan(self, run: _Run, job: _Job, t: float) -> None:
        c = run.costs
        job.tau, job.delta, job.lag, job.mode = c.interval_s, c.write_blocking_s, c.write_async_s, self.mode

    def replan(self, run: _Run, job: _Job, precursor_hazard_per_s: float = 0.0):
        """A fixed interval does not move with the hazard."""
        return


@dataclass(frozen=True)
class YoungDalyInterval:
    """Daly's optimum for the job's MTTF (every failure that rolls it back) and the
    blocking part of the write; never shorter than the asynchronous part (a write cannot
    start before the one before it has drained)."""

    mode: str

    def plan(self, run: _Run, job: _Job, t: float) -> None:
        c = run.costs
        hz = sum(run.scope_hz.values()) * job.spec.nodes
        delta = max(c.write_blocking_s, 1e-6)
        tau = daly_interval_s(delta, 1.0 / hz) if hz > 0 else math.inf
        job.tau, job.delta, job.lag, job.mode = max(tau, c.write_async_s), c.write_blocking_s, \
            c.write_async_s, self.mode

    def replan(self, run: _Run, job: _Job, precursor_hazard_per_s: float = 0.0):
        """Planned once for the job's average failure rate; evidence does not reach it."""
        return


@dataclass(frozen=True)
class PlannerInterval:
    """The checkpoint planner chooses tier and interval from the hazards the policy's
    recovery still rolls back, and re-plans when the control plane raises a hazard."""

    def plan(self, run: _Run, job: _Job, t: float) -> None:
        job.advance(t)
        self.apply(run, job, self.planner(run, job))
        if run.pp.runtime_overhead == "measured_wall":
            job.base_speed = 1.0 / run.pp.runtime.wall_ratio

    def replan(self, run: _Run, job: _Job, precursor_hazard_per_s: float = 0.0):
        """Plan again for the job's current hazard multipliers; adopt it and return it."""
        plan = self.planner(run, job, precursor_hazard_per_s)
        self.apply(run, job, plan)
        return plan

    @staticmethod
    def apply(run: _Run, job: _Job, plan) -> None:
        """Adopt a plan. When the memory tier covers nothing that rolls back (interval
        infinite), the job cycles on the storage backstop, each backstop paying the
        host-memory snapshot its persister drains."""
        job.mode = plan.mode.value
        job.backstop_s = plan.backstop_interval_s or math.inf
        if math.isfinite(plan.interval_s) or not math.isfinite(job.backstop_s):
            job.tau, job.delta = plan.interval_s, plan.stall_s
        else:
            job.tau, job.delta = job.backstop_s, run.tiers.in_memory_stall_s

    @staticmethod
    def planner(run: _Run, job: _Job, precursor_hazard_per_s: float = 0.0):
        total = sum(run.scope_hz.values())
        mults = np.ones(job.spec.nodes)
        if job.mults:
            mults[: len(job.mults)] = list(job.mults.values())
        return plan_checkpoint(PlannerInput(
            entity_hazard_per_s=total, hazard_multipliers=mults, costs=run.tiers,
            scope_fractions=run.scope_hz or {Scope.PROCESS: 1.0},
            storage_paths=(StoragePath("storage"),),
            since_last_checkpoint_s=job.uncommitted,
            precursor_hazard_per_s=precursor_hazard_per_s))


# ------------------------------------------------------------------ recoveries

def _hang_s(c: CostModel, cause: str) -> float:
    """A hang (no process exits) first has to be noticed by a timeout."""
    return c.hang_detect_s if cause in HANG_CAUSES else 0.0


def _back_to_storage(run: _Run, job: _Job, cause: str, interval_s: float) -> None:
    """Corruption found later: the memory copies are suspect; back to the newest storage
    copy, drawn over its interval (a copy still being written does not count yet)."""
    if not math.isfinite(interval_s):
        return
    back = float(run.rng.uniform(0, interval_s))
    if back < run.pp.full_write_s:
        back += interval_s
    extra = min(job.committed, back * job.base_speed)
    job.committed -= extra
    job.lost[cause] += extra
    job.rollback += extra


class _Restart:
    """What every restarting recovery shares: a failure costs half an interval of work plus
    the resume, and a node drained ahead of time costs a planned checkpoint and resume."""

    def rolls_back(self, pp: PolicyParams, hz: dict[Scope, float]) -> dict[Scope, float]:
        return hz

    def resume_s(self, run: _Run, job: _Job) -> float:
        raise NotImplementedError

    def planned_s(self, run: _Run, job: _Job) -> float:
        raise NotImplementedError

    def failure_loss_s(self, run: _Run, job: _Job) -> float:
        return job.tau / 2.0 + self.resume_s(run, job)

    def drain(self, run: _Run, job: _Job) -> tuple[float, bool]:
        """A node taken out ahead of time: checkpoint, then restart without it."""
        job.commit_now()
        return self.planned_s(run, job), True


@dataclass(frozen=True)
class RequeueRestart(_Restart):
    """The job stops, goes back to its newest completed storage checkpoint, is requeued
    and restarted: ``hang_detect + requeue + restart + load``."""

    def resume_s(self, run: _Run, job: _Job) -> float:
        c = run.costs
        return c.requeue_s + c.restart_s + c.load_s

    def planned_s(self, run: _Run, job: _Job) -> float:
        """Maintenance: a checkpoint right before (written through), then a restart."""
        c = run.costs
        return c.write_blocking_s + c.write_async_s + self.resume_s(run, job)

    def hard_failure(self, run: _Run, job: _Job, cause: str, scope: Scope,
                     needs_nodes: bool) -> tuple[float, bool, bool]:
        job.rollback_to_checkpoint(cause)
        return _hang_s(run.costs, cause) + self.resume_s(run, job), True, needs_nodes


@dataclass(frozen=True)
class InJobRestart(_Restart):
    """Every rank restarts in place (no requeue; a hot spare replaces a lost node) and
    loads the newest in-memory checkpoint from a peer (a drained node: checkpoint to a
    peer, restart in place); silent corruption goes back to the storage copy."""

    def resume_s(self, run: _Run, job: _Job) -> float:
        c = run.costs
        return c.requeue_s + c.restart_s * run.pp.rank_scale(job.gpus) + c.load_s

    def planned_s(self, run: _Run, job: _Job) -> float:
        return run.costs.write_blocking_s + self.resume_s(run, job)

    def hard_failure(self, run: _Run, job: _Job, cause: str, scope: Scope,
                     needs_nodes: bool) -> tuple[float, bool, bool]:
        job.rollback_to_checkpoint(cause)
        if scope is Scope.PERSISTED:
            _back_to_storage(run, job, cause, run.costs.backstop_interval_s)
        return _hang_s(run.costs, cause) + self.resume_s(run, job), True, needs_nodes


@dataclass(frozen=True)
class LiveRecovery:
    """seamguard's runtime: survivors keep their live state and a spare takes the lost
    rank's over (only the step in flight is redone); a crash of every rank relaunches
    from the snapshots left in host memory; corruption the step guard catches costs the
    step, the rest goes back to the storage backstop in place."""

    def rolls_back(self, pp: PolicyParams, hz: dict[Scope, float]) -> dict[Scope, float]:
        """What still rolls back: a crash of every rank at once that the processes could
        not capture on their way out (to the newest host-memory snapshot) and silent
        corruption the step guard did not catch (to storage)."""
        uncaptured = pp.job_wide_crash_fraction * (1.0 - pp.crash_capture_fraction)
        kept = {Scope.PROCESS: uncaptured * hz.get(Scope.PROCESS, 0.0),
                Scope.PERSISTED: (1.0 - pp.sdc_caught_at_step_fraction) * hz.get(Scope.PERSISTED, 0.0)}
        return {k: v for k, v in kept.items() if v > 0}

    def swap_s(self, run: _Run) -> float:
        """Node loss: measured resume scaled to the replica group, plus the spare loading
        its shard from a peer's memory."""
        c, pp = run.costs, run.pp
        return c.swap_s * pp.rank_scale(pp.replica_group_gpus) + c.load_s

    def resume_s(self, run: _Run, job: _Job) -> float:
        return self.swap_s(run)

    def planned_s(self, run: _Run, job: _Job) -> float:
        return self.swap_s(run)

    def failure_loss_s(self, run: _Run, job: _Job) -> float:
        return self.swap_s(run) + max(run.pp.runtime.steps_lost, 0.5) * run.pp.step_time_s

    def drain(self, run: _Run, job: _Job) -> tuple[float, bool]:
        """A node taken out ahead of time is swapped live: nothing rolls back."""
        return self.swap_s(run), False

    def relaunch_s(self, run: _Run, job: _Job, captured: bool) -> float:
        c, r = run.costs, run.pp.runtime
        base = r.relaunch_captured_s if captured and r.relaunch_captured_s > 0 else c.restart_s
        return c.requeue_s + base * run.pp.rank_scale(job.gpus) + c.load_s

    def hard_failure(self, run: _Run, job: _Job, cause: str, scope: Scope,
                     needs_nodes: bool) -> tuple[float, bool, bool]:
        pp, c, rng = run.pp, run.costs, run.rng
        detect = _hang_s(c, cause)
        if scope is Scope.PERSISTED and rng.random() < pp.sdc_caught_at_step_fraction:
            # Caught by the step guard before the optimizer applied it: the step is
            # computed again; charged as a defect that corrupts the recompute too, so the
            # rank is replaced live and its node goes to repair.
            job.redo(cause, 2 * pp.step_time_s)
            return self.swap_s(run), False, True
        if needs_nodes or (scope is Scope.PROCESS and rng.random() >= pp.job_wide_crash_fraction):
            # Live recovery (a node, a domain, or one rank's process lost): only the step
            # in flight is redone: the measured completed steps redone, but at least half a
            # step (the expected work in flight at a random failure time; the benchmark's
            # kills land at step boundaries and cannot see it).
            job.redo(cause, max(pp.runtime.steps_lost, 0.5) * pp.step_time_s)
            return detect + self.swap_s(run), False, needs_nodes
        if scope is Scope.PROCESS:
            # Every rank crashed at once: relaunch; a crash by uncaught exception left the
            # start of the failed step in shared memory (only the step in flight is
            # redone); any other goes back to the newest periodic snapshot.
            captured = rng.random() < pp.crash_capture_fraction
            if captured:
                job.redo(cause, 0.5 * pp.step_time_s)
                job.commit_now()
            else:
                job.rollback_to_checkpoint(cause)
            return detect + self.relaunch_s(run, job, captured), True, needs_nodes
        # Corrupt state found later, in place: every rank kept the newest persisted step in
        # host memory, so nothing is relaunched or read from storage.
        job.rollback_to_checkpoint(cause)
        _back_to_storage(run, job, cause, job.backstop_s)
        in_place = c.swap_s * pp.rank_scale(job.gpus) + c.load_s
        return detect + in_place, True, needs_nodes


# ------------------------------------------------------------------ control plane

@dataclass(frozen=True)
class ControlPlane:
    """seamguard's detection and the live controller's economic rules."""

    detection_delay_s: float
    """Gray-failure and precursor detection delay, when no measured model is given."""
    detection_precision: float
    """Share of alarms that are true, when no measured model is given."""
    detection: DetectionModel | None = None
    """The detector's measured per-class recall and delays (benchmarks/detection.py);
    ``None``: every event found after ``detection_delay_s``."""

    @property
    def precision(self) -> float:
        """Share of alarms that are true: the measured one when a model is given."""
        return self.detection.precision if self.detection is not None else self.detection_precision

    def delay_s(self, kind: str, rng: np.random.Generator) -> float | None:
        """How long after onset an event of ``kind`` (a key of
        :data:`~seamguard.twin.events.detection.TWIN_EVENT_CLASSES`) is detected; ``None``
        when the detector misses it."""
        if self.detection is None:
            return self.detection_delay_s
        return self.detection.sample_delay_s(kind, rng)

    def drains_before_failure(self, run: _Run, job: _Job, n_nodes: int, lead_s: float,
                              delay_s: float | None) -> bool:
        """A precursor that showed ``lead_s`` ahead and was detected ``delay_s`` after it
        showed (``None``: missed): drain and swap now iff the live planner's quarantine
        rule says it pays (the hazard the evidence implies over the lead time against the
        swap and the capacity held out)."""
        if delay_s is None or lead_s <= delay_s + run.policy.recovery.resume_s(run, job):
            return False
        horizon_h = (lead_s - delay_s) / 3600.0
        base = max(run.node_hazard_per_h, 1e-12)
        gpn = run.cfg.gpus_per_node
        ctx = DegradedNodeContext(
            job_class=job.spec.job_class, criticality=job.spec.criticality, job_gpus=job.gpus,
            node_gpus=n_nodes * gpn, slowdown=0.0, hazard_multiplier=1.0 + 1.0 / horizon_h / base,
            node_hazard_per_h=base,
            loss_per_failure_h=run.policy.recovery.failure_loss_s(run, job) / 3600.0,
            horizon_h=horizon_h, swap_cost_s=run.policy.recovery.resume_s(run, job),
            spare_available=run.spares >= n_nodes, hold_h=run.pp.quarantine_hold_h,
            removed_capacity_value=0.0)
        return quarantine_decision(ctx).action == "quarantine"

    def degraded_context(self, run: _Run, job: _Job, node_gpus: int, sev: float,
                         horizon_h: float, mult: float) -> DegradedNodeContext:
        """A degraded node (or loop) under a job, as the live planner prices it."""
        return DegradedNodeContext(
            job_class=job.spec.job_class, criticality=job.spec.criticality,
            job_gpus=job.gpus, node_gpus=node_gpus, slowdown=sev, hazard_multiplier=mult,
            node_hazard_per_h=run.node_hazard_per_h,
            loss_per_failure_h=run.policy.recovery.resume_s(run, job) / 3600.0,
            horizon_h=horizon_h, swap_cost_s=run.policy.recovery.resume_s(run, job),
            spare_available=run.spares >= node_gpus // run.cfg.gpus_per_node,
            hold_h=run.pp.quarantine_hold_h)

    def checkpoint_now(self, run: _Run, job: _Job, plan, precursor_hazard_per_s: float) -> bool:
        """The live controller's checkpoint_now rule: the rollback a checkpoint now avoids
        before the next scheduled one against its stall."""
        if job.uncommitted <= 0:
            return False
        if job.uncommitted >= plan.interval_s:
            return True
        hazard_h = (plan.hazard_per_s + precursor_hazard_per_s) * 3600.0
        return checkpoint_decision(CheckpointContext(
            job_gpus=job.gpus, uncommitted_s=job.uncommitted,
            horizon_s=max(plan.interval_s - job.uncommitted, 0.0), hazard_per_h=hazard_h,
            write_s=plan.stall_s)).action == "checkpoint"


@dataclass(frozen=True)
class StragglerDetection:
    """NVRx-style straggler detection (NVIDIA Resiliency Extension, ``straggler``
    package; docs/twin-events.md): every rank's relative performance score is its
    throughput over the best rank's, reported once per ``report_s``; a rank whose score
    over a report window is below ``threshold`` is flagged, and the job stops, checkpoints
    and restarts in place on a hot spare instead of that node. It sees compute
    slowdowns (a slow GPU's kernels), not a slow link every rank waits on alike."""

    threshold: float
    """Relative performance score below which a rank is a straggler."""
    report_s: float
    """Length of a reporting window."""

    def delay_s(self, slowdown: float, rng: np.random.Generator) -> float | None:
        """When a node slowed by ``slowdown`` (share of its throughput lost) is flagged,
        after onset: at the end of the first window it was slow for in full (the onset
        falls uniformly inside a window); ``None`` if its score stays at or above the
        threshold."""
        if 1.0 - slowdown >= self.threshold:
            return None
        return float(rng.uniform(0.0, self.report_s)) + self.report_s


@dataclass(frozen=True)
class Links:
    """What a link flap costs: failing over to the other rail, or a stall."""

    failover: str
    """``rail_failover`` (the runtime moves traffic to the other rail) or ``stall``."""

    def flap_stall_s(self, fm: FailureModel) -> float:
        if self.failover == "rail_failover":
            return fm.failover_throughput_loss * fm.flap_down_s
        return fm.flap_stall_s


# ------------------------------------------------------------------ policies

@dataclass(frozen=True)
class Policy:
    """One policy: its costs and its parts."""

    name: str
    costs: CostModel
    interval: FixedInterval | YoungDalyInterval | PlannerInterval
    recovery: RequeueRestart | InJobRestart | LiveRecovery
    control_plane: ControlPlane | None
    links: Links
    stragglers: StragglerDetection | None = None
    """Straggler detection outside a control plane (``in_job_restart``'s NVRx detector)."""


def build_policy(pp: PolicyParams) -> Policy:
    """The parts of each named policy (docs/twin-events.md, "Policies")."""
    c = pp.cost_model
    fixed = FixedInterval() if c.interval_s is not None else None
    links = Links(pp.links or "stall")
    if pp.name == "baseline_fixed":
        return Policy(pp.name, c, fixed or YoungDalyInterval(Mode.FULL.value), RequeueRestart(),
                      None, links)
    if pp.name == "baseline_daly_async":
        return Policy(pp.name, c, fixed or YoungDalyInterval("full_async"), RequeueRestart(),
                      None, links)
    if pp.name == "in_job_restart":
        # Bonded links (active-backup) fail over like seamguard's rails.
        return Policy(pp.name, c, fixed or YoungDalyInterval(Mode.PEER_REPLICATED.value),
                      InJobRestart(), None, Links(pp.links or "rail_failover"),
                      StragglerDetection(pp.straggler_threshold, pp.straggler_report_s))
    # In a dry run the controller decides and records but nothing it decides happens: no drain,
    # evacuation or checkpoint-now; the runtime still recovers on its own.
    cp = (ControlPlane(pp.detection_delay_s, pp.detection_precision, pp.detection)
          if pp.controller.mode == "enforce" else None)
    return Policy(pp.name, c, fixed or PlannerInterval(), LiveRecovery(), cp, Links(pp.links or "rail_failover"))
