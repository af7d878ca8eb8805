"""The Snapshot: one immutable picture of the controller after a tick.

The controller thread builds it after every tick and swaps a reference; every HTTP
handler, `/metrics` and the dashboard render from it and never touch the controller's
mutable state. Everything a request needs repeatedly (per-kind state arrays, counts by
state, per-loop and per-rack aggregates) is computed here once per tick, vectorized, so
a request at 100k GPUs costs a mask and a page, not a scan in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seamguard.assess.assessment import Assessment, Reason, node_cause
from seamguard.assess.overrides import Pin
from seamguard.assess.quality import FrozenScope
from seamguard.assess.states import State
from seamguard.decide.breaker import BreakerState
from seamguard.fleet.model import NO_INDEX, Fleet, Kind
from seamguard.app.sources import Progress

# Kinds the API lists. Switches carry no signals and no state machine, so they are not listed.
ENTITY_KINDS = (Kind.COOLING_LOOP, Kind.RACK, Kind.NODE, Kind.GPU, Kind.NIC, Kind.LINK, Kind.STORAGE, Kind.JOB)
KIND_DOMAIN = {Kind.COOLING_LOOP: "facilities", Kind.RACK: "facilities", Kind.NODE: "compute",
               Kind.GPU: "compute", Kind.NIC: "fabric", Kind.LINK: "fabric", Kind.STORAGE: "storage",
               Kind.JOB: "runtime"}
N_STATES = len(State)


@dataclass(frozen=True, eq=False)
class KindView:
    """Scores and states of every entity of one kind, aligned to the fleet's index."""

    kind: Kind
    names: list[str]
    state: np.ndarray  # int8 State
    gfs: np.ndarray
    prs: np.ndarray
    fae: np.ndarray
    loop: np.ndarray  # cooling loop index per entity, -1 when it has none
    rack: np.ndarray  # rack index per entity, -1 when it has none
    entered_t_s: np.ndarray

    @property
    def count(self) -> int:
        return len(self.names)

    def counts(self) -> dict[str, int]:
        c = np.bincount(self.state, minlength=N_STATES)
        return {s.label: int(c[s]) for s in State}


@dataclass(frozen=True)
class Counters:
    """Cumulative counts since the service started (for `/metrics` counters)."""

    ticks: int = 0
    tick_errors: int = 0
    tick_seconds_sum: float = 0.0
    tick_buckets: tuple[int, ...] = ()  # cumulative counts per TICK_BUCKETS bound
    actions: tuple[tuple[str, str, str, int], ...] = ()  # (verb, op, status, count)
    transitions: tuple[tuple[str, str, int], ...] = ()  # (kind, to_state, count)


TICK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class ThroughputPoint:
    t_s: float
    useful_with: float
    useful_without: float | None


@dataclass(frozen=True, eq=False)
class FleetPoint:
    """Fleet-level figures of one tick, kept over time for the dashboard's fleet panels."""

    t_s: float  # controller time of the tick
    wall_s: float  # wall clock when the tick finished (achieved speed = d t_s / d wall_s)
    gpu_counts: tuple[int, ...]  # GPUs per state
    node_counts: tuple[int, ...]  # nodes per state
    loop_state: np.ndarray  # int8 state per cooling loop
    coolant: np.ndarray  # float32 [loops, 3]: flow litres/min, supply and return temperature celsius
    ticks_skipped: int  # grid ticks the schedule had dropped by then (cumulative)


COOLANT_SIGNALS = ("seamguard_coolant_flow_lpm", "seamguard_coolant_supply_temp_c", "seamguard_coolant_return_temp_c")


def fleet_point(views: dict[Kind, KindView], latest: dict[str, np.ndarray], t_s: float, wall_s: float,
                ticks_skipped: int) -> FleetPoint:
    """One FleetPoint from a tick's views and the frame's latest coolant readings."""
    loops = views[Kind.COOLING_LOOP].count
    coolant = np.full((loops, len(COOLANT_SIGNALS)), np.nan, dtype=np.float32)
    for j, name in enumerate(COOLANT_SIGNALS):
        v = latest.get(name)
        if v is not None and v.shape[0] == loops:
            coolant[:, j] = v
    g = np.bincount(views[Kind.GPU].state.astype(np.int64), minlength=N_STATES)
    n = np.bincount(views[Kind.NODE].state.astype(np.int64), minlength=N_STATES)
    return FleetPoint(t_s=float(t_s), wall_s=float(wall_s), gpu_counts=tuple(int(x) for x in g),
                      node_counts=tuple(int(x) for x in n),
                      loop_state=views[Kind.COOLING_LOOP].state.astype(np.int8).copy(), coolant=coolant,
                      ticks_skipped=int(ticks_skipped))


@dataclass(frozen=True, eq=False)
class Snapshot:
    tick: int
    t_s: float
    wall_s: float
    source: str
    mode: str
    speed: float
    tick_interval_s: float
    fleet: Fleet
    assessment: Assessment | None
    kinds: dict[Kind, KindView]
    loop_counts: dict[Kind, np.ndarray]  # [loops, states] for gpu, node, nic
    rack_counts: np.ndarray  # [racks, states] of GPUs
    breaker: BreakerState
    pins: tuple[Pin, ...]
    in_effect: tuple[str, ...]
    assess_s: float
    decide_s: float
    act_s: float
    tick_s: float
    tick_error: str
    ring_upto: int
    progress: Progress | None
    throughput: tuple[ThroughputPoint, ...]
    counters: Counters
    started_wall_s: float = 0.0
    fleet_history: tuple[FleetPoint, ...] = ()  # oldest first, one per tick
    failsafe: tuple[FrozenScope, ...] = ()  # scopes frozen for want of data (no new actions there)
    ticks_skipped: int = 0  # grid ticks the wall-clock schedule dropped because the loop fell behind
    schedule_lag_s: float = 0.0  # how far behind its grid the loop was when this snapshot was built
    extra: dict = field(default_factory=dict)

    def view(self, kind: Kind) -> KindView:
        return self.kinds[kind]

    def reasons(self, kind: Kind, index: int) -> tuple[Reason, ...]:
        """The evidence behind an entity's current score (strongest first)."""
        a = self.assessment
        if a is None:
            return ()
        if kind in a.kinds:
            return a.kinds[kind].reasons(index)
        if kind == Kind.NODE:
            return node_cause(self.fleet, a.kinds, index)[2]
        if kind == Kind.JOB:
            nodes = np.flatnonzero(self.fleet.node_job == index)
            if nodes.size == 0:
                return ()
            worst = int(nodes[np.argmax(self.kinds[Kind.NODE].gfs[nodes])])
            return node_cause(self.fleet, a.kinds, worst)[2]
        return ()


def _through_node(fleet: Fleet, kind: Kind, per_node: np.ndarray, per_gpu: np.ndarray) -> np.ndarray:
    """A node attribute (loop, rack) for every entity of ``kind`` that sits in a node;
    NO_INDEX for the rest (a fabric link without a NIC end, other kinds)."""
    out = np.full(fleet.count(kind), NO_INDEX, dtype=np.int64)
    if kind == Kind.NODE:
        out[:] = per_node
    elif kind == Kind.GPU:
        out[:] = per_gpu
    elif kind == Kind.NIC:
        out[:] = per_node[fleet.nic_node]
    elif kind == Kind.LINK:
        edge = fleet.link_nic >= 0
        out[edge] = per_node[fleet.nic_node[fleet.link_nic[edge]]]
    return out


def _loop_of(fleet: Fleet, kind: Kind) -> np.ndarray:
    if kind == Kind.COOLING_LOOP:
        return np.arange(fleet.count(kind))
    if kind == Kind.RACK:
        return fleet.rack_loop.astype(np.int64)
    return _through_node(fleet, kind, fleet.node_loop, fleet.gpu_loop)


def _rack_of(fleet: Fleet, kind: Kind) -> np.ndarray:
    if kind == Kind.RACK:
        return np.arange(fleet.count(kind))
    return _through_node(fleet, kind, fleet.node_rack, fleet.gpu_rack)


def _per_owner_max(values: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n)
    if values.size:
        np.maximum.at(out, owner, np.nan_to_num(values))
    return out


def build_views(fleet: Fleet, a: Assessment | None, prev: dict[Kind, KindView] | None = None) -> dict[Kind, KindView]:
    """Per-kind views of one assessment (all healthy, zero scores before the first)."""
    views: dict[Kind, KindView] = {}
    for kind in ENTITY_KINDS:
        n = fleet.count(kind)
        loop, rack = _loop_of(fleet, kind), _rack_of(fleet, kind)
        if a is None:
            z = np.zeros(n)
            views[kind] = KindView(kind, fleet.names(kind), np.zeros(n, dtype=np.int8), z, z, z, loop, rack, z)
            continue
        if kind in a.kinds:
            ka = a.kinds[kind]
            views[kind] = KindView(kind, fleet.names(kind), ka.states.state, ka.gfs, ka.prs, ka.fae, loop, rack,
                                   ka.states.entered_t_s)
    if a is not None:
        n_nodes = fleet.count(Kind.NODE)
        g, nic = a.kinds[Kind.GPU], a.kinds[Kind.NIC]
        node_prs = np.maximum(_per_owner_max(g.prs, fleet.gpu_node, n_nodes), _per_owner_max(nic.prs, fleet.nic_node, n_nodes))
        node_fae = np.maximum(_per_owner_max(g.fae, fleet.gpu_node, n_nodes), _per_owner_max(nic.fae, fleet.nic_node, n_nodes))
        prev_node = prev.get(Kind.NODE) if prev else None
        entered = np.zeros(n_nodes)
        if prev_node is not None and prev_node.count == n_nodes:
            entered = np.where(prev_node.state != a.node_state, a.t_s, prev_node.entered_t_s)
        views[Kind.NODE] = KindView(Kind.NODE, fleet.node_names, a.node_state, a.node_gfs, node_prs, node_fae,
                                    _loop_of(fleet, Kind.NODE), _rack_of(fleet, Kind.NODE), entered)
        n_jobs = fleet.count(Kind.JOB)
        placed = fleet.gpu_job >= 0
        job_state = np.zeros(n_jobs, dtype=np.int8)
        np.maximum.at(job_state, fleet.gpu_job[placed], a.node_state[fleet.gpu_node[placed]])
        job_gfs = _per_owner_max(a.node_gfs[fleet.gpu_node[placed]], fleet.gpu_job[placed], n_jobs)
        job_prs = _per_owner_max(g.prs[placed], fleet.gpu_job[placed], n_jobs)
        job_fae = _per_owner_max(g.fae[placed], fleet.gpu_job[placed], n_jobs)
        prev_job = prev.get(Kind.JOB) if prev else None
        j_entered = np.zeros(n_jobs)
        if prev_job is not None and prev_job.count == n_jobs:
            j_entered = np.where(prev_job.state != job_state, a.t_s, prev_job.entered_t_s)
        views[Kind.JOB] = KindView(Kind.JOB, fleet.job_names, job_state, job_gfs, job_prs, job_fae,
                                   _loop_of(fleet, Kind.JOB), _rack_of(fleet, Kind.JOB), j_entered)
    return {k: views[k] for k in ENTITY_KINDS}


def state_counts_by(owner: np.ndarray, state: np.ndarray, n_owners: int) -> np.ndarray:
    """[owners, states] count of entities per owner per state (owner -1 dropped)."""
    ok = owner >= 0
    flat = owner[ok] * N_STATES + state[ok].astype(np.int64)
    return np.bincount(flat, minlength=n_owners * N_STATES).reshape(n_owners, N_STATES)
