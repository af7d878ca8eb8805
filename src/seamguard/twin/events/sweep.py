"""Sweeps of the event twin over cluster sizes (and planner hazards) for the report.

Why this file exists: ``seamguard twin report`` and the benchmark need ETTR against
cluster size for both policies, and the planner's interval against hazard; both are
plain loops over :func:`run_monte_carlo` / :func:`plan_checkpoint` kept here so the
report module only draws.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from seamguard.decide.tiers import PlannerInput, Scope, plan_checkpoint
from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.montecarlo import Summary, run_monte_carlo
from seamguard.twin.events.simulator import rollback_scope_hazards, tier_costs

__all__ = ["DEFAULT_SIZES", "size_sweep", "interval_vs_hazard"]

DEFAULT_SIZES = (1_024, 4_096, 16_384, 32_768, 65_536, 131_072)


def size_sweep(base: ClusterConfig, policies: Sequence[PolicyParams],
               sizes: Sequence[int] = DEFAULT_SIZES, runs: int = 3, seed: int = 0,
               executor: str = "local", workers: int | None = None
               ) -> dict[int, list[Summary]]:
    """Monte-Carlo summaries of every policy at every cluster size."""
    return {n: run_monte_carlo(replace(base, gpus=int(n)), policies, runs, seed,
                               executor, workers) for n in sizes}


def interval_vs_hazard(cfg: ClusterConfig, pp: PolicyParams, job_nodes: int,
                       multipliers: Sequence[float] = tuple(np.geomspace(1, 100, 25))
                       ) -> list[tuple[float, float, str]]:
    """(hazard per hour, chosen interval in minutes, mode) as the footprint degrades.

    The footprint's multiplier is applied uniformly.
    """
    hz = rollback_scope_hazards(cfg, pp) or {Scope.PROCESS: 1e-9}
    total = sum(hz.values())
    out = []
    for m in multipliers:
        plan = plan_checkpoint(PlannerInput(
            entity_hazard_per_s=total, hazard_multipliers=np.full(job_nodes, float(m)),
            costs=tier_costs(pp), scope_fractions=hz))
        # the interval the job runs on: the storage backstop when memory covers nothing
        ivl = plan.interval_s if math.isfinite(plan.interval_s) else plan.backstop_interval_s
        out.append((plan.hazard_per_s * 3600.0, ivl / 60.0, plan.mode.value))
    return out
