"""Fault injection for the telemetry twin: what breaks, where, when, and the ground truth.

Product code, not test scaffolding: the demo, the tests and the benchmarks all inject
faults through these specs, and the demo scores detection against their labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from seamguard.fleet.model import Fleet, JobClass, Kind


class FaultKind(str, Enum):
    COOLING_FLOW_LOSS = "cooling_flow_loss"  # a CDU pump/valve fault: flow ramps down
    FABRIC_LATENCY = "fabric_latency"  # a leaf-spine link turns latency-toxic
    STORAGE_SLOW = "storage_slow"  # a checkpoint store path slows down
    GPU_ECC_ESCALATION = "gpu_ecc_escalation"  # correctable errors climb to a fatal XID
    NIC_FLAP = "nic_flap"  # a NIC link flaps down/up repeatedly
    GPU_FAIL_SLOW = "gpu_fail_slow"  # a GPU computes slower than its peers, clocks look fine
    GPU_THERMAL_INTERFACE = "gpu_thermal_interface"  # paste/contact degrades: hotter at the same power
    GPU_PCIE_REPLAY = "gpu_pcie_replay"  # a bad riser/retimer: PCIe replays climb


ENTITY_KIND = {
    FaultKind.COOLING_FLOW_LOSS: Kind.COOLING_LOOP,
    FaultKind.FABRIC_LATENCY: Kind.LINK,
    FaultKind.STORAGE_SLOW: Kind.STORAGE,
    FaultKind.GPU_ECC_ESCALATION: Kind.GPU,
    FaultKind.NIC_FLAP: Kind.NIC,
    FaultKind.GPU_FAIL_SLOW: Kind.GPU,
    FaultKind.GPU_THERMAL_INTERFACE: Kind.GPU,
    FaultKind.GPU_PCIE_REPLAY: Kind.GPU,
}


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault. ``magnitude`` is kind-specific (documented per kind)."""

    kind: FaultKind
    index: int  # entity index of ENTITY_KIND[kind]
    start_s: float
    duration_s: float = float("inf")
    magnitude: float = 1.0
    # cooling: flow fraction reached at the end of the ramp; latency: multiplier;
    # storage: latency multiplier; ECC: seconds from start to the fatal XID;
    # flap: seconds between flaps; fail-slow: speed factor (< 1); thermal interface: the
    # GPU's thermal resistance multiplier at the end of the ramp; PCIe replay: replays per
    # hour at the end of the ramp.
    ramp_s: float = 600.0

    @property
    def entity_kind(self) -> Kind:
        return ENTITY_KIND[self.kind]

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.start_s + self.duration_s


@dataclass
class FaultTruth:
    """Ground truth the twin fills in as the fault plays out."""

    spec: FaultSpec
    entity: str
    affected: dict[Kind, set[int]] = field(default_factory=dict)
    hard_failure_s: float | None = None  # when the fault became a hard failure (ECC)
    throttle_s: float | None = None  # when the first GPU clock dropped (cooling, thermal interface)
    remaps: int = 0  # HBM rows remapped so far (ECC escalation)


def affected_entities(fleet: Fleet, spec: FaultSpec, gpu_job: np.ndarray) -> dict[Kind, set[int]]:
    """Entities an action may legitimately target because of this fault."""
    out: dict[Kind, set[int]] = {k: set() for k in Kind}
    nodes: np.ndarray
    if spec.kind == FaultKind.COOLING_FLOW_LOSS:
        out[Kind.COOLING_LOOP].add(spec.index)
        racks = np.flatnonzero(fleet.rack_loop == spec.index)
        out[Kind.RACK].update(racks.tolist())
        nodes = np.flatnonzero(np.isin(fleet.node_rack, racks))
    elif spec.kind == FaultKind.FABRIC_LATENCY:
        out[Kind.LINK].add(spec.index)
        leaf = fleet.link_leaf[spec.index]
        out[Kind.SWITCH].add(int(leaf))
        nodes = np.unique(fleet.nic_node[fleet.nic_leaf == leaf])
    elif spec.kind == FaultKind.STORAGE_SLOW:
        out[Kind.STORAGE].add(spec.index)
        nodes = np.flatnonzero(fleet.node_storage == spec.index)
    elif spec.kind == FaultKind.NIC_FLAP:
        out[Kind.NIC].add(spec.index)
        out[Kind.LINK].update(np.flatnonzero(fleet.link_nic == spec.index).tolist())
        nodes = np.array([fleet.nic_node[spec.index]])
    else:
        out[Kind.GPU].add(spec.index)
        nodes = np.array([fleet.gpu_node[spec.index]])
    out[Kind.NODE].update(nodes.tolist())
    on_nodes = np.isin(fleet.gpu_node, nodes)
    out[Kind.GPU].update(np.flatnonzero(on_nodes).tolist())
    out[Kind.NIC].update(np.flatnonzero(np.isin(fleet.nic_node, nodes)).tolist())
    jobs = gpu_job[on_nodes]
    out[Kind.JOB].update(np.unique(jobs[jobs >= 0]).tolist())
    return out


def default_scenario(fleet: Fleet, duration_s: float, seed: int) -> list[FaultSpec]:
    """One fault of each kind, on entities and at times chosen by the seed.

    Each fault lands on a different node and cooling loop so their effects stay
    distinguishable; faults start in the first 45 % of the run so each has time to play
    out; GPU faults go to GPUs of running jobs, where they matter.
    """
    rng = np.random.default_rng(seed)
    used_loops: set[int] = set()
    used_nodes: set[int] = set()

    def start() -> float:
        return float(rng.uniform(0.08, 0.45) * duration_s)

    def pick_node(cond: np.ndarray) -> int:
        ok = cond & ~np.isin(np.arange(len(cond)), list(used_nodes)) & \
            ~np.isin(fleet.node_loop, list(used_loops))
        if not ok.any():
            ok = cond & ~np.isin(np.arange(len(cond)), list(used_nodes))
        n = int(rng.choice(np.flatnonzero(ok)))
        used_nodes.add(n)
        used_loops.add(int(fleet.node_loop[n]))
        return n

    sync = np.isin(fleet.job_class, [JobClass.HIGH_SYNC_TRAINING, JobClass.PIPELINE_TRAINING])
    node_job = fleet.node_job
    in_sync_job = (node_job >= 0) & sync[np.maximum(node_job, 0)]

    specs: list[FaultSpec] = []
    loop = int(rng.integers(fleet.count(Kind.COOLING_LOOP)))
    used_loops.add(loop)
    # The flow loss starts early enough that, unchecked, it throttles GPUs within the run.
    specs.append(FaultSpec(FaultKind.COOLING_FLOW_LOSS, loop, float(rng.uniform(0.08, 0.3) * duration_s),
                           magnitude=0.10, ramp_s=min(600.0, 0.3 * duration_s)))

    n = pick_node(in_sync_job)
    gpus = np.flatnonzero(fleet.gpu_node == n)
    specs.append(FaultSpec(FaultKind.GPU_ECC_ESCALATION, int(rng.choice(gpus)), start(),
                           magnitude=float(rng.uniform(0.25, 0.35) * duration_s)))
    n = pick_node(in_sync_job)
    nics = np.flatnonzero(fleet.nic_node == n)
    specs.append(FaultSpec(FaultKind.NIC_FLAP, int(rng.choice(nics)), start(), magnitude=45.0,
                           duration_s=0.3 * duration_s))
    n = pick_node(in_sync_job)
    gpus = np.flatnonzero(fleet.gpu_node == n)
    specs.append(FaultSpec(FaultKind.GPU_FAIL_SLOW, int(rng.choice(gpus)), start(), magnitude=0.7))

    uplinks = np.flatnonzero(fleet.link_nic < 0)
    specs.append(FaultSpec(FaultKind.FABRIC_LATENCY, int(rng.choice(uplinks)), start(), magnitude=8.0))
    specs.append(FaultSpec(FaultKind.STORAGE_SLOW, int(rng.integers(fleet.count(Kind.STORAGE))), start(),
                           magnitude=10.0))
    return sorted(specs, key=lambda s: s.start_s)
