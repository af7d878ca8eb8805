"""Synthetic fleets of any size, built directly as arrays.

Used by the twin, the benchmarks and `seamguard fleet generate`. The shape follows a
common AI-cluster build: 8-GPU nodes with one NIC per GPU on a rail-optimised fabric
(rail r of every node in a scalable unit goes to leaf r of that unit), two-tier
leaf/spine, liquid-cooled racks grouped on cooling loops, shared storage paths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seamguard.fleet.model import Fleet, JobClass, SwitchTier


@dataclass(frozen=True)
class FleetShape:
    """Knobs of the generator; defaults describe an H100-class liquid-cooled build."""

    gpus: int = 2048
    gpus_per_node: int = 8
    nodes_per_rack: int = 4
    racks_per_loop: int = 8
    rails: int = 8
    nodes_per_unit: int = 32  # nodes behind one leaf per rail (a scalable unit)
    spines: int = 8
    nodes_per_storage_path: int = 64
    spare_fraction: float = 0.04
    loop_rated_flow_lpm: float = 60.0 * 8  # ~60 l/min per rack-sized CDU share
    gpu_throttle_temp_c: float = 87.0  # H100 SXM slowdown point
    gpu_tdp_w: float = 700.0

    def __post_init__(self) -> None:
        if self.gpus < self.gpus_per_node:
            raise ValueError(f"gpus must be at least gpus_per_node ({self.gpus_per_node}), got {self.gpus}")
        for name in ("gpus_per_node", "nodes_per_rack", "racks_per_loop", "rails",
                     "nodes_per_unit", "spines", "nodes_per_storage_path"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.spare_fraction < 0.5:
            raise ValueError(f"spare_fraction must be in [0, 0.5), got {self.spare_fraction}")


# Job mix of a training-heavy cluster: (class, share of allocated nodes, criticality).
DEFAULT_JOB_MIX: tuple[tuple[JobClass, float, float], ...] = (
    (JobClass.HIGH_SYNC_TRAINING, 0.40, 3.0),   # release-critical pretraining run
    (JobClass.HIGH_SYNC_TRAINING, 0.20, 1.0),
    (JobClass.PIPELINE_TRAINING, 0.15, 1.0),
    (JobClass.ASYNC_BATCH_INFERENCE, 0.12, 0.3),
    (JobClass.LATENCY_INFERENCE, 0.08, 2.0),
)


def _names(prefix: str, n: int, width: int) -> list[str]:
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


def generate_fleet(shape: FleetShape | None = None, *, seed: int = 0,
                   job_mix: tuple[tuple[JobClass, float, float], ...] = DEFAULT_JOB_MIX,
                   name: str | None = None) -> Fleet:
    """Build a fleet of ``shape.gpus`` GPUs (rounded down to whole nodes)."""
    s = shape or FleetShape()
    rng = np.random.default_rng(seed)
    n_nodes = s.gpus // s.gpus_per_node
    n_gpus = n_nodes * s.gpus_per_node
    n_racks = -(-n_nodes // s.nodes_per_rack)
    n_loops = -(-n_racks // s.racks_per_loop)
    n_units = -(-n_nodes // s.nodes_per_unit)
    n_storage = -(-n_nodes // s.nodes_per_storage_path)
    wn = max(3, len(str(n_nodes)))

    node = np.arange(n_nodes)
    node_rack = node // s.nodes_per_rack
    rack_loop = np.arange(n_racks) // s.racks_per_loop
    node_storage = node // s.nodes_per_storage_path

    # Spares: the last node of every k-th rack, spread over loops and units.
    n_spare = int(round(n_nodes * s.spare_fraction))
    node_spare = np.zeros(n_nodes, dtype=bool)
    if n_spare:
        picks = np.linspace(0, n_nodes - 1, n_spare).round().astype(np.int64)
        node_spare[picks] = True

    gpu_node = np.repeat(node, s.gpus_per_node)
    nic_node = np.repeat(node, s.rails)
    nic_rail = np.tile(np.arange(s.rails), n_nodes)
    n_nics = len(nic_node)

    # Switches: leaves (unit, rail) then spines.
    n_leaves = n_units * s.rails
    switch_tier = np.concatenate([np.full(n_leaves, SwitchTier.LEAF), np.full(s.spines, SwitchTier.SPINE)])
    leaf_names = [f"leaf-u{u:03d}-r{r}" for u in range(n_units) for r in range(s.rails)]
    spine_names = _names("spine-", s.spines, 2)
    nic_leaf = (nic_node // s.nodes_per_unit) * s.rails + nic_rail

    # Links: one per NIC to its leaf, then every leaf to every spine.
    ls_leaf = np.repeat(np.arange(n_leaves), s.spines)
    ls_spine = np.tile(np.arange(s.spines), n_leaves) + n_leaves
    link_nic = np.concatenate([np.arange(n_nics), np.full(len(ls_leaf), -1)])
    link_leaf = np.concatenate([nic_leaf, ls_leaf])
    link_spine = np.concatenate([np.full(n_nics, -1), ls_spine])

    node_names = _names("gpu", n_nodes, wn)
    nic_names = [f"{node_names[n]}/mlx5_{r}" for n, r in zip(nic_node.tolist(), nic_rail.tolist())]
    switch_names = leaf_names + spine_names
    link_names = ([f"{nic_names[i]}~{leaf_names[nic_leaf[i]]}" for i in range(n_nics)]
                  + [f"{leaf_names[a]}~{spine_names[b - n_leaves]}"
                     for a, b in zip(ls_leaf.tolist(), ls_spine.tolist())])

    # Jobs: pack allocated (non-spare) nodes contiguously, share by share.
    job_class, job_crit, job_names = [], [], []
    gpu_job = np.full(n_gpus, -1, dtype=np.int64)
    alloc = np.flatnonzero(~node_spare)
    cursor = 0
    for j, (cls, share, crit) in enumerate(job_mix):
        k = max(1, int(round(share * len(alloc))))
        nodes = alloc[cursor:cursor + k]
        if len(nodes) == 0:
            break
        cursor += len(nodes)
        job_names.append(f"job-{j:02d}-{cls.label}")
        job_class.append(int(cls))
        job_crit.append(crit)
        gpu_job[(nodes[:, None] * s.gpus_per_node + np.arange(s.gpus_per_node)).ravel()] = len(job_names) - 1

    # Small per-unit manufacturing spread in rated flow, so peers are not identical.
    loop_flow = s.loop_rated_flow_lpm * (1.0 + 0.02 * rng.standard_normal(n_loops))

    return Fleet(
        loop_names=_names("loop-", n_loops, 3),
        loop_rated_flow_lpm=loop_flow,
        rack_names=_names("rack-", n_racks, 4),
        rack_loop=rack_loop,
        node_names=node_names,
        node_rack=node_rack,
        node_storage=node_storage,
        node_spare=node_spare,
        gpu_names=[f"{node_names[n]}/gpu{g}" for n in range(n_nodes) for g in range(s.gpus_per_node)],
        gpu_node=gpu_node,
        gpu_throttle_temp_c=np.full(n_gpus, s.gpu_throttle_temp_c),
        gpu_tdp_w=np.full(n_gpus, s.gpu_tdp_w),
        nic_names=nic_names,
        nic_node=nic_node,
        nic_rail=nic_rail,
        switch_names=switch_names,
        switch_tier=switch_tier.astype(np.int8),
        link_names=link_names,
        link_nic=link_nic,
        link_leaf=link_leaf,
        link_spine=link_spine,
        storage_names=_names("storage-", n_storage, 3),
        job_names=job_names,
        job_class=np.array(job_class, dtype=np.int64),
        job_criticality=np.array(job_crit, dtype=float),
        gpu_job=gpu_job,
        name=name or f"synthetic-{n_gpus}",
    )
