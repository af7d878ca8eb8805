"""Checkpoint planner: when to checkpoint, to which tier, and whether to do it *now*.

One pure planner in the decide layer, so the event-mode twin's seamguard policy
(``seamguard.twin.events.policies``) runs the project's planner, not a copy of it: arrays
and numbers in, a frozen :class:`CheckpointPlan` out. No clock, no I/O, no imports from
twin/runtime/act. Its early-checkpoint decision is priced like the controller's
``checkpoint_now`` (``seamguard.decide.economics``).

The model
---------
* Interval: Daly's higher-order formula (Daly, FGCS 2006; docs/sources.md §4; defined
  with Young's and the failure ``Scope`` in seamguard/reliability.py, which the runtime shares)
  ``tau = sqrt(2 d M) * [1 + 1/3 sqrt(d / 2M) + 1/9 (d / 2M)] - d`` for ``d < 2M``, else
  ``M``; ``d`` is the measured checkpoint stall of the chosen tier and ``M`` the MTTF of
  the failures that tier has to protect against.
* Hazard: a job's hazard is the sum of its footprint's per-entity hazards. The control
  plane's assessment enters as per-entity hazard multipliers (1 = healthy) or, via
  :func:`hazard_multipliers_from_gfs`, as gray-failure scores in [0, 1].
* Mode: each tier protects against failures of some *scopes* (a process crash, the loss
  of a node, of a facilities domain, or state corruption that only a persisted copy
  survives). For every candidate mode the planner computes the first-order expected
  waste fraction (stall/tau + hazard*(tau/2 + restore)) with its own Daly interval and
  picks the cheapest. Failures a mode does not protect against cost the job's whole
  unprotected progress.
* Storage safety: a storage path whose assessed state is ``checkpoint_unsafe`` (or worse)
  is never chosen; with none left, only memory tiers remain and the plan says why.
* Early checkpoint: pre-failure evidence adds a short-term hazard; the plan asks for a
  checkpoint now when the expected rollback it avoids exceeds the stall it costs, or when
  the raised hazard makes the work since the last checkpoint overdue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Sequence

import numpy as np

from seamguard.reliability import Scope, daly_interval_s, young_interval_s

__all__ = [
    "Scope",
    "Mode",
    "TierCosts",
    "StoragePath",
    "PlannerInput",
    "CheckpointPlan",
    "young_interval_s",
    "daly_interval_s",
    "hazard_multipliers_from_gfs",
    "footprint_hazard_per_s",
    "expected_waste_fraction",
    "should_checkpoint_now",
    "plan_checkpoint",
    "UNSAFE_STORAGE_STATES",
]


class Mode(str, Enum):
    """Checkpoint modes the planner chooses among."""

    IN_MEMORY = "in_memory"            # copy into host RAM of the same node
    PEER_REPLICATED = "peer_replicated"  # host RAM copy replicated to a peer in another domain
    INCREMENTAL = "incremental"        # only changed state, to storage
    FULL = "full"                      # whole state, to storage
    TIERED = "tiered"                  # peer_replicated often + storage backstop seldom


#: Which scopes each single tier protects (peers are placed in another facilities domain).
_PROTECTS: dict[Mode, frozenset[Scope]] = {
    Mode.IN_MEMORY: frozenset({Scope.PROCESS}),
    Mode.PEER_REPLICATED: frozenset({Scope.PROCESS, Scope.NODE, Scope.DOMAIN}),
    Mode.INCREMENTAL: frozenset(Scope),
    Mode.FULL: frozenset(Scope),
}

#: Storage path states (from the assessment state machine) that forbid writing there.
UNSAFE_STORAGE_STATES = frozenset({"checkpoint_unsafe", "quarantine", "harmful", "failed"})


@dataclass(frozen=True)
class TierCosts:
    """Measured (or measured-and-scaled) stall and restore costs of each tier."""

    full_write_s: float
    """Caller-visible stall of a full checkpoint to storage (Meta RSC w_cp ~ 5 min)."""
    full_restore_s: float
    """Time to load a full checkpoint back from storage."""
    in_memory_stall_s: float
    """Stall of a snapshot into preallocated host buffers."""
    in_memory_restore_s: float
    """Time to restore from a host-RAM snapshot."""
    peer_extra_stall_s: float = 0.0
    """Additional stall to replicate the snapshot to a peer (mostly overlapped)."""
    incremental_fraction: float = 0.25
    """Share of the full write an incremental checkpoint costs (changed state only)."""
    incremental_restore_penalty: float = 1.5
    """Restore of an incremental chain relative to a full restore (base + deltas)."""
    backstop_async: bool = False
    """TIERED: the storage backstop is drained in the background from a host-memory
    snapshot, so it stalls training only for that snapshot; its write time bounds how
    often it can be taken, and a failure during the write loses the previous one too."""

    def __post_init__(self) -> None:
        for name in ("full_write_s", "full_restore_s", "in_memory_stall_s",
                     "in_memory_restore_s", "peer_extra_stall_s"):
            if not (getattr(self, name) >= 0.0):
                raise ValueError(f"TierCosts.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 < self.incremental_fraction <= 1.0:
            raise ValueError("TierCosts.incremental_fraction must be in (0, 1]")

    def stall_s(self, mode: Mode) -> float:
        """Stall of one checkpoint in ``mode`` (the frequent tier for TIERED)."""
        if mode is Mode.IN_MEMORY:
            return self.in_memory_stall_s
        if mode in (Mode.PEER_REPLICATED, Mode.TIERED):
            return self.in_memory_stall_s + self.peer_extra_stall_s
        if mode is Mode.INCREMENTAL:
            return self.full_write_s * self.incremental_fraction
        return self.full_write_s

    def restore_s(self, mode: Mode) -> float:
        """Restore time after a failure that this tier covers."""
        if mode in (Mode.IN_MEMORY, Mode.PEER_REPLICATED, Mode.TIERED):
            return self.in_memory_restore_s
        if mode is Mode.INCREMENTAL:
            return self.full_restore_s * self.incremental_restore_penalty
        return self.full_restore_s


@dataclass(frozen=True)
class StoragePath:
    """A checkpoint storage target and its assessed state."""

    name: str
    """Identifier (mount point, bucket, filesystem)."""
    state: str = "healthy"
    """Assessment state; ``checkpoint_unsafe`` and worse exclude the path."""


@dataclass(frozen=True)
class PlannerInput:
    """Everything the planner needs about one job at one moment."""

    entity_hazard_per_s: float
    """Baseline hazard of one healthy footprint entity (e.g. node) in failures per second."""
    hazard_multipliers: np.ndarray
    """Per-entity multipliers over the job's footprint (1 = healthy); length = entities."""
    costs: TierCosts
    """Tier costs."""
    scope_fractions: Mapping[Scope, float] = field(
        default_factory=lambda: {Scope.PROCESS: 0.2, Scope.NODE: 0.8})
    """Share of the hazard by failure scope; normalised by the planner."""
    storage_paths: Sequence[StoragePath] = (StoragePath("storage"),)
    """Candidate storage paths in order of preference."""
    unprotected_loss_s: float = 86_400.0
    """Work lost by a failure no tier protects against (progress since the last safe copy)."""
    since_last_checkpoint_s: float = 0.0
    """Work accumulated since the last committed checkpoint of the frequent tier."""
    precursor_hazard_per_s: float = 0.0
    """Short-term hazard implied by pre-failure evidence on the footprint (rising ECC,
    a thermal trend, a degrading cooling loop), on top of the planning hazard; 0 = none."""
    allowed_modes: Sequence[Mode] = tuple(Mode)
    """Modes the runtime can actually perform."""
    max_backstop_interval_s: float = 4 * 3600.0
    """Upper bound for the storage backstop of TIERED (Alibaba HPN checkpoints every 2-4 h)."""


@dataclass(frozen=True)
class CheckpointPlan:
    """The planner's answer, with its reasons as data."""

    mode: Mode
    """Chosen mode."""
    interval_s: float
    """Compute time between checkpoints of the (frequent) tier."""
    stall_s: float
    """Stall per checkpoint of that tier."""
    backstop_interval_s: float | None
    """TIERED only: interval of the storage backstop."""
    storage_path: str | None
    """Storage path used, or None when no safe path exists or the mode needs none."""
    hazard_per_s: float
    """Footprint hazard the plan was made for."""
    mttf_s: float
    """1 / hazard."""
    expected_waste_fraction: float
    """First-order expected share of wall-clock lost to checkpoints and rollbacks."""
    checkpoint_now: bool
    """Take a checkpoint immediately (pre-failure evidence)."""
    reasons: tuple[str, ...]
    """Human-readable reasons, one per decision taken."""


# --------------------------------------------------------------------------- formulas
# (young_interval_s, daly_interval_s: seamguard/reliability.py, re-exported here)


def hazard_multipliers_from_gfs(gfs: np.ndarray, max_multiplier: float = 20.0) -> np.ndarray:
    """Map gray-failure scores in [0, 1] to hazard multipliers ``max_multiplier ** gfs``.

    A score of 0 leaves the hazard unchanged; a score of 1 makes the entity as likely to
    fail as ``max_multiplier`` healthy ones. The default 20 is an assumption (documented
    in docs/twin-events.md): Meta's lemon-node detection cut 512+-GPU job failures from
    14% to 4% by removing a few nodes, i.e. flagged nodes fail an order of magnitude more.
    NaN (missing evidence) counts as healthy.
    """
    if max_multiplier < 1.0:
        raise ValueError("max_multiplier must be >= 1")
    g = np.clip(np.nan_to_num(np.asarray(gfs, dtype=float), nan=0.0), 0.0, 1.0)
    return np.power(max_multiplier, g)


def footprint_hazard_per_s(entity_hazard_per_s: float, multipliers: np.ndarray) -> float:
    """Hazard of a job = sum of its footprint entities' hazards."""
    if entity_hazard_per_s < 0:
        raise ValueError("entity_hazard_per_s must be >= 0")
    m = np.asarray(multipliers, dtype=float)
    if m.size and (np.any(~np.isfinite(m)) or np.any(m < 0)):
        raise ValueError("hazard multipliers must be finite and >= 0")
    return float(entity_hazard_per_s * m.sum())


def expected_waste_fraction(stall_s: float, interval_s: float, hazard_per_s: float,
                            restore_s: float) -> float:
    """First-order waste: stall share plus expected rollback+restore per unit time."""
    if math.isinf(interval_s):
        return 0.0 if hazard_per_s == 0 else math.inf
    period = interval_s + stall_s
    return stall_s / period + hazard_per_s * (period / 2.0 + restore_s)


def should_checkpoint_now(hazard_per_s: float, since_last_s: float, remaining_s: float,
                          stall_s: float) -> bool:
    """Checkpoint now iff the expected rollback avoided exceeds the stall.

    Without a checkpoint, a failure before the next scheduled one (probability
    ``1 - exp(-h * remaining)``) loses the ``since_last`` work already done.
    """
    if since_last_s <= 0 or hazard_per_s <= 0:
        return False
    p_fail = -math.expm1(-hazard_per_s * max(remaining_s, 0.0))
    return p_fail * since_last_s > stall_s


# --------------------------------------------------------------------------- planner


def plan_checkpoint(inp: PlannerInput) -> CheckpointPlan:
    """Choose mode and interval for one job (pure)."""
    reasons: list[str] = []
    hazard = footprint_hazard_per_s(inp.entity_hazard_per_s, inp.hazard_multipliers)
    m = np.asarray(inp.hazard_multipliers, dtype=float)
    if m.size and m.max() > 1.0:
        reasons.append(f"hazard raised x{m.sum() / m.size:.3f} by footprint assessment "
                       f"(max entity x{m.max():.1f})")
    fractions = _normalised(inp.scope_fractions)

    safe_path = next((p.name for p in inp.storage_paths
                      if p.state not in UNSAFE_STORAGE_STATES), None)
    unsafe = [p.name for p in inp.storage_paths if p.state in UNSAFE_STORAGE_STATES]
    if unsafe:
        reasons.append("avoiding checkpoint_unsafe storage: " + ", ".join(unsafe))
    candidates = [Mode(x) for x in inp.allowed_modes]
    if safe_path is None:
        candidates = [x for x in candidates if x in (Mode.IN_MEMORY, Mode.PEER_REPLICATED)]
        reasons.append("no safe storage path: memory tiers only")
    if not candidates:
        raise ValueError("no checkpoint mode is possible (no safe storage and no memory tier)")

    best: tuple[float, CheckpointPlan] | None = None
    for mode in candidates:
        plan = _evaluate(mode, hazard, fractions, inp, safe_path)
        if best is None or plan.expected_waste_fraction < best[0] - 1e-15:
            best = (plan.expected_waste_fraction, plan)
    assert best is not None
    plan = best[1]
    reasons.append(f"mode {plan.mode.value}: expected waste {plan.expected_waste_fraction:.4f} "
                   f"at interval {plan.interval_s / 60:.1f} min (Daly, stall {plan.stall_s:.1f} s, "
                   f"MTTF {plan.mttf_s / 3600:.2f} h)")

    now = False
    if inp.since_last_checkpoint_s >= plan.interval_s:
        # The (possibly raised) hazard makes the work at risk already overdue.
        now = True
        reasons.append("checkpoint now: work since last checkpoint exceeds the interval "
                       "for the current hazard")
    elif inp.precursor_hazard_per_s > 0:
        remaining = max(plan.interval_s - inp.since_last_checkpoint_s, 0.0)
        now = should_checkpoint_now(hazard + inp.precursor_hazard_per_s,
                                    inp.since_last_checkpoint_s, remaining, plan.stall_s)
        reasons.append("pre-failure evidence: " + (
            "checkpoint now (expected rollback avoided exceeds stall)" if now
            else "no early checkpoint (too little work at risk)"))
    return CheckpointPlan(
        mode=plan.mode, interval_s=plan.interval_s, stall_s=plan.stall_s,
        backstop_interval_s=plan.backstop_interval_s, storage_path=plan.storage_path,
        hazard_per_s=hazard, mttf_s=plan.mttf_s,
        expected_waste_fraction=plan.expected_waste_fraction, checkpoint_now=now,
        reasons=tuple(reasons))


def _evaluate(mode: Mode, hazard: float, fractions: Mapping[Scope, float],
              inp: PlannerInput, safe_path: str | None) -> CheckpointPlan:
    costs = inp.costs
    protects = _PROTECTS[Mode.PEER_REPLICATED] if mode is Mode.TIERED else _PROTECTS[mode]
    covered = hazard * sum(f for s, f in fractions.items() if s in protects)
    uncovered = hazard - covered
    stall = costs.stall_s(mode)
    restore = costs.restore_s(mode)
    mttf = 1.0 / covered if covered > 0 else math.inf
    interval = daly_interval_s(max(stall, 1e-9), mttf) if covered > 0 else math.inf
    waste = expected_waste_fraction(stall, interval, covered, restore) if covered > 0 else 0.0
    backstop: float | None = None
    storage = safe_path if mode in (Mode.FULL, Mode.INCREMENTAL) else None
    if mode is Mode.TIERED:
        # The backstop writes whichever storage tier wastes less for the uncovered hazard.
        options = []
        for b_mode in (Mode.INCREMENTAL, Mode.FULL):
            b_write, b_restore = costs.stall_s(b_mode), costs.restore_s(b_mode)
            # Async: training pays the snapshot the drain reads; a failure while the
            # write is in flight rolls back one backstop further (+ b_write on average).
            b_stall = costs.in_memory_stall_s if costs.backstop_async else b_write
            b_lag = b_write if costs.backstop_async else 0.0
            b_int = inp.max_backstop_interval_s
            if costs.backstop_async and math.isfinite(interval):
                # the frequent snapshots are taken anyway: drain every one the storage can
                # absorb (one write at a time), at no extra stall
                b_stall = 0.0
                b_int = min(b_int, interval * math.ceil(b_write / max(interval, 1e-9)))
            elif uncovered > 0:
                b_int = min(daly_interval_s(max(b_stall, 1e-9), 1.0 / uncovered), b_int)
            b_int = max(b_int, b_write)   # one write at a time
            options.append((expected_waste_fraction(b_stall, b_int, uncovered,
                                                    b_restore + b_lag), b_int))
        b_waste, backstop = min(options)
        waste += b_waste
        storage = safe_path
    elif uncovered > 0:
        waste += uncovered * inp.unprotected_loss_s
    if math.isinf(interval) and covered == 0 and uncovered == 0:
        waste = 0.0
    return CheckpointPlan(mode=mode, interval_s=interval, stall_s=stall,
                          backstop_interval_s=backstop, storage_path=storage,
                          hazard_per_s=hazard, mttf_s=mttf,
                          expected_waste_fraction=float(waste), checkpoint_now=False,
                          reasons=())


def _normalised(fractions: Mapping[Scope, float]) -> dict[Scope, float]:
    items = {Scope(k): float(v) for k, v in fractions.items()}
    if any(v < 0 for v in items.values()):
        raise ValueError("scope fractions must be >= 0")
    total = sum(items.values())
    if total <= 0:
        raise ValueError("scope fractions must sum to > 0")
    return {k: v / total for k, v in items.items()}
