"""Economic model: is an action worth what it costs, for *this* job?

The control plane's objective (docs/architecture.md, README) is to preserve useful throughput and minimise
failure amplification, weighted by job criticality. This module turns that into pure
arithmetic in GPU-hours so that the decision is explainable: the same degraded node may
stay under a low-priority batch job and must go under a release-critical run, and a
quarantine is only taken when it buys more than the capacity it removes.

Used by ``seamguard.twin.events`` (the seamguard policy) and by the control plane's
decide stage. Pure: numbers in, frozen dataclasses out; no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from seamguard.fleet.model import JOB_CLASS_BY_LABEL, JobClass

__all__ = [
    "JobClass",
    "Criticality",
    "CRITICALITY_WEIGHT",
    "DegradedNodeContext",
    "EconomicDecision",
    "impact_fraction",
    "useful_throughput",
    "failure_adjusted_throughput",
    "rollback_exposure_gpu_h",
    "schedule_slip_probability",
    "quarantine_decision",
    "CheckpointContext",
    "checkpoint_decision",
]


def _as_job_class(job_class: JobClass | str) -> JobClass:
    return job_class if isinstance(job_class, JobClass) else JOB_CLASS_BY_LABEL[str(job_class)]


class Criticality(str, Enum):
    """How much a GPU-hour of this job is worth relative to a plain one."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    RELEASE_CRITICAL = "release_critical"


#: Value of one of the job's GPU-hours relative to one GPU-hour of spare capacity.
#: A policy choice, not a measurement; overridable per call.
CRITICALITY_WEIGHT: dict[Criticality, float] = {
    Criticality.LOW: 0.25,
    Criticality.NORMAL: 1.0,
    Criticality.HIGH: 2.0,
    Criticality.RELEASE_CRITICAL: 8.0,
}


def impact_fraction(job_class: JobClass, job_gpus: int, node_gpus: int,
                    slowdown: float) -> float:
    """Share of the job's throughput lost while one node is slowed by ``slowdown``.

    Synchronous and pipeline training run at the pace of their slowest member (MegaScale:
    one straggler slows the step), so the whole job loses ``slowdown``. Async batch
    inference loses only the node's share of that. Latency-critical inference loses the
    node's whole share: a slow replica misses its latency objective, its answers are late.
    """
    if job_gpus <= 0 or node_gpus <= 0:
        raise ValueError("job_gpus and node_gpus must be > 0")
    s = min(max(slowdown, 0.0), 1.0)
    share = min(node_gpus / job_gpus, 1.0)
    jc = _as_job_class(job_class)
    if jc in (JobClass.HIGH_SYNC_TRAINING, JobClass.PIPELINE_TRAINING):
        return s
    if jc is JobClass.ASYNC_BATCH_INFERENCE:
        return share * s
    return share if s > 0 else 0.0


def useful_throughput(job_gpus: int, speed_fraction: float) -> float:
    """Useful GPU-hours per hour: GPUs times the fraction of nominal speed achieved."""
    return job_gpus * min(max(speed_fraction, 0.0), 1.0)


def failure_adjusted_throughput(job_gpus: int, speed_fraction: float, hazard_per_h: float,
                                loss_per_failure_h: float) -> float:
    """Useful throughput minus expected failure losses, GPU-hours per hour.

    ``loss_per_failure_h`` is the wall-clock a failure costs the job (rollback + restart).
    """
    lost = min(max(hazard_per_h * loss_per_failure_h, 0.0), 1.0)
    return useful_throughput(job_gpus, speed_fraction) * (1.0 - lost)


def rollback_exposure_gpu_h(job_gpus: int, uncommitted_s: float) -> float:
    """GPU-hours of work that a failure right now would throw away."""
    return job_gpus * max(uncommitted_s, 0.0) / 3600.0


def schedule_slip_probability(remaining_work_h: float, time_to_deadline_h: float,
                              expected_ettr: float, ettr_sd: float) -> float:
    """P(the job misses its deadline) under a normal model of its future ETTR.

    The job needs ``remaining_work_h / time_to_deadline_h`` of ETTR; the slip probability
    is the normal tail below that requirement.
    """
    if time_to_deadline_h <= 0:
        return 1.0 if remaining_work_h > 0 else 0.0
    need = remaining_work_h / time_to_deadline_h
    if ettr_sd <= 0:
        return 1.0 if expected_ettr < need else 0.0
    z = (need - expected_ettr) / ettr_sd
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@dataclass(frozen=True)
class DegradedNodeContext:
    """A degraded node under a job, and what the alternatives would cost."""

    job_class: JobClass
    """Class of the job running on the node."""
    criticality: Criticality | float
    """Criticality of that job: a class, or directly its weight (a topology's number)."""
    job_gpus: int
    """GPUs in the job."""
    node_gpus: int
    """GPUs on the degraded node (or nodes, for a facilities domain)."""
    slowdown: float
    """Throughput the degraded node has lost (0..1)."""
    hazard_multiplier: float
    """How much likelier than a healthy node it is to fail hard (>= 1)."""
    node_hazard_per_h: float
    """Hard-failure hazard of a healthy node, per hour."""
    loss_per_failure_h: float
    """Wall-clock the job loses when a node fails hard (rollback + recovery)."""
    horizon_h: float
    """Expected remaining duration of the degradation (what a swap would avoid)."""
    swap_cost_s: float
    """Stall of the job while the node is swapped for a spare."""
    spare_available: bool
    """Whether a spare node is free."""
    hold_h: float
    """How long the quarantined node stays out of service (investigation, repair)."""
    removed_capacity_value: float = 1.0
    """Value of one removed GPU-hour relative to a plain one (0 if idle spares abound)."""
    slip_saved_gpu_h: float = 0.0
    """Schedule-slip term (decide/slip.py): expected seconds past the job's deadline the action
    saves x the job's GPUs x the policy's ``slip_weight`` / 3600, in GPU-hours; criticality-weighted
    with the rest of the benefit. 0 for a job without a deadline."""


@dataclass(frozen=True)
class EconomicDecision:
    """Outcome of an economic comparison, with its arithmetic as data."""

    action: str
    """``quarantine`` or ``keep``."""
    benefit_gpu_h: float
    """Criticality-weighted GPU-hours the action saves."""
    cost_gpu_h: float
    """GPU-hours the action costs (swap stall, weighted, plus removed capacity)."""
    reasons: tuple[str, ...]
    """Why."""


def quarantine_decision(ctx: DegradedNodeContext,
                        weights: dict[Criticality, float] | None = None) -> EconomicDecision:
    """Quarantine-and-swap iff the weighted throughput it saves beats what it removes.

    Benefit: over the degradation's horizon, the job's throughput lost to the slow node
    plus the expected extra hard failures it would cause, times the criticality weight.
    Cost: the job's swap stall (same weight) plus the node's capacity taken out of the
    pool for ``hold_h`` (unweighted: it is plain capacity). Without a spare the job would
    have to stop for the swap until capacity returns, so the node stays.
    """
    if isinstance(ctx.criticality, int | float):
        w = float(ctx.criticality)
    else:
        w = (weights or CRITICALITY_WEIGHT)[Criticality(ctx.criticality)]
    impact = impact_fraction(ctx.job_class, ctx.job_gpus, ctx.node_gpus, ctx.slowdown)
    extra_hazard_per_h = max(ctx.hazard_multiplier - 1.0, 0.0) * ctx.node_hazard_per_h
    jc = _as_job_class(ctx.job_class)
    if jc in (JobClass.HIGH_SYNC_TRAINING, JobClass.PIPELINE_TRAINING):
        failure_gpus = ctx.job_gpus            # a node failure stops the whole job
        stall_gpus = ctx.job_gpus
    else:
        failure_gpus = ctx.node_gpus           # inference replicas fail alone
        stall_gpus = ctx.node_gpus
    slow_gpu_h = ctx.job_gpus * impact * ctx.horizon_h
    failure_gpu_h = (extra_hazard_per_h * ctx.horizon_h) * ctx.loss_per_failure_h * failure_gpus
    benefit = w * (slow_gpu_h + failure_gpu_h + ctx.slip_saved_gpu_h)
    swap_gpu_h = stall_gpus * ctx.swap_cost_s / 3600.0
    capacity_gpu_h = ctx.node_gpus * ctx.hold_h * ctx.removed_capacity_value
    cost = w * swap_gpu_h + capacity_gpu_h
    reasons = [f"benefit {benefit:.2f} GPU-h = weight {w:g} x (slowdown {slow_gpu_h:.2f} "
               f"+ extra failures {failure_gpu_h:.2f}"
               + (f" + deadline slip saved {ctx.slip_saved_gpu_h:.2f}" if ctx.slip_saved_gpu_h else "") + ")",
               f"cost {cost:.2f} GPU-h = weighted swap stall {w * swap_gpu_h:.2f} "
               f"+ removed capacity {capacity_gpu_h:.2f}"]
    if not ctx.spare_available:
        return EconomicDecision("keep", benefit, cost,
                                tuple(reasons + ["no spare available: keep"]))
    if benefit > cost:
        return EconomicDecision("quarantine", benefit, cost,
                                tuple(reasons + ["benefit exceeds cost: quarantine and swap"]))
    return EconomicDecision("keep", benefit, cost,
                            tuple(reasons + ["quarantine would remove more than it buys: keep"]))


@dataclass(frozen=True)
class CheckpointContext:
    """A training job exposed to risky nodes: what a checkpoint written now would buy."""

    job_gpus: int
    """GPUs in the job (a synchronous job rolls back as a whole, and stalls as a whole to write)."""
    uncommitted_s: float
    """Work since the job's last checkpoint, seconds: what a failure now would throw away."""
    horizon_s: float
    """Until the job's next scheduled checkpoint: after it the work is committed anyway."""
    hazard_per_h: float
    """Hard-failure hazard of the job's footprint implied by its nodes' state and evidence."""
    write_s: float
    """Stall of one checkpoint write (every GPU of the job waits)."""


def checkpoint_decision(ctx: CheckpointContext) -> EconomicDecision:
    """Checkpoint now iff the rollback exposure it avoids beats the write it costs.

    Benefit: ``P(failure within the horizon) x uncommitted work x job GPUs`` with
    ``P = 1 - exp(-hazard x horizon)``; cost: ``write stall x job GPUs``. Both in GPU-hours
    of the same job, so its criticality weighs both sides alike and drops out.
    """
    if ctx.job_gpus <= 0:
        raise ValueError("job_gpus must be > 0")
    horizon_h = max(ctx.horizon_s, 0.0) / 3600.0
    p_fail = -math.expm1(-max(ctx.hazard_per_h, 0.0) * horizon_h)
    benefit = p_fail * rollback_exposure_gpu_h(ctx.job_gpus, ctx.uncommitted_s)
    cost = ctx.job_gpus * max(ctx.write_s, 0.0) / 3600.0
    reasons = [f"benefit {benefit:.3f} GPU-h = P(failure within {horizon_h * 60:.0f} min) {p_fail:.3f} "
               f"x {ctx.uncommitted_s / 60:.1f} min uncommitted x {ctx.job_gpus} GPUs",
               f"cost {cost:.3f} GPU-h = {ctx.write_s:g} s write x {ctx.job_gpus} GPUs"]
    if benefit > cost:
        return EconomicDecision("checkpoint", benefit, cost, tuple(reasons + ["rollback avoided exceeds the write: "
                                                                             "checkpoint now"]))
    return EconomicDecision("keep", benefit, cost, tuple(reasons + ["the write costs more than the rollback it "
                                                                    "avoids: no checkpoint"]))
