"""One event-mode run: exogenous streams in, job-level consequences out.

Why this file exists: it is the loop over *events* (thousands, not millions) that turns
failures, fail-slows, flaps, cooling events and maintenance into what each job loses,
under one policy. Between events a job's progress is integrated analytically over its
checkpoint cycle (compute ``tau`` then stall ``delta``), so cost does not depend on how
many checkpoints are taken. Every second of every job's wall-clock is attributed either
to productive work or to exactly one loss cause; ``RunResult`` therefore satisfies
``allocated = productive + sum(lost)`` (tested).

Callers: :mod:`seamguard.twin.events.montecarlo` (many seeds, process pool) and tests.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from seamguard.decide.economics import (
    CRITICALITY_WEIGHT,
    JobClass,
    impact_fraction,
    quarantine_decision,
)
from seamguard.decide.tiers import Scope
from seamguard.twin.events.breaker import TwinBreaker
from seamguard.twin.events.config import ClusterConfig, JobSpec, PolicyParams, workload
from seamguard.twin.events.kernel import EventQueue
from seamguard.twin.events.policies import (
    CKPT,
    all_scope_hazards,
    build_policy,
    tier_costs,
)
from seamguard.twin.events.processes import Streams, generate_streams

__all__ = ["RunResult", "simulate_run", "simulate_streams", "tier_costs", "rollback_scope_hazards"]

# Event kinds and their tie-break priority (lower first at equal time).
(_REPAIR, _EP_END, _FAIL, _PLANNED, _SLOW, _COOL, _COOL_END, _FLAP, _DETECT, _COOL_DETECT,
 _STRAGGLER) = range(11)
_PRIO = {_REPAIR: 0, _EP_END: 1, _COOL_END: 1, _FAIL: 2, _PLANNED: 3, _SLOW: 4, _COOL: 4,
         _FLAP: 5, _DETECT: 6, _COOL_DETECT: 6, _STRAGGLER: 6}

_EPS = 1e-9
RUNTIME = "runtime_overhead"
FALSE_POS = "false_positive_quarantine"


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run (one seed, one policy)."""

    policy: str
    """Policy name."""
    seed_entropy: int
    """Entropy of the run's seed sequence (reproduces it)."""
    gpus: int
    """Cluster GPUs."""
    days: float
    """Horizon."""
    ettr: float
    """Productive GPU-time / GPU-time allocated to jobs (Meta's ETTR, GPU-weighted)."""
    goodput: float
    """Productive GPU-time / all GPU-time of the cluster (spares and idle included)."""
    ettr_largest_job: float
    """ETTR of the largest job."""
    interruptions: int
    """Unexpected hard failures that struck a job."""
    interruptions_by_cause: dict[str, int]
    """The same by cause."""
    planned_interruptions: int
    """Planned maintenance events that struck a job."""
    largest_job_interruptions: int
    """Unexpected interruptions of the largest job."""
    largest_job_nodes: int
    """Nodes of the largest job."""
    gpu_hours_lost_by_cause: dict[str, float]
    """Lost GPU-hours by cause (rollback, recovery, waiting, slowdown, overheads)."""
    productive_gpu_hours: float
    """Productive GPU-hours of all jobs."""
    allocated_gpu_hours: float
    """GPU-hours allocated to jobs."""
    failure_amplification: float
    """GPU-hours lost to failures per GPU-hour of directly impaired hardware."""
    rollback_lost_gpu_hours: float
    """Work thrown away by rollbacks."""
    rollback_exposure_min: float
    """Time-averaged uncommitted work of training jobs (GPU-weighted), minutes."""
    schedule_slip_fraction: float
    """Share of training jobs whose productive time fell short of the planned ETTR."""
    release_critical_slipped: float
    """Share of release-critical jobs that slipped."""
    checkpoint_interval_min: float
    """Time-weighted mean checkpoint interval of the largest training job."""
    checkpoint_mode: str
    """Checkpoint mode of the largest training job."""
    quarantines: int
    """Nodes quarantined (true and false alarms)."""
    false_positive_quarantines: int
    """Quarantines caused by false alarms."""
    precursor_prevented: int
    """Failures whose damage a pre-failure action avoided."""
    waiting_events: int
    """Times a job had to wait for a spare."""
    events: int
    """Events processed."""
    wall_s: float
    """Wall time of the run."""
    held_by_breaker: int = 0
    """Nodes the controller asked to restrict that its breaker held (seamguard policy)."""
    breaker_tripped_at_s: float | None = None
    """When the breaker tripped (``None``: it never did)."""


def rollback_scope_hazards(cfg: ClusterConfig, pp: PolicyParams | None = None) -> dict[Scope, float]:
    """Per-node hazard (1/s) of failures that roll a training job back, by scope: every
    hard failure, or (with ``pp``) those the policy's recovery does not absorb."""
    hz = all_scope_hazards(cfg)
    return hz if pp is None else build_policy(pp).recovery.rolls_back(pp, hz)


class _Job:
    """Mutable state of one job inside one run (never escapes the run)."""

    __slots__ = ("spec", "gpus", "training", "sync", "t_last", "pos", "tau", "delta",
                 "uncommitted", "committed", "base_speed", "block_until", "block_cause",
                 "episodes", "impact", "slow_cause", "lost", "exposure", "interval_int",
                 "interrupts", "rollback", "direct_gpu_s", "need_nodes", "need_cause",
                 "backstop_s", "mode", "mults", "lag", "fresh")

    def __init__(self, spec: JobSpec, gpus_per_node: int) -> None:
        self.spec = spec
        self.gpus = spec.nodes * gpus_per_node
        self.training = spec.training
        self.sync = spec.training
        self.t_last = 0.0
        self.pos = 0.0
        self.tau = math.inf
        self.delta = 0.0
        self.uncommitted = 0.0
        self.committed = 0.0
        self.base_speed = 1.0
        self.block_until = 0.0
        self.block_cause = ""
        self.episodes: dict[int, tuple[float, str]] = {}
        self.impact = 0.0
        self.slow_cause = ""
        self.lost: dict[str, float] = defaultdict(float)
        self.exposure = 0.0
        self.interval_int = 0.0
        self.interrupts: dict[str, int] = defaultdict(int)
        self.rollback = 0.0
        self.direct_gpu_s = 0.0
        self.need_nodes = 0
        self.need_cause = ""
        self.backstop_s = math.inf
        self.mode = "none"
        self.mults: dict[int, float] = {}
        self.lag = 0.0        # asynchronous part of a write: a checkpoint counts after it
        self.fresh = True     # no checkpoint write pending (just (re)started)

    # ---------------------------------------------------------------- progress
    def advance(self, t: float) -> None:
        """Integrate progress and losses from ``t_last`` to ``t``."""
        cur = self.t_last
        if t <= cur:
            return
        if self.training and math.isfinite(self.tau):
            self.interval_int += self.tau * (t - cur)
        if cur < self.block_until:
            end = min(t, self.block_until)
            dt = end - cur
            self.lost[self.block_cause] += dt
            self.exposure += self.uncommitted * dt
            cur = end
        if cur < t:
            self._run(t - cur)
        self.t_last = t

    def _run(self, rem: float) -> None:
        base = self.base_speed
        sev = min(self.impact, 1.0)
        speed = base * (1.0 - sev)
        slow_rate = base * sev
        lost = self.lost
        if not self.training:
            self.committed += speed * rem
            if slow_rate:
                lost[self.slow_cause] += slow_rate * rem
            if base < 1.0:
                lost[RUNTIME] += (1.0 - base) * rem
            return
        tau, delta = self.tau, self.delta
        period = tau + delta
        pos = self.pos
        if pos > period:      # the interval was shortened past this point: write now
            pos = tau
        compute_t = 0.0
        write_t = 0.0
        # finish the current cycle
        if pos < tau:
            dt = min(tau - pos, rem)
            self.exposure += self.uncommitted * dt + speed * dt * dt / 2.0
            self.uncommitted += speed * dt
            compute_t += dt; pos += dt; rem -= dt
        if rem > 0 and pos >= tau:
            dt = min(period - pos, rem)
            self.exposure += self.uncommitted * dt
            write_t += dt; pos += dt; rem -= dt
            if pos >= period - _EPS:
                self.committed += self.uncommitted
                self.uncommitted = 0.0
                pos = 0.0
                self.fresh = False
        if rem > 0:
            k = math.floor(rem / period)
            if k:
                self.fresh = False
                w = speed * tau
                self.committed += k * w
                self.exposure += k * (w * tau / 2.0 + w * delta)
                compute_t += k * tau; write_t += k * delta; rem -= k * period
            if rem > 0:
                dt = min(tau, rem)
                self.exposure += speed * dt * dt / 2.0
                self.uncommitted += speed * dt
                compute_t += dt; rem -= dt
                pos = dt
                if rem > 0:
                    self.exposure += self.uncommitted * rem
                    write_t += rem; pos += rem
        self.pos = pos
        if write_t:
            lost[CKPT] += write_t
        if slow_rate and compute_t:
            lost[self.slow_cause] += slow_rate * compute_t
        if base < 1.0 and compute_t:
            lost[RUNTIME] += (1.0 - base) * compute_t

    # ---------------------------------------------------------------- actions
    def block(self, t: float, until: float, cause: str, reset: bool) -> None:
        """Stop progress until ``until`` (call after ``advance(t)``)."""
        if reset:
            self.pos = 0.0
        if until >= self.block_until or self.block_until <= t:
            self.block_until = until
            self.block_cause = cause

    def rollback_to_checkpoint(self, cause: str) -> float:
        """Throw away uncommitted work; return it. With asynchronous writes, a failure
        before the newest write has drained (``lag`` into the cycle) goes back one
        checkpoint further."""
        lost = self.uncommitted
        if self.lag > 0 and not self.fresh and self.pos < self.lag:
            extra = min(self.committed, self.tau * self.base_speed)
            self.committed -= extra
            lost += extra
        self.lost[cause] += lost
        self.rollback += lost
        self.uncommitted = 0.0
        self.pos = 0.0
        self.fresh = True
        return lost

    def redo(self, cause: str, seconds: float) -> None:
        """Lose the last ``seconds`` of uncommitted work (steps computed again)."""
        lost = min(self.uncommitted, seconds)
        self.uncommitted -= lost
        self.lost[cause] += lost
        self.rollback += lost

    def commit_now(self) -> None:
        """A checkpoint taken now (its stall, written through, is charged by the caller's
        block)."""
        self.committed += self.uncommitted
        self.uncommitted = 0.0
        self.pos = 0.0
        self.fresh = True

    def set_episode(self, eid: int, impact: float, cause: str) -> None:
        self.episodes[eid] = (impact, cause)
        self._refresh()

    def end_episode(self, eid: int) -> bool:
        if self.episodes.pop(eid, None) is None:
            return False
        self._refresh()
        return True

    def _refresh(self) -> None:
        if not self.episodes:
            self.impact, self.slow_cause = 0.0, ""
            return
        if self.sync:
            imp, cause = max(self.episodes.values())
            self.impact, self.slow_cause = imp, cause
        else:
            self.impact = min(1.0, sum(v[0] for v in self.episodes.values()))
            self.slow_cause = max(self.episodes.values())[1]


class _Run:
    """The imperative shell of one run: spare pool, waiting queue, event handlers."""

    def __init__(self, cfg: ClusterConfig, pp: PolicyParams, streams: Streams,
                 rng: np.random.Generator) -> None:
        self.cfg, self.pp, self.s, self.rng = cfg, pp, streams, rng
        self.policy = build_policy(pp)
        self.costs = self.policy.costs
        self.cp = self.policy.control_plane
        self.specs = workload(cfg)
        self.jobs = [_Job(sp, cfg.gpus_per_node) for sp in self.specs]
        owner = np.full(cfg.nodes, -2, dtype=np.int64)       # -2 idle, -1 spare
        for j, sp in enumerate(self.specs):
            owner[sp.first_node: sp.first_node + sp.nodes] = j
        self.spare_first = cfg.nodes - cfg.spare_nodes
        owner[self.spare_first:] = -1
        self.owner = owner
        self.spares = cfg.spare_nodes
        self.q = EventQueue()
        self.waiting: list[int] = []
        self.quarantines = self.false_pos = self.prevented = self.waits = 0
        self.planned_hits = 0
        self.eid = 0
        self.cool_evacuated: dict[int, set[int]] = {}
        fm = cfg.failures
        self.node_hazard_per_h = fm.rf_per_node_day() / 24.0
        self.scope_hz = self.policy.recovery.rolls_back(pp, all_scope_hazards(cfg))
        self.tiers = tier_costs(pp)
        self.breaker = TwinBreaker(pp.controller, cfg.nodes)
        for job in self.jobs:
            self._plan(job, 0.0)

    # ------------------------------------------------------------- planning
    def _plan(self, job: _Job, t: float) -> None:
        """Set the job's checkpoint tier and interval (the policy's interval rule)."""
        if job.training:
            self.policy.interval.plan(self, job, t)

    # ------------------------------------------------------------- loading
    def load(self) -> None:
        s, own = self.s, self.owner
        ev: list[tuple[float, int, int, object]] = []
        for i in np.flatnonzero(own[s.fail_node] != -2).tolist():
            ev.append((float(s.fail_t[i]), _PRIO[_FAIL], _FAIL, i))
        for i in np.flatnonzero(own[s.planned_node] != -2).tolist():
            ev.append((float(s.planned_t[i]), _PRIO[_PLANNED], _PLANNED, i))
        for i in np.flatnonzero(own[s.slow_node] >= 0).tolist():
            ev.append((float(s.slow_t[i]), _PRIO[_SLOW], _SLOW, i))
        for i in np.flatnonzero(own[s.flap_node] >= 0).tolist():
            ev.append((float(s.flap_t[i]), _PRIO[_FLAP], _FLAP, i))
        for i in range(s.cool_t.size):
            ev.append((float(s.cool_t[i]), _PRIO[_COOL], _COOL, i))
        self.q.extend(ev)

    # ------------------------------------------------------------- capacity
    def _take_spares(self, job_idx: int, n: int, t: float, cause: str,
                     recovery_s: float, reset: bool) -> None:
        job = self.jobs[job_idx]
        if self.spares >= n and not self.waiting:
            self.spares -= n
            job.block(t, t + recovery_s, cause, reset)
        else:
            self.waits += 1
            job.block(t, math.inf, cause, reset)
            job.need_nodes += n
            job.need_cause = cause
            if job_idx not in self.waiting:
                self.waiting.append(job_idx)

    def _return_nodes(self, t: float, n: int) -> None:
        self.spares += n
        if not self.waiting:
            return
        w = CRITICALITY_WEIGHT
        self.waiting.sort(key=lambda j: -w[self.jobs[j].spec.criticality])
        still = []
        for j in self.waiting:
            job = self.jobs[j]
            if self.spares >= job.need_nodes:
                self.spares -= job.need_nodes
                job.advance(t)
                job.need_nodes = 0
                job.block_until = t + self.policy.recovery.resume_s(self, job)
            else:
                still.append(j)
        self.waiting = still

    def _schedule_repair(self, t: float, n: int, mean_h: float) -> None:
        for _ in range(n):
            self.q.push(t + float(self.rng.exponential(mean_h * 3600.0)), _PRIO[_REPAIR],
                        _REPAIR, 1)

    # ------------------------------------------------------------- hard failures
    def _hard_failure(self, job_idx: int, t: float, cause: str, scope: Scope, n_nodes: int,
                      lead_s: float) -> None:
        """A hard failure strikes a job; ``lead_s``: how long before it evidence showed
        (0: none)."""
        job = self.jobs[job_idx]
        job.advance(t)
        job.interrupts[cause] += 1
        needs_nodes = scope in (Scope.NODE, Scope.DOMAIN)
        gpn = self.cfg.gpus_per_node
        repair_h = self.cfg.failures.repair_mean_h
        recovery = self.policy.recovery
        if not job.training:
            # An inference replica fails alone; the rest keep serving. Without a spare
            # it waits for its own node's repair (which then does not join the pool).
            rec = recovery.resume_s(self, job)
            if not needs_nodes:
                dur = rec
            elif self.spares >= n_nodes:
                dur = rec
                self.spares -= n_nodes
                self._schedule_repair(t, n_nodes, repair_h)
            else:
                dur = rec + float(self.rng.exponential(repair_h * 3600.0))
            share = impact_fraction(JobClass.LATENCY_INFERENCE, job.gpus, n_nodes * gpn, 1.0)
            self._episode(job, t, dur, share, cause)
            job.direct_gpu_s += n_nodes * gpn * dur
            return
        if needs_nodes:
            self._schedule_repair(t, n_nodes, repair_h)
        if (needs_nodes and lead_s > 0 and self.cp is not None
                and self.cp.drains_before_failure(self, job, n_nodes, lead_s,
                                                  self.cp.delay_s("precursor", self.rng))
                and self.breaker.admit(t, n_nodes, t + repair_h * 3600.0)):
            # Evidence came early enough and the controller's rule drained the node:
            # swapped before it failed.
            self.prevented += 1
            swap, reset = recovery.drain(self, job)
            self._take_spares(job_idx, n_nodes, t, cause, swap, reset)
            job.direct_gpu_s += n_nodes * gpn * swap
            return
        rec, reset, needs_nodes = recovery.hard_failure(self, job, cause, scope, needs_nodes)
        if needs_nodes and scope is Scope.PERSISTED:
            self._schedule_repair(t, n_nodes, repair_h)   # the defective GPU's node
        job.direct_gpu_s += n_nodes * gpn * rec
        if needs_nodes:
            self._take_spares(job_idx, n_nodes, t, cause, rec, reset)
        else:
            job.block(t, t + rec, cause, reset)

    def _episode(self, job: _Job, t: float, dur: float, impact: float, cause: str) -> int:
        job.advance(t)
        self.eid += 1
        job.set_episode(self.eid, impact, cause)
        self.q.push(t + dur, _PRIO[_EP_END], _EP_END, (self.jobs.index(job), self.eid))
        return self.eid

    # ------------------------------------------------------------- handlers
    def on_fail(self, t: float, i: int) -> None:
        s, fm = self.s, self.cfg.failures
        cause = fm.causes[int(s.fail_cause[i])]
        first, n = int(s.fail_node[i]), int(s.fail_nnodes[i])
        owners = self.owner[first: first + n]
        lead_s = float(s.fail_lead_s[i]) if bool(s.fail_has_precursor[i]) else 0.0
        for j, cnt in zip(*np.unique(owners, return_counts=True)):
            j, cnt = int(j), int(cnt)
            if j == -1:
                taken = min(cnt, self.spares)   # spare nodes fail too
                if taken and cause.scope in (Scope.NODE, Scope.DOMAIN):
                    self.spares -= taken
                    self._schedule_repair(t, taken, fm.repair_mean_h)
                continue
            if j < 0:
                continue
            self._hard_failure(j, t, cause.name, cause.scope, cnt, lead_s)

    def on_planned(self, t: float, i: int) -> None:
        j = int(self.owner[int(self.s.planned_node[i])])
        fm = self.cfg.failures
        if j == -1:
            if self.spares:
                self.spares -= 1
                self._schedule_repair(t, 1, fm.maintenance_mean_h)
            return
        job = self.jobs[j]
        job.advance(t)
        self.planned_hits += 1
        cause = "planned_maintenance"
        if not job.training:
            dur = self.policy.recovery.resume_s(self, job)
            share = impact_fraction(JobClass.LATENCY_INFERENCE, job.gpus,
                                    self.cfg.gpus_per_node, 1.0)
            if self.spares:
                self.spares -= 1
                self._schedule_repair(t, 1, fm.maintenance_mean_h)
            else:   # the replica waits for its own node to come back
                dur += float(self.rng.exponential(fm.maintenance_mean_h * 3600.0))
            self._episode(job, t, dur, share, cause)
            return
        self._schedule_repair(t, 1, fm.maintenance_mean_h)
        # Drained ahead of time: the policy's way of taking a node out (a checkpoint
        # right before and a restart, or seamguard's live swap).
        self._take_spares(j, 1, t, cause, *self.policy.recovery.drain(self, job))

    def on_slow(self, t: float, i: int) -> None:
        s = self.s
        node = int(s.slow_node[i])
        j = int(self.owner[node])
        job = self.jobs[j]
        comm = bool(s.slow_comm[i])
        cause = "fail_slow_comm" if comm else "fail_slow_compute"
        sev, dur = float(s.slow_sev[i]), float(s.slow_dur_s[i])
        imp = impact_fraction(job.spec.job_class, job.gpus, self.cfg.gpus_per_node, sev)
        eid = self._episode(job, t, dur, imp, cause)
        job.direct_gpu_s += self.cfg.gpus_per_node * dur
        if self.cp is not None:
            delay = self.cp.delay_s(cause, self.rng)
            if delay is not None and dur > delay:
                self.q.push(t + delay, _PRIO[_DETECT], _DETECT, (j, eid, comm, sev, node))
        elif self.policy.stragglers is not None and not comm and job.training:
            delay = self.policy.stragglers.delay_s(sev, self.rng)
            if delay is not None and dur > delay:
                self.q.push(t + delay, _PRIO[_STRAGGLER], _STRAGGLER, (j, eid))

    def on_straggler(self, t: float, data: tuple) -> None:
        """The straggler detector flagged a rank still slow: with a hot spare, the job
        checkpoints and restarts in place without that node (the recovery's planned
        restart); without one it runs on slowly."""
        j, eid = data
        job = self.jobs[j]
        if eid not in job.episodes or self.spares < 1:
            return
        job.advance(t)
        cause = job.episodes[eid][1]
        job.end_episode(eid)
        self._quarantine(j, t, cause, 1)

    def on_detect(self, t: float, data: tuple) -> None:
        j, eid, comm, sev, node = data
        job = self.jobs[j]
        if eid not in job.episodes:
            return
        fm, gpn = self.cfg.failures, self.cfg.gpus_per_node
        if comm:
            # Fail over to the other rail at once: the residual is one failed-over link.
            # Whether the node is then worth swapping out is the economic model's call.
            job.advance(t)
            sev = min(sev, fm.failover_throughput_loss)
            imp = impact_fraction(job.spec.job_class, job.gpus, gpn, sev)
            job.episodes[eid] = (imp, job.episodes[eid][1])
            job._refresh()
            mean_min = fm.fail_slow_comm_mean_min
        else:
            mean_min = fm.fail_slow_compute_mean_min
        self._decide_degraded(t, j, eid, sev, mean_min / 60.0)   # memoryless remainder

    def _decide_degraded(self, t: float, j: int, eid: int, sev: float,
                         horizon_h: float) -> None:
        """Keep or swap a node detected as degraded (true alarm plus its false ones)."""
        job = self.jobs[j]
        gpn = self.cfg.gpus_per_node
        cause = job.episodes[eid][1]
        ctx = self._ctx(job, gpn, sev, horizon_h, 1.0)
        dec = quarantine_decision(ctx)
        above_floor = sev >= self.pp.controller.drain_min_slowdown
        if above_floor and dec.action == "quarantine" and self._admit(t, 1):
            job.advance(t)
            job.end_episode(eid)
            self._quarantine(j, t, cause, 1)
        # False alarms look the same and get the same decision.
        n_fp = int(self.rng.poisson((1.0 - self.cp.precision) / self.cp.precision))
        for _ in range(n_fp):
            if above_floor and quarantine_decision(self._ctx(job, gpn, sev, horizon_h, 1.0)).action \
                    == "quarantine" and self._admit(t, 1):
                job.advance(t)
                self.false_pos += 1
                self._quarantine(j, t, FALSE_POS, 1)

    def _admit(self, t: float, n: int) -> bool:
        """The breaker's word on quarantining ``n`` nodes for the hold (a hold is counted)."""
        return self.breaker.admit(t, n, t + self.pp.quarantine_hold_h * 3600.0)

    def _ctx(self, job: _Job, node_gpus: int, sev: float, horizon_h: float,
             mult: float):
        return self.cp.degraded_context(self, job, node_gpus, sev, horizon_h, mult)

    def _quarantine(self, j: int, t: float, cause: str, n: int) -> None:
        job = self.jobs[j]
        self.quarantines += n
        self.spares -= n
        stall_gpus = job.gpus if job.training else n * self.cfg.gpus_per_node
        swap = self.policy.recovery.planned_s(self, job)
        if job.training:
            job.block(t, max(job.block_until, t) + swap, cause, False)
        else:
            job.advance(t)
            moved = min(stall_gpus / job.gpus * swap, job.committed)
            job.committed -= moved
            job.lost[cause] += moved
        for _ in range(n):
            self.q.push(t + self.pp.quarantine_hold_h * 3600.0, _PRIO[_REPAIR], _REPAIR, 1)

    def on_flap(self, t: float, i: int) -> None:
        j = int(self.owner[int(self.s.flap_node[i])])
        job = self.jobs[j]
        fm = self.cfg.failures
        stall = self.policy.links.flap_stall_s(fm)
        job.advance(t)
        job.direct_gpu_s += fm.flap_down_s
        if job.training:
            if job.block_until <= t:     # a flap during a restart costs nothing extra
                job.block(t, t + stall, "link_flap", False)
        else:
            share = self.cfg.gpus_per_node / job.gpus
            # The replica's share stalls; integrate it as an instantaneous loss moved
            # out of the replica's productive time.
            moved = min(share * stall, job.committed)
            job.committed -= moved
            job.lost["link_flap"] += moved

    def on_cool(self, t: float, i: int) -> None:
        s, fm, cfg = self.s, self.cfg.failures, self.cfg
        loop = int(s.cool_loop[i])
        a = loop * cfg.nodes_per_loop
        owners = self.owner[a: a + cfg.nodes_per_loop]
        dur = float(s.cool_dur_s[i])
        affected = {}
        for j, cnt in zip(*np.unique(owners[owners >= 0], return_counts=True)):
            job = self.jobs[int(j)]
            imp = impact_fraction(job.spec.job_class, job.gpus, int(cnt) * cfg.gpus_per_node,
                                  fm.cooling_throttle)
            affected[int(j)] = (self._episode(job, t, dur, imp, "cooling_loop_throttle"),
                                int(cnt))
            job.direct_gpu_s += int(cnt) * cfg.gpus_per_node * dur
        self.cool_evacuated[i] = set()
        if bool(s.cool_trip[i]):
            self.q.push(t + dur, _PRIO[_COOL_END], _COOL_END, (i, affected))
        delay = self.cp.delay_s("cooling", self.rng) if self.cp is not None and affected else None
        if delay is not None and dur > delay:
            self.q.push(t + delay, _PRIO[_COOL_DETECT], _COOL_DETECT, (i, affected, t + dur))

    def on_cool_detect(self, t: float, data: tuple) -> None:
        i, affected, end_t = data
        fm, gpn = self.cfg.failures, self.cfg.gpus_per_node
        horizon_h = max(end_t - t, 0.0) / 3600.0
        for j, (eid, cnt) in affected.items():
            job = self.jobs[j]
            if eid not in job.episodes:
                continue
            trip_per_h = fm.cooling_trip_probability / max(fm.cooling_event_mean_h, 1e-9)
            mult = 1.0 + trip_per_h / max(self.node_hazard_per_h, 1e-12)
            ctx = self._ctx(job, cnt * gpn, fm.cooling_throttle, horizon_h, mult)
            if (fm.cooling_throttle >= self.pp.controller.drain_min_slowdown
                    and quarantine_decision(ctx).action == "quarantine" and self._admit(t, cnt)):
                job.advance(t)
                job.end_episode(eid)
                self.cool_evacuated[i].add(j)
                self.quarantines += cnt
                self.spares -= cnt
                if job.training:
                    job.block(t, max(job.block_until, t) + self.policy.recovery.planned_s(self, job),
                              "cooling_loop_throttle", False)
                self.q.push(end_t + self.pp.quarantine_hold_h * 3600.0, _PRIO[_REPAIR],
                            _REPAIR, cnt)
            elif job.training:
                # Keep it, but the footprint's hazard is up: re-plan, maybe checkpoint now.
                for k in range(cnt):
                    job.mults[k] = mult
                job.advance(t)
                precursor = fm.cooling_trip_probability / max(end_t - t, 1.0)
                plan = self.policy.interval.replan(self, job, precursor)
                if plan is not None and job.block_until <= t and \
                        self.cp.checkpoint_now(self, job, plan, precursor):
                    job.commit_now()
                    job.block(t, t + plan.stall_s, CKPT, True)

    def on_cool_end(self, t: float, data: tuple) -> None:
        i, affected = data
        # The degradation ended in a thermal trip: every node of the loop is lost.
        for j, (eid, cnt) in affected.items():
            if j in self.cool_evacuated.get(i, ()):
                continue
            self._hard_failure(j, t, "cooling_loop_trip", Scope.DOMAIN, cnt, False)

    def on_ep_end(self, t: float, data: tuple) -> None:
        j, eid = data
        job = self.jobs[j]
        job.advance(t)
        if job.end_episode(eid) and job.mults and not job.episodes:
            job.mults.clear()
            if job.training:
                self.policy.interval.replan(self, job)

    # ------------------------------------------------------------- loop
    def run(self) -> int:
        self.load()
        horizon = self.cfg.horizon_s
        q = self.q
        n = 0
        handlers = {_FAIL: self.on_fail, _PLANNED: self.on_planned, _SLOW: self.on_slow,
                    _FLAP: self.on_flap, _COOL: self.on_cool, _DETECT: self.on_detect,
                    _COOL_DETECT: self.on_cool_detect, _COOL_END: self.on_cool_end,
                    _EP_END: self.on_ep_end, _STRAGGLER: self.on_straggler}
        while q:
            t, _, _, kind, data = q.pop()
            if t >= horizon:
                break
            n += 1
            if kind == _REPAIR:
                self._return_nodes(t, int(data))
            else:
                handlers[kind](t, data)
        for job in self.jobs:
            job.advance(horizon)
        return n


def simulate_run(cfg: ClusterConfig, pp: PolicyParams,
                 seed: np.random.SeedSequence | int) -> RunResult:
    """Simulate one run. The same seed gives the same streams for every policy."""
    t0 = time.perf_counter()
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    # Derive children without ss.spawn(): spawn() mutates ss, and the same seed object is
    # reused for every policy (common random numbers) and must give the same streams.
    s_streams, s_policy = (np.random.SeedSequence(ss.entropy, spawn_key=ss.spawn_key + (k,),
                                                  pool_size=ss.pool_size) for k in (0, 1))
    streams = generate_streams(cfg, np.random.default_rng(s_streams))
    run = _Run(cfg, pp, streams, np.random.default_rng(s_policy))
    n_events = run.run()
    return _summarise(run, n_events, ss, time.perf_counter() - t0)


def simulate_streams(cfg: ClusterConfig, pp: PolicyParams, streams: Streams,
                     seed: int = 0) -> RunResult:
    """Simulate given streams (fault injection: build them with ``inject_failure``)."""
    t0 = time.perf_counter()
    ss = np.random.SeedSequence(seed)
    run = _Run(cfg, pp, streams, np.random.default_rng(ss))
    n_events = run.run()
    return _summarise(run, n_events, ss, time.perf_counter() - t0)


def _summarise(run: _Run, n_events: int, ss: np.random.SeedSequence,
               wall_s: float) -> RunResult:
    cfg = run.cfg
    horizon = cfg.horizon_s
    lost: dict[str, float] = defaultdict(float)
    productive = allocated = 0.0
    interrupts: dict[str, int] = defaultdict(int)
    direct = 0.0
    rollback = 0.0
    exposure = 0.0
    train_gpus = 0
    slipped = crit_slipped = crit_n = train_n = 0
    for job in run.jobs:
        for k, v in job.lost.items():
            lost[k] += v * job.gpus
        prod = job.committed + job.uncommitted
        productive += prod * job.gpus
        allocated += horizon * job.gpus
        for k, v in job.interrupts.items():
            interrupts[k] += v
        direct += job.direct_gpu_s
        rollback += job.rollback * job.gpus
        if job.training:
            exposure += job.exposure / horizon * job.gpus
            train_gpus += job.gpus
            train_n += 1
            slip = prod < cfg.planned_ettr * horizon
            slipped += slip
            if job.spec.criticality.value == "release_critical":
                crit_n += 1
                crit_slipped += slip
    largest = max(run.jobs, key=lambda jb: jb.gpus)
    largest_train = max((jb for jb in run.jobs if jb.training), key=lambda jb: jb.gpus,
                        default=None)
    failure_lost = sum(v for k, v in lost.items() if k not in (CKPT, RUNTIME))
    ivl = (largest_train.interval_int / horizon / 60.0
           if largest_train is not None and largest_train.interval_int else float("nan"))
    return RunResult(
        policy=run.pp.name, seed_entropy=int(ss.entropy) if isinstance(ss.entropy, int) else 0,
        gpus=cfg.gpus, days=cfg.days,
        ettr=productive / allocated if allocated else float("nan"),
        goodput=productive / (cfg.gpus * horizon),
        ettr_largest_job=(largest.committed + largest.uncommitted) / horizon,
        interruptions=int(sum(interrupts.values())),
        interruptions_by_cause=dict(sorted(interrupts.items())),
        planned_interruptions=run.planned_hits,
        largest_job_interruptions=int(sum(largest.interrupts.values())),
        largest_job_nodes=largest.spec.nodes,
        gpu_hours_lost_by_cause={k: v / 3600.0 for k, v in sorted(lost.items()) if v > 0},
        productive_gpu_hours=productive / 3600.0, allocated_gpu_hours=allocated / 3600.0,
        failure_amplification=failure_lost / direct if direct else 0.0,
        rollback_lost_gpu_hours=rollback / 3600.0,
        rollback_exposure_min=exposure / train_gpus / 60.0 if train_gpus else 0.0,
        schedule_slip_fraction=slipped / train_n if train_n else 0.0,
        release_critical_slipped=crit_slipped / crit_n if crit_n else 0.0,
        checkpoint_interval_min=ivl,
        checkpoint_mode=largest_train.mode if largest_train is not None else "none",
        quarantines=run.quarantines, false_positive_quarantines=run.false_pos,
        precursor_prevented=run.prevented, waiting_events=run.waits, events=n_events,
        wall_s=wall_s, held_by_breaker=run.breaker.held_nodes, breaker_tripped_at_s=run.breaker.tripped_at)
