"""PRS (propagation risk) and FAE (failure-amplification estimate). Pure functions.

Both start from the same quantity: how many GPUs' work waits on an entity. A GPU in a
synchronous job holds up the whole job (every step runs at the slowest rank); a GPU in
batch inference holds up only itself; shared entities (loops, racks, leaf uplinks,
storage paths) hold up every job that touches them.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.fleet.model import JOB_CLASS_SYNCHRONY, Fleet, Kind


class PropagationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prs_scale_gpus: float = Field(256.0, gt=0, description="dependent GPUs at which PRS reaches 1 - 1/e")
    comm_share: float = Field(0.3, ge=0, le=1, description="share of a step spent in collectives")
    checkpoint_share: float = Field(0.05, ge=0, le=1, description="share of wall time spent writing checkpoints")
    flap_stall_s: float = Field(9.0, ge=0, description="job stall per link flap on a single path (HPN: > 9 s)")
    hazard_per_h_at_gfs1: float = Field(0.5, ge=0, description="hard-failure hazard of an entity with GFS 1")
    checkpoint_interval_h: float = Field(0.5, gt=0, description="typical checkpoint interval (rollback = half)")
    restart_h: float = Field(0.15, ge=0, description="restart overhead per failure (Meta RSC: 5-20 min)")


def _job_weights(fleet: Fleet) -> tuple[np.ndarray, np.ndarray]:
    """(synchrony, size) per job."""
    return JOB_CLASS_SYNCHRONY[fleet.job_class], fleet.job_gpu_count.astype(float)


def dependents(fleet: Fleet, gpu_entity: np.ndarray, n_entities: int) -> np.ndarray:
    """GPUs whose progress waits on each entity, given the entity serving each GPU.

    For each (entity, job) pair: synchrony * job size + (1 - synchrony) * the job's GPUs
    on the entity; idle GPUs count themselves.
    """
    sync, size = _job_weights(fleet)
    n_jobs = len(size)
    job = fleet.gpu_job
    ok = gpu_entity >= 0
    key = gpu_entity[ok] * (n_jobs + 1) + (job[ok] + 1)
    uniq, own = np.unique(key, return_counts=True)
    ent, j = uniq // (n_jobs + 1), uniq % (n_jobs + 1) - 1
    if n_jobs == 0:  # a fleet with no jobs (imported from Slurm alone): every GPU counts itself
        return np.bincount(ent, weights=own.astype(float), minlength=n_entities)
    placed = j >= 0
    jj = np.maximum(j, 0)
    w = np.where(placed, sync[jj] * size[jj] + (1.0 - sync[jj]) * own, own)
    return np.bincount(ent, weights=w, minlength=n_entities)


def all_dependents(fleet: Fleet) -> dict[Kind, np.ndarray]:
    """Dependent GPUs for every kind (computed once per placement)."""
    node_dep = dependents(fleet, fleet.gpu_node, fleet.count(Kind.NODE))
    # A NIC of a node, and its NIC-leaf link, hold up the node's jobs.
    nic_dep = node_dep[fleet.nic_node]
    # A leaf (and each of its uplinks) holds up every job with a NIC on it.
    n_sw = fleet.count(Kind.SWITCH)
    gpu_leaf = np.full(fleet.count(Kind.GPU), -1, dtype=np.int64)
    first_nic = np.full(fleet.count(Kind.NODE), -1, dtype=np.int64)
    first_nic[fleet.nic_node[::-1]] = np.arange(len(fleet.nic_node))[::-1]
    has_nic = first_nic[fleet.gpu_node] >= 0
    # Approximation: a rail-optimised fabric puts every node of a unit on the same set
    # of leaves, so the first NIC's leaf stands for the node's unit.
    gpu_leaf[has_nic] = fleet.nic_leaf[first_nic[fleet.gpu_node[has_nic]]]
    leaf_dep = dependents(fleet, gpu_leaf, n_sw)
    link_dep = np.where(fleet.link_nic >= 0,
                        nic_dep[np.maximum(fleet.link_nic, 0)] if len(nic_dep) else 0.0,
                        leaf_dep[fleet.link_leaf] if len(leaf_dep) else 0.0)
    gpu_dep = dependents(fleet, np.arange(fleet.count(Kind.GPU)), fleet.count(Kind.GPU))
    sync, size = _job_weights(fleet)
    return {
        Kind.GPU: gpu_dep,
        Kind.NODE: node_dep,
        Kind.NIC: nic_dep,
        Kind.LINK: link_dep,
        Kind.SWITCH: leaf_dep,
        Kind.RACK: dependents(fleet, fleet.gpu_rack, fleet.count(Kind.RACK)),
        Kind.COOLING_LOOP: dependents(fleet, fleet.gpu_loop, fleet.count(Kind.COOLING_LOOP)),
        Kind.STORAGE: dependents(fleet, fleet.node_storage[fleet.gpu_node], fleet.count(Kind.STORAGE)),
        Kind.JOB: sync * size + (1.0 - sync) * 1.0,
    }


def prs(dep: np.ndarray, cfg: PropagationConfig) -> np.ndarray:
    """Propagation risk in [0, 1): saturating in dependent GPUs."""
    return 1.0 - np.exp(-dep / cfg.prs_scale_gpus)


def fae(dep: np.ndarray, gfs: np.ndarray, slowdown: np.ndarray, cfg: PropagationConfig) -> np.ndarray:
    """Healthy GPU-hours per hour lost while the entity stays in the critical path.

    Two parts: the slowdown it imposes now on everything that waits on it, and the
    expected loss from a hard failure (hazard rising with GFS) that rolls every
    dependent GPU back half a checkpoint interval and pays a restart.
    """
    g = np.nan_to_num(gfs, nan=0.0)
    hazard_per_h = cfg.hazard_per_h_at_gfs1 * g * g
    loss_per_failure_h = cfg.checkpoint_interval_h / 2.0 + cfg.restart_h
    return dep * (np.clip(np.nan_to_num(slowdown, nan=0.0), 0.0, 1.0) + hazard_per_h * loss_per_failure_h)
