"""The per-entity state machine: deterministic, vectorized, with hysteresis and dwell.

A state changes only on sustained evidence: entering needs ``enter_ticks`` consecutive
scores above the entry threshold, leaving needs ``recover_ticks`` below the (lower) exit
threshold after at least ``min_dwell_ticks`` in the state. Hard evidence (XID, a link
down for good, a GPU gone from the bus) goes straight to ``failed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class State(IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    CHECKPOINT_UNSAFE = 2
    QUARANTINE = 3
    HARMFUL = 4
    FAILED = 5

    @property
    def label(self) -> str:
        return self.name.lower()


STATE_BY_LABEL = {s.label: s for s in State}
# Severity order used when several component states fold into one (node, job).
SEVERITY = np.array([0, 1, 2, 3, 4, 5], dtype=np.int8)


class Hysteresis(BaseModel):
    """Thresholds on GFS in [0, 1] and tick counts of one entity kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    degrade_enter: float = Field(0.5, gt=0, le=1, description="GFS at or above which degradation starts counting")
    degrade_exit: float = Field(0.3, ge=0, lt=1, description="GFS below which recovery starts counting")
    quarantine_enter: float = Field(0.8, gt=0, le=1, description="GFS at or above which quarantine starts counting")
    enter_ticks: int = Field(2, ge=1, description="consecutive ticks above degrade_enter to become degraded")
    quarantine_ticks: int = Field(3, ge=1, description="consecutive ticks above quarantine_enter to quarantine")
    recover_ticks: int = Field(12, ge=1, description="consecutive ticks below degrade_exit to return to healthy")
    min_dwell_ticks: int = Field(6, ge=0, description="ticks an entity stays in a state before it may recover")
    harmful_prs: float = Field(0.5, ge=0, le=1, description="PRS at or above which a quarantine-level entity is harmful")
    severe_state: str = Field("quarantine", description="state for sustained severe evidence: quarantine or checkpoint_unsafe")

    def model_post_init(self, _ctx: object) -> None:
        if self.degrade_exit >= self.degrade_enter:
            raise ValueError(f"degrade_exit ({self.degrade_exit}) must be below degrade_enter ({self.degrade_enter})")
        if self.quarantine_enter < self.degrade_enter:
            raise ValueError(f"quarantine_enter ({self.quarantine_enter}) must be >= degrade_enter ({self.degrade_enter})")
        if self.severe_state not in ("quarantine", "checkpoint_unsafe"):
            raise ValueError(f"severe_state must be 'quarantine' or 'checkpoint_unsafe', got {self.severe_state!r}")


@dataclass(frozen=True, eq=False)
class StateVector:
    """Machine state of every entity of one kind, carried from tick to tick."""

    state: np.ndarray  # int8 State
    dwell: np.ndarray  # ticks in the current state
    above_degrade: np.ndarray
    above_quarantine: np.ndarray
    below_exit: np.ndarray
    entered_t_s: np.ndarray  # when the current state was entered

    @classmethod
    def initial(cls, n: int) -> StateVector:
        z = np.zeros(n, dtype=np.int32)
        return cls(np.zeros(n, dtype=np.int8), z.copy(), z.copy(), z.copy(), z.copy(), np.zeros(n))



def step_states(sv: StateVector, gfs: np.ndarray, prs: np.ndarray, hard: np.ndarray,
                h: Hysteresis, t_s: float = 0.0) -> StateVector:
    """One tick of the machine for every entity of a kind. Pure."""
    g = np.nan_to_num(gfs, nan=0.0)
    above_d = np.where(g >= h.degrade_enter, sv.above_degrade + 1, 0)
    above_q = np.where(g >= h.quarantine_enter, sv.above_quarantine + 1, 0)
    below = np.where((g < h.degrade_exit) & ~hard, sv.below_exit + 1, 0)

    cur = sv.state
    severe_state = State.CHECKPOINT_UNSAFE if h.severe_state == "checkpoint_unsafe" else State.QUARANTINE
    severe = np.int8(severe_state)
    if severe_state == State.QUARANTINE:
        severe_target = np.where(prs >= h.harmful_prs, np.int8(State.HARMFUL), severe).astype(np.int8)
    else:
        severe_target = np.full(len(cur), severe, dtype=np.int8)

    recovered = (below >= h.recover_ticks) & (sv.dwell >= h.min_dwell_ticks)
    goes_severe = above_q >= h.quarantine_ticks
    is_severe = (cur == State.QUARANTINE) | (cur == State.HARMFUL) | (cur == State.CHECKPOINT_UNSAFE)

    new = cur.copy()
    # healthy -> degraded / severe
    healthy = cur == State.HEALTHY
    new = np.where(healthy & (above_d >= h.enter_ticks), np.int8(State.DEGRADED), new)
    new = np.where(healthy & goes_severe, severe_target, new)
    # degraded -> severe, or back to healthy
    degraded = cur == State.DEGRADED
    new = np.where(degraded & goes_severe, severe_target, new)
    new = np.where(degraded & ~goes_severe & recovered, np.int8(State.HEALTHY), new)
    # severe: quarantine <-> harmful as the blast radius changes (after dwell), recover when clean
    may_move = is_severe & (sv.dwell >= h.min_dwell_ticks)
    new = np.where(may_move & (above_q > 0), severe_target, new)
    new = np.where(is_severe & recovered, np.int8(State.HEALTHY), new)
    # failed: only sustained clean evidence brings it back (after repair)
    failed = cur == State.FAILED
    new = np.where(failed & recovered, np.int8(State.HEALTHY), new)
    # hard evidence wins over everything
    new = np.where(hard, np.int8(State.FAILED), new).astype(np.int8)

    changed = new != cur
    return StateVector(
        state=new,
        dwell=np.where(changed, 0, sv.dwell + 1).astype(np.int32),
        above_degrade=above_d.astype(np.int32),
        above_quarantine=above_q.astype(np.int32),
        below_exit=below.astype(np.int32),
        entered_t_s=np.where(changed, t_s, sv.entered_t_s),
    )
