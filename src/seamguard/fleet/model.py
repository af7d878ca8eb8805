"""The cluster model every stage shares: entities as index-based arrays.

Each entity kind has a name list and integer arrays that point at the entities that
contain or serve it, so every later stage (assess, decide, twin) can compute over whole
kinds at once with numpy instead of looping over Python objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from types import MappingProxyType

import numpy as np


class Kind(IntEnum):
    """Entity kinds, in containment/dependency order."""

    COOLING_LOOP = 0
    RACK = 1
    NODE = 2
    GPU = 3
    NIC = 4
    LINK = 5
    SWITCH = 6
    STORAGE = 7
    JOB = 8

    @property
    def label(self) -> str:
        return self.name.lower()


KIND_BY_LABEL = {k.label: k for k in Kind}


class JobClass(IntEnum):
    """How a job reacts to a slow or failing member (its synchrony)."""

    HIGH_SYNC_TRAINING = 0
    PIPELINE_TRAINING = 1
    ASYNC_BATCH_INFERENCE = 2
    LATENCY_INFERENCE = 3

    @property
    def label(self) -> str:
        return self.name.lower()


JOB_CLASS_BY_LABEL = {c.label: c for c in JobClass}

# Fraction of a job that waits when one member is slow or gone. A synchronous
# data-parallel step runs at its slowest rank (1.0); a pipeline stalls its stage
# neighbours and, through bubbles, most of the job; batch inference loses only the
# member itself; latency-critical serving loses the replica plus tail-latency headroom.
JOB_CLASS_SYNCHRONY = np.array([1.0, 0.7, 0.0, 0.25])


class SwitchTier(IntEnum):
    LEAF = 0
    SPINE = 1


NO_INDEX = -1

# Design envelopes when the topology gives none (docs/topology.md, "Design envelopes"):
# the top of ASHRAE's highest bounded liquid-cooling class (W45: supply water up to 45 °C),
# and the p99 of the storage probe's create+write+fsync a checkpoint path must stay under.
DEFAULT_SUPPLY_TEMP_MAX_C = 45.0
DEFAULT_STORAGE_BUDGET_MS = 100.0


@dataclass(frozen=True, eq=False)
class Fleet:
    """A whole cluster. Arrays are aligned to the entity index of their kind.

    Links are of two sorts in one array: NIC-to-leaf (``link_nic >= 0``) and
    leaf-to-spine (``link_nic == -1``, ``link_spine >= 0``).
    """

    loop_names: list[str]
    loop_rated_flow_lpm: np.ndarray
    rack_names: list[str]
    rack_loop: np.ndarray
    node_names: list[str]
    node_rack: np.ndarray
    node_storage: np.ndarray
    node_spare: np.ndarray  # bool: held back as a hot spare
    gpu_names: list[str]
    gpu_node: np.ndarray
    gpu_throttle_temp_c: np.ndarray
    gpu_tdp_w: np.ndarray
    nic_names: list[str]
    nic_node: np.ndarray
    nic_rail: np.ndarray
    switch_names: list[str]
    switch_tier: np.ndarray
    link_names: list[str]
    link_nic: np.ndarray
    link_leaf: np.ndarray
    link_spine: np.ndarray
    storage_names: list[str]
    job_names: list[str]
    job_class: np.ndarray
    job_criticality: np.ndarray  # weight >= 0; 1 = ordinary, higher = release-critical
    gpu_job: np.ndarray  # job index per GPU, -1 = idle
    name: str = "fleet"
    # Per job, what its schedule is (decide/slip.py); None or NaN = not known for that job.
    job_deadline_s: np.ndarray | None = None  # Unix seconds by which the job should finish
    job_total_steps: np.ndarray | None = None  # steps the job runs in all (its progress is the runtime's step)
    job_step_s: np.ndarray | None = None  # configured wall time of one step, s (the runtime's measured one wins)
    # Design envelopes and the NVLink domain; None (or NaN / -1 in an entry) = the default.
    loop_supply_temp_max_c: np.ndarray | None = None  # per loop: the highest coolant supply it is designed for
    storage_budget_ms: np.ndarray | None = None  # per storage path: p99 probe write latency it must stay under
    node_nvlink_domain: np.ndarray | None = None  # per node: index of its NVLink domain (default: itself)
    _index: dict = field(default_factory=dict, repr=False)

    # ---- sizes -------------------------------------------------------------
    def count(self, kind: Kind) -> int:
        return len(self.names(kind))

    def names(self, kind: Kind) -> list[str]:
        return {
            Kind.COOLING_LOOP: self.loop_names,
            Kind.RACK: self.rack_names,
            Kind.NODE: self.node_names,
            Kind.GPU: self.gpu_names,
            Kind.NIC: self.nic_names,
            Kind.LINK: self.link_names,
            Kind.SWITCH: self.switch_names,
            Kind.STORAGE: self.storage_names,
            Kind.JOB: self.job_names,
        }[kind]

    def index_table(self, kind: Kind) -> Mapping[str, int]:
        """Entity index by name for one kind, read-only, built once per Fleet (a tick at a
        million GPUs would otherwise rebuild a 125k-entry dict in each stage that needs it)."""
        table = self._index.get(kind)
        if table is None:
            table = MappingProxyType({n: i for i, n in enumerate(self.names(kind))})
            self._index[kind] = table
        return table

    def index_of(self, kind: Kind, name: str) -> int:
        """Entity index by name; raises KeyError naming the kind."""
        try:
            return self.index_table(kind)[name]
        except KeyError:
            raise KeyError(f"no {kind.label} named {name!r} in fleet {self.name!r}") from None

    # ---- derived relations (computed once) ---------------------------------
    @cached_property
    def gpu_rack(self) -> np.ndarray:
        return self.node_rack[self.gpu_node]

    @cached_property
    def gpu_loop(self) -> np.ndarray:
        return self.rack_loop[self.gpu_rack]

    @cached_property
    def node_loop(self) -> np.ndarray:
        return self.rack_loop[self.node_rack]

    @cached_property
    def nic_link(self) -> np.ndarray:
        """The NIC-to-leaf link of each NIC (-1 when the NIC has none)."""
        out = np.full(len(self.nic_names), NO_INDEX, dtype=np.int64)
        edge = self.link_nic >= 0
        out[self.link_nic[edge]] = np.flatnonzero(edge)
        return out

    @cached_property
    def nic_leaf(self) -> np.ndarray:
        link = self.nic_link
        return np.where(link >= 0, self.link_leaf[np.maximum(link, 0)], NO_INDEX)

    @cached_property
    def job_gpu_count(self) -> np.ndarray:
        placed = self.gpu_job >= 0
        return np.bincount(self.gpu_job[placed], minlength=len(self.job_names)).astype(np.int64)

    @cached_property
    def node_job(self) -> np.ndarray:
        """Job on each node (the job of its first placed GPU; -1 = idle)."""
        out = np.full(len(self.node_names), NO_INDEX, dtype=np.int64)
        placed = self.gpu_job >= 0
        out[self.gpu_node[placed]] = self.gpu_job[placed]
        return out

    def job_schedule(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(deadline Unix s, total steps, configured step s) per job; NaN where the job has none."""
        n = len(self.job_names)

        def filled(a: np.ndarray | None) -> np.ndarray:
            return np.full(n, np.nan) if a is None else np.asarray(a, dtype=float)
        return filled(self.job_deadline_s), filled(self.job_total_steps), filled(self.job_step_s)

    @cached_property
    def supply_temp_max_c(self) -> np.ndarray:
        """Per cooling loop, the supply temperature it is designed for (°C), defaults filled in."""
        return _filled(self.loop_supply_temp_max_c, len(self.loop_names), DEFAULT_SUPPLY_TEMP_MAX_C)

    @cached_property
    def storage_budget(self) -> np.ndarray:
        """Per storage path, its p99 write-latency budget (ms), defaults filled in."""
        return _filled(self.storage_budget_ms, len(self.storage_names), DEFAULT_STORAGE_BUDGET_MS)

    @cached_property
    def node_domain(self) -> np.ndarray:
        """Per node, its NVLink domain (a node whose GPUs share NVSwitches with no other is its own)."""
        own = np.arange(len(self.node_names), dtype=np.int64)
        d = self.node_nvlink_domain
        if d is None:
            return own
        d = np.asarray(d, dtype=np.int64)
        # Nodes left out of every named domain get numbers past the named ones: never shared.
        return np.where(d >= 0, d, own + (int(d.max()) + 1 if d.size else 0))

    @cached_property
    def node_gpu_count(self) -> np.ndarray:
        return np.bincount(self.gpu_node, minlength=len(self.node_names)).astype(np.int64)

    @cached_property
    def gpu_synchrony(self) -> np.ndarray:
        """Synchrony of the job each GPU runs (0 when idle)."""
        job = self.gpu_job
        cls = np.where(job >= 0, self.job_class[np.maximum(job, 0)], 0)
        return np.where(job >= 0, JOB_CLASS_SYNCHRONY[cls], 0.0)

    @cached_property
    def gpu_job_size(self) -> np.ndarray:
        job = self.gpu_job
        return np.where(job >= 0, self.job_gpu_count[np.maximum(job, 0)], 0)

    def summary(self) -> dict[str, int]:
        return {k.label: self.count(k) for k in Kind}


def _filled(a: np.ndarray | None, n: int, default: float) -> np.ndarray:
    if a is None:
        return np.full(n, default)
    a = np.asarray(a, dtype=float)
    return np.where(np.isfinite(a), a, default)
