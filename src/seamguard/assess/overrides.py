"""Operator pins: a person holds an entity in a state, with a note. Pure.

The controller applies pins to each tick's Assessment after the state machine and
before decide, so a pinned entity drives (or is spared) actions exactly as if the
evidence had put it there, and the pin shows up in the ledger as a transition whose
reason is the operator's note. Node states and admissibility are recomputed from the
pinned component states so every consumer sees one consistent picture.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from seamguard.assess.admissibility import AdmissibilityConfig, node_admissibility, node_domain_states
from seamguard.assess.assessment import ASSESSED_KINDS, Assessment, Reason, Transition, node_cause
from seamguard.assess.states import State
from seamguard.fleet.model import Fleet, Kind

PIN_CHANNEL = "operator_pin"


@dataclass(frozen=True)
class Pin:
    """An entity held in ``state`` until unpinned. ``by`` names who asked (for the record)."""

    kind: Kind
    index: int
    entity: str
    state: State
    note: str
    by: str = "operator"
    since_wall_s: float = 0.0


def pin_reason(p: Pin) -> Reason:
    return Reason(f"{PIN_CHANNEL} by {p.by}: {p.note}", 1.0, float(p.state), "state")


def apply_pins(fleet: Fleet, a: Assessment, pins: dict[tuple[Kind, int], Pin],
               prev_states: dict[Kind, np.ndarray], prev_node_state: np.ndarray | None,
               cfg: AdmissibilityConfig) -> Assessment:
    """The assessment with every pinned entity in its pinned state.

    ``prev_states`` are the state arrays before this tick, so transitions are reported
    against what the entity really was. Unpinned entities are untouched.
    """
    if not pins:
        return a
    kinds = dict(a.kinds)
    pinned_keys = set(pins)
    transitions = [t for t in a.transitions if (t.kind, t.index) not in pinned_keys and t.kind != Kind.NODE]
    for kind in ASSESSED_KINDS:
        mine = [p for (k, _), p in pins.items() if k == kind]
        if not mine:
            continue
        ka = kinds[kind]
        sv = ka.states
        idx = np.array([p.index for p in mine], dtype=np.int64)
        target = np.array([int(p.state) for p in mine], dtype=np.int8)
        state = sv.state.copy()
        state[idx] = target
        changed_now = state != sv.state
        dwell = np.where(changed_now, 0, sv.dwell).astype(sv.dwell.dtype)
        entered = np.where(changed_now, a.t_s, sv.entered_t_s)
        kinds[kind] = replace(ka, states=replace(sv, state=state, dwell=dwell, entered_t_s=entered))
        before = prev_states[kind]
        for p in mine:
            if int(before[p.index]) != int(p.state):
                transitions.append(Transition(
                    t_s=a.t_s, kind=kind, index=p.index, entity=p.entity, from_state=State(int(before[p.index])),
                    to_state=p.state, gfs=round(float(ka.gfs[p.index]), 4), prs=round(float(ka.prs[p.index]), 4),
                    fae=round(float(ka.fae[p.index]), 3), reasons=(pin_reason(p),) + ka.reasons(p.index)))
    domain = node_domain_states(fleet, {k: kinds[k].states.state for k in ASSESSED_KINDS})
    node_state = np.maximum(domain[:, 0], domain[:, 1]).astype(np.int8)
    prev_ns = prev_node_state if prev_node_state is not None else a.node_state
    # Node transitions are re-derived from the pinned component states.
    for i in np.flatnonzero(node_state != prev_ns).tolist():
        _, f, reasons = node_cause(fleet, kinds, i)
        transitions.append(Transition(
            t_s=a.t_s, kind=Kind.NODE, index=i, entity=fleet.node_names[i], from_state=State(int(prev_ns[i])),
            to_state=State(int(node_state[i])), gfs=round(float(a.node_gfs[i]), 4), prs=0.0, fae=round(float(f), 3),
            reasons=reasons))
    return replace(a, kinds=kinds, node_state=node_state, node_domain_state=domain,
                   admissible=node_admissibility(domain, cfg), transitions=transitions)
