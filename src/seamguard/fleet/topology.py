"""The versioned YAML topology format (docs/topology.md): load, validate, write.

Validation errors name the file, the field (as a dotted path with list indices) and
what was expected, because the person reading them is editing that file by hand.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from seamguard.fleet.model import (DEFAULT_STORAGE_BUDGET_MS, DEFAULT_SUPPLY_TEMP_MAX_C, JOB_CLASS_BY_LABEL, Fleet,
                                   JobClass, SwitchTier)
from seamguard.config import format_validation_error

TOPOLOGY_VERSION = 1


class TopologyError(ValueError):
    """A topology file that cannot be used; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoopSpec(_Strict):
    name: str = Field(min_length=1, description="Unique cooling-loop (CDU) name.")
    rated_flow_lpm: float = Field(gt=0, description="Rated coolant flow in litres per minute.")
    supply_temp_max_c: float | None = Field(default=None, gt=0, lt=100, description=(
        "Highest coolant supply temperature the loop is designed for (its ASHRAE class); default: defaults'."))


class StoragePathSpec(_Strict):
    name: str = Field(min_length=1)
    budget_ms: float | None = Field(default=None, gt=0, le=600_000, description=(
        "p99 of the storage probe's write (create + write + fsync) the path must stay under; default: defaults'."))


class RackSpec(_Strict):
    name: str = Field(min_length=1)
    cooling_loop: str = Field(description="Name of the cooling loop that cools this rack.")


class SwitchSpec(_Strict):
    name: str = Field(min_length=1)
    tier: Literal["leaf", "spine"]


class UplinkSpec(_Strict):
    leaf: str
    spine: str


class NicSpec(_Strict):
    name: str | None = Field(default=None, description="Defaults to '<node>/mlx5_<rail>'.")
    rail: int = Field(ge=0)
    leaf: str = Field(description="Leaf switch this NIC's link goes to.")


class NodeSpec(_Strict):
    name: str = Field(min_length=1)
    rack: str
    storage: str = Field(description="Storage path this node checkpoints to.")
    gpus: int = Field(default=8, ge=0, le=64)
    spare: bool = False
    nics: list[NicSpec] = Field(default_factory=list)
    gpu_throttle_temp_c: float | None = Field(default=None, gt=0, lt=150)
    gpu_tdp_w: float | None = Field(default=None, gt=0)
    nvlink_domain: str | None = Field(default=None, min_length=1, description=(
        "NVLink domain (nodes whose GPUs share NVSwitches, e.g. one NVL72 rack); default: the node alone."))


class JobSpec(_Strict):
    name: str = Field(min_length=1)
    job_class: Literal["high_sync_training", "pipeline_training", "async_batch_inference",
                       "latency_inference"] = Field(alias="class")
    criticality: float = Field(default=1.0, ge=0)
    nodes: list[str] = Field(min_length=1)


class Defaults(_Strict):
    gpu_throttle_temp_c: float = Field(default=87.0, gt=0, lt=150)
    gpu_tdp_w: float = Field(default=700.0, gt=0)
    supply_temp_max_c: float = Field(default=DEFAULT_SUPPLY_TEMP_MAX_C, gt=0, lt=100)
    storage_budget_ms: float = Field(default=DEFAULT_STORAGE_BUDGET_MS, gt=0, le=600_000)


class TopologySpec(_Strict):
    version: Literal[1]
    name: str = "fleet"
    defaults: Defaults = Field(default_factory=Defaults)
    cooling_loops: list[LoopSpec] = Field(min_length=1)
    racks: list[RackSpec] = Field(min_length=1)
    switches: list[SwitchSpec] = Field(default_factory=list)
    uplinks: list[UplinkSpec] = Field(default_factory=list)
    storage_paths: list[StoragePathSpec] = Field(min_length=1, description="names, or {name, budget_ms}")
    nodes: list[NodeSpec] = Field(min_length=1)
    jobs: list[JobSpec] = Field(default_factory=list)

    @field_validator("storage_paths", mode="before")
    @classmethod
    def _path_names(cls, v: Any) -> Any:
        return [{"name": p} if isinstance(p, str) else p for p in v] if isinstance(v, list) else v


def _check_names(source: str, kind: str, names: list[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in index:
            raise TopologyError(f"{source}: {kind}[{i}].name: duplicate name {n!r} (first at {kind}[{index[n]}])")
        index[n] = i
    return index


def _ref(source: str, where: str, name: str, index: dict[str, int], what: str) -> int:
    try:
        return index[name]
    except KeyError:
        known = ", ".join(sorted(index)[:5])
        raise TopologyError(f"{source}: {where}: unknown {what} {name!r}; expected one of: {known}"
                            + (", ..." if len(index) > 5 else "")) from None


def fleet_from_spec(spec: TopologySpec, source: str = "<topology>") -> Fleet:
    """Turn a validated spec into a Fleet, checking every cross-reference."""
    loops = _check_names(source, "cooling_loops", [lp.name for lp in spec.cooling_loops])
    racks = _check_names(source, "racks", [r.name for r in spec.racks])
    switches = _check_names(source, "switches", [s.name for s in spec.switches])
    paths = spec.storage_paths
    storage = _check_names(source, "storage_paths", [p.name for p in paths])
    nodes = _check_names(source, "nodes", [n.name for n in spec.nodes])
    _check_names(source, "jobs", [j.name for j in spec.jobs])
    tier = {s.name: s.tier for s in spec.switches}

    rack_loop = [_ref(source, f"racks[{i}].cooling_loop", r.cooling_loop, loops, "cooling loop")
                 for i, r in enumerate(spec.racks)]
    node_rack, node_storage, node_spare = [], [], []
    gpu_node, gpu_throttle, gpu_tdp, gpu_names = [], [], [], []
    nic_names, nic_node, nic_rail, nic_leaf = [], [], [], []
    for i, n in enumerate(spec.nodes):
        node_rack.append(_ref(source, f"nodes[{i}].rack", n.rack, racks, "rack"))
        node_storage.append(_ref(source, f"nodes[{i}].storage", n.storage, storage, "storage path"))
        node_spare.append(n.spare)
        for g in range(n.gpus):
            gpu_names.append(f"{n.name}/gpu{g}")
            gpu_node.append(i)
            gpu_throttle.append(n.gpu_throttle_temp_c or spec.defaults.gpu_throttle_temp_c)
            gpu_tdp.append(n.gpu_tdp_w or spec.defaults.gpu_tdp_w)
        for k, nic in enumerate(n.nics):
            where = f"nodes[{i}].nics[{k}].leaf"
            leaf = _ref(source, where, nic.leaf, switches, "switch")
            if tier[nic.leaf] != "leaf":
                raise TopologyError(f"{source}: {where}: {nic.leaf!r} is a {tier[nic.leaf]}; expected a leaf switch")
            nic_names.append(nic.name or f"{n.name}/mlx5_{nic.rail}")
            nic_node.append(i)
            nic_rail.append(nic.rail)
            nic_leaf.append(leaf)
    _check_names(source, "nics", nic_names)

    up_leaf, up_spine = [], []
    for i, u in enumerate(spec.uplinks):
        a = _ref(source, f"uplinks[{i}].leaf", u.leaf, switches, "switch")
        b = _ref(source, f"uplinks[{i}].spine", u.spine, switches, "switch")
        if tier[u.leaf] != "leaf" or tier[u.spine] != "spine":
            raise TopologyError(f"{source}: uplinks[{i}]: expected leaf -> spine, got "
                                f"{tier[u.leaf]} {u.leaf!r} -> {tier[u.spine]} {u.spine!r}")
        up_leaf.append(a)
        up_spine.append(b)

    gpu_job = np.full(len(gpu_node), -1, dtype=np.int64)
    gpu_node_arr = np.array(gpu_node, dtype=np.int64)
    for j, job in enumerate(spec.jobs):
        for k, nn in enumerate(job.nodes):
            ni = _ref(source, f"jobs[{j}].nodes[{k}]", nn, nodes, "node")
            on_node = gpu_node_arr == ni
            clash = gpu_job[on_node]
            if (clash >= 0).any():
                other = spec.jobs[int(clash[clash >= 0][0])].name
                raise TopologyError(f"{source}: jobs[{j}].nodes[{k}]: node {nn!r} is already placed in job {other!r}")
            if spec.nodes[ni].spare:
                raise TopologyError(f"{source}: jobs[{j}].nodes[{k}]: node {nn!r} is a spare; spares hold no job")
            gpu_job[on_node] = j

    n_nic = len(nic_names)
    switch_names = [s.name for s in spec.switches]
    domains = {d: i for i, d in enumerate(dict.fromkeys(n.nvlink_domain for n in spec.nodes if n.nvlink_domain))}
    return Fleet(
        loop_names=[lp.name for lp in spec.cooling_loops],
        loop_rated_flow_lpm=np.array([lp.rated_flow_lpm for lp in spec.cooling_loops], dtype=float),
        rack_names=[r.name for r in spec.racks],
        rack_loop=np.array(rack_loop, dtype=np.int64),
        node_names=[n.name for n in spec.nodes],
        node_rack=np.array(node_rack, dtype=np.int64),
        node_storage=np.array(node_storage, dtype=np.int64),
        node_spare=np.array(node_spare, dtype=bool),
        gpu_names=gpu_names,
        gpu_node=gpu_node_arr,
        gpu_throttle_temp_c=np.array(gpu_throttle, dtype=float),
        gpu_tdp_w=np.array(gpu_tdp, dtype=float),
        nic_names=nic_names,
        nic_node=np.array(nic_node, dtype=np.int64),
        nic_rail=np.array(nic_rail, dtype=np.int64),
        switch_names=switch_names,
        switch_tier=np.array([SwitchTier.LEAF if s.tier == "leaf" else SwitchTier.SPINE
                              for s in spec.switches], dtype=np.int8),
        link_names=[f"{nic_names[i]}~{switch_names[nic_leaf[i]]}" for i in range(n_nic)]
        + [f"{switch_names[a]}~{switch_names[b]}" for a, b in zip(up_leaf, up_spine)],
        link_nic=np.concatenate([np.arange(n_nic), np.full(len(up_leaf), -1)]).astype(np.int64),
        link_leaf=np.array(nic_leaf + up_leaf, dtype=np.int64),
        link_spine=np.array([-1] * n_nic + up_spine, dtype=np.int64),
        storage_names=[p.name for p in paths],
        job_names=[j.name for j in spec.jobs],
        job_class=np.array([int(JOB_CLASS_BY_LABEL[j.job_class]) for j in spec.jobs], dtype=np.int64),
        job_criticality=np.array([j.criticality for j in spec.jobs], dtype=float),
        gpu_job=gpu_job,
        name=spec.name,
        loop_supply_temp_max_c=np.array([lp.supply_temp_max_c or spec.defaults.supply_temp_max_c
                                         for lp in spec.cooling_loops], dtype=float),
        storage_budget_ms=np.array([p.budget_ms or spec.defaults.storage_budget_ms for p in paths], dtype=float),
        node_nvlink_domain=np.array([domains.get(n.nvlink_domain, -1) if n.nvlink_domain else -1
                                     for n in spec.nodes], dtype=np.int64) if domains else None,
    )


def parse_topology(data: Any, source: str = "<topology>") -> Fleet:
    """Validate already-parsed YAML/JSON data and build the Fleet."""
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    if "version" not in data:
        raise TopologyError(f"{source}: version: missing; expected 'version: {TOPOLOGY_VERSION}'")
    if data["version"] != TOPOLOGY_VERSION:
        raise TopologyError(f"{source}: version: unsupported topology version {data['version']!r}; "
                            f"this seamguard reads version {TOPOLOGY_VERSION}")
    try:
        spec = TopologySpec.model_validate(data)
    except ValidationError as err:
        raise TopologyError(format_validation_error(source, "topology", err)) from None
    return fleet_from_spec(spec, source)



def fleet_to_topology(fleet: Fleet) -> dict[str, Any]:
    """The topology document that reproduces ``fleet`` (round-trips through load)."""
    nics_by_node: dict[int, list[dict[str, Any]]] = {}
    for i, (n, r) in enumerate(zip(fleet.nic_node.tolist(), fleet.nic_rail.tolist())):
        leaf = int(fleet.nic_leaf[i])
        nics_by_node.setdefault(n, []).append(
            {"name": fleet.nic_names[i], "rail": r, "leaf": fleet.switch_names[leaf]})
    gpus = fleet.node_gpu_count
    uplink = fleet.link_nic < 0
    domain = fleet.node_domain
    shared = np.bincount(domain)[domain] > 1  # only domains of several nodes are written
    nodes_by_job: dict[int, list[str]] = {}
    for n, j in enumerate(fleet.node_job.tolist()):
        if j >= 0:
            nodes_by_job.setdefault(j, []).append(fleet.node_names[n])
    return {
        "version": TOPOLOGY_VERSION,
        "name": fleet.name,
        "defaults": {"gpu_throttle_temp_c": float(np.median(fleet.gpu_throttle_temp_c)),
                     "gpu_tdp_w": float(np.median(fleet.gpu_tdp_w))},
        "cooling_loops": [{"name": n, "rated_flow_lpm": round(float(f), 3),
                           **({"supply_temp_max_c": float(t)} if t != DEFAULT_SUPPLY_TEMP_MAX_C else {})}
                          for n, f, t in zip(fleet.loop_names, fleet.loop_rated_flow_lpm, fleet.supply_temp_max_c)],
        "racks": [{"name": n, "cooling_loop": fleet.loop_names[lp]}
                  for n, lp in zip(fleet.rack_names, fleet.rack_loop.tolist())],
        "switches": [{"name": n, "tier": "leaf" if t == SwitchTier.LEAF else "spine"}
                     for n, t in zip(fleet.switch_names, fleet.switch_tier.tolist())],
        "uplinks": [{"leaf": fleet.switch_names[a], "spine": fleet.switch_names[b]}
                    for a, b in zip(fleet.link_leaf[uplink].tolist(), fleet.link_spine[uplink].tolist())],
        # Only what differs from the defaults is written: a file without envelopes reads as before.
        "storage_paths": [n if b == DEFAULT_STORAGE_BUDGET_MS else {"name": n, "budget_ms": float(b)}
                          for n, b in zip(fleet.storage_names, fleet.storage_budget)],
        "nodes": [{"name": n, "rack": fleet.rack_names[fleet.node_rack[i]],
                   "storage": fleet.storage_names[fleet.node_storage[i]], "gpus": int(gpus[i]),
                   "spare": bool(fleet.node_spare[i]), "nics": nics_by_node.get(i, []),
                   **({"nvlink_domain": f"nvl{int(domain[i])}"} if shared[i] else {})}
                  for i, n in enumerate(fleet.node_names)],
        "jobs": [{"name": n, "class": JobClass(int(c)).label, "criticality": float(k),
                  "nodes": nodes_by_job.get(j, [])}
                 for j, (n, c, k) in enumerate(zip(fleet.job_names, fleet.job_class.tolist(),
                                                   fleet.job_criticality.tolist()))
                 if nodes_by_job.get(j)],
    }
