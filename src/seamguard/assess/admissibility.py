"""Admissibility: may a node take work of a given job class right now? Pure.

A node is judged per domain (compute: its GPUs, fabric: its NICs, facilities: its rack
and cooling loop, storage: its checkpoint path) and each job class tolerates a different
worst state per domain: batch inference runs fine on a slightly throttled GPU that would
hold back a 1,000-GPU synchronous step. The last column is the checkpoint/restore path.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.assess.states import STATE_BY_LABEL, State
from seamguard.fleet.model import Fleet, JobClass, Kind

DOMAINS = ("compute", "fabric", "facilities", "storage")
ADMISSIBILITY_COLUMNS = tuple(c.label for c in JobClass) + ("checkpoint_restore",)

_STRICT = {"high_sync_training": "healthy", "pipeline_training": "healthy",
           "async_batch_inference": "degraded", "latency_inference": "healthy",
           "checkpoint_restore": "failed"}


class AdmissibilityConfig(BaseModel):
    """Worst state per domain that each job class (and the checkpoint path) tolerates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute: dict[str, str] = Field(default_factory=lambda: dict(_STRICT))
    fabric: dict[str, str] = Field(default_factory=lambda: {**_STRICT, "latency_inference": "degraded"})
    facilities: dict[str, str] = Field(default_factory=lambda: dict(_STRICT))
    storage: dict[str, str] = Field(default_factory=lambda: {
        "high_sync_training": "checkpoint_unsafe", "pipeline_training": "checkpoint_unsafe",
        "async_batch_inference": "failed", "latency_inference": "failed", "checkpoint_restore": "degraded"})

    def model_post_init(self, _ctx: object) -> None:
        for d in DOMAINS:
            table = getattr(self, d)
            for col, st in table.items():
                if col not in ADMISSIBILITY_COLUMNS:
                    raise ValueError(f"admissibility.{d}: unknown job class {col!r}; expected one of "
                                     f"{', '.join(ADMISSIBILITY_COLUMNS)}")
                if st not in STATE_BY_LABEL:
                    raise ValueError(f"admissibility.{d}.{col}: unknown state {st!r}; expected one of "
                                     f"{', '.join(STATE_BY_LABEL)}")

    def limits(self) -> np.ndarray:
        """[domains, columns] worst tolerated state code (missing entries: healthy only)."""
        out = np.zeros((len(DOMAINS), len(ADMISSIBILITY_COLUMNS)), dtype=np.int8)
        for i, d in enumerate(DOMAINS):
            for j, col in enumerate(ADMISSIBILITY_COLUMNS):
                out[i, j] = STATE_BY_LABEL[getattr(self, d).get(col, "healthy")]
        return out


def node_domain_states(fleet: Fleet, states: dict[Kind, np.ndarray]) -> np.ndarray:
    """[nodes, 4] worst state per domain of every node."""
    n = fleet.count(Kind.NODE)
    out = np.zeros((n, len(DOMAINS)), dtype=np.int8)
    np.maximum.at(out[:, 0], fleet.gpu_node, states[Kind.GPU])
    np.maximum.at(out[:, 1], fleet.nic_node, states[Kind.NIC])
    # A node's NIC-leaf links belong to its fabric domain too.
    edge = fleet.link_nic >= 0
    np.maximum.at(out[:, 1], fleet.nic_node[fleet.link_nic[edge]], states[Kind.LINK][edge])
    out[:, 2] = np.maximum(states[Kind.RACK][fleet.node_rack], states[Kind.COOLING_LOOP][fleet.node_loop])
    out[:, 3] = states[Kind.STORAGE][fleet.node_storage]
    return out


def node_admissibility(domain_states: np.ndarray, cfg: AdmissibilityConfig) -> np.ndarray:
    """[nodes, columns] bool: every domain within that column's tolerance."""
    lim = cfg.limits()  # [D, C]
    return (domain_states[:, :, None] <= lim[None, :, :]).all(axis=1)


def admissible_nodes(fleet: Fleet, admissible: np.ndarray, column: str) -> list[str]:
    """Names of the nodes admissible for one job class (what a scheduler plug-in asks)."""
    if column not in ADMISSIBILITY_COLUMNS:
        raise ValueError(f"unknown job class {column!r}; expected one of {', '.join(ADMISSIBILITY_COLUMNS)}")
    j = ADMISSIBILITY_COLUMNS.index(column)
    return [fleet.node_names[i] for i in np.flatnonzero(admissible[:, j])]


__all__ = ["ADMISSIBILITY_COLUMNS", "AdmissibilityConfig", "DOMAINS", "State", "admissible_nodes",
           "node_admissibility", "node_domain_states"]
