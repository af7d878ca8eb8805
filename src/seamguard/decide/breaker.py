"""The safety breaker around the controller itself.

Counts unique nodes the controller has drained (or moved work off) in a sliding window,
as a share of the fleet and of each cooling loop. An action that would exceed either
budget trips it; once tripped it stays tripped — no new drains or moves — until a person
resets it. Its state is plain data so the ledger can persist it across restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from seamguard.decide.policy import BreakerConfig
from seamguard.fleet.model import Fleet, Kind


@dataclass(frozen=True)
class BreakerState:
    tripped: bool = False
    reason: str = ""
    tripped_at_s: float | None = None
    drained: tuple[tuple[float, str], ...] = ()  # (t_s, node) disruptions inside the window

    def reset(self) -> BreakerState:
        return replace(self, tripped=False, reason="", tripped_at_s=None, drained=())

    def to_json(self) -> dict:
        return {"tripped": self.tripped, "reason": self.reason, "tripped_at_s": self.tripped_at_s,
                "drained": [list(x) for x in self.drained]}

    @classmethod
    def from_json(cls, d: dict) -> BreakerState:
        return cls(bool(d.get("tripped")), str(d.get("reason", "")), d.get("tripped_at_s"),
                   tuple((float(t), str(n)) for t, n in d.get("drained", [])))


def admit(state: BreakerState, fleet: Fleet, cfg: BreakerConfig, t_s: float,
          nodes: list[str]) -> tuple[BreakerState, list[str], list[str]]:
    """Admit new disruptions of ``nodes`` in order; returns (state, admitted, held).

    Pure. Nodes already counted in the window are admitted again for free (a second
    action on the same node does not widen the blast radius).
    """
    window = tuple((t, n) for t, n in state.drained if t > t_s - cfg.window_s)
    state = replace(state, drained=window)
    if state.tripped:
        counted = {n for _, n in window}
        return state, [n for n in nodes if n in counted], [n for n in nodes if n not in counted]
    counted = {n for _, n in window}
    n_nodes = max(len(fleet.node_names), 1)
    node_loop = fleet.node_loop
    loop_size = np.bincount(node_loop, minlength=len(fleet.loop_names))
    per_loop = np.zeros(len(fleet.loop_names), dtype=np.int64)
    for n in counted:
        per_loop[node_loop[fleet.index_of(Kind.NODE, n)]] += 1
    admitted, held = [], []
    for n in nodes:
        if n in counted:
            admitted.append(n)
            continue
        lp = int(node_loop[fleet.index_of(Kind.NODE, n)])
        fleet_share = (len(counted) + 1) / n_nodes
        loop_share = (per_loop[lp] + 1) / max(int(loop_size[lp]), 1)
        if fleet_share > cfg.max_fleet_fraction or loop_share > cfg.max_loop_fraction:
            why = (f"draining {n} would disrupt {len(counted) + 1} of {n_nodes} nodes "
                   f"({fleet_share:.1%} > {cfg.max_fleet_fraction:.1%} of the fleet)"
                   if fleet_share > cfg.max_fleet_fraction else
                   f"draining {n} would disrupt {per_loop[lp] + 1} of {loop_size[lp]} nodes on "
                   f"{fleet.loop_names[lp]} ({loop_share:.1%} > {cfg.max_loop_fraction:.1%})")
            state = replace(state, tripped=True, reason=why, tripped_at_s=t_s)
            held.extend(x for x in nodes[nodes.index(n):] if x not in counted)
            break
        counted.add(n)
        per_loop[lp] += 1
        window = window + ((t_s, n),)
        admitted.append(n)
    return replace(state, drained=window), admitted, held
