"""One tick of assessment: Frame + bounded history + previous states -> Assessment.

Pure: no clock, no I/O. The Assessment is the single record the decide stage, the
ledger, the API and the dashboard read; every state change in it carries the evidence
that drove it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.assess import evidence as ev
from seamguard.assess.baselines import BaselineConfig, Baselines, node_at_work
from seamguard.assess.admissibility import AdmissibilityConfig, node_admissibility, node_domain_states
from seamguard.assess.parents import ParentConfig, fabric_parents, facility_parents
from seamguard.assess.quality import mask_stale
from seamguard.assess.unnamed import UnnamedJudgeConfig, UnnamedState, host_of, series_evidence
from seamguard.assess.work import storage_bursts
from seamguard.assess.propagation import PropagationConfig, all_dependents, fae, prs
from seamguard.assess.states import Hysteresis, State, StateVector, step_states
from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame
from seamguard.observe.history import History

ASSESSED_KINDS = (Kind.COOLING_LOOP, Kind.RACK, Kind.GPU, Kind.NIC, Kind.LINK, Kind.STORAGE, Kind.SWITCH)


def _default_hysteresis() -> dict[str, Hysteresis]:
    return {
        "cooling_loop": Hysteresis(enter_ticks=2, quarantine_ticks=3),
        "rack": Hysteresis(),
        "gpu": Hysteresis(),
        "nic": Hysteresis(recover_ticks=36),  # flap dampening: stay out until stable
        "link": Hysteresis(),
        # A synchronous checkpoint's own write burst slows its path for a minute or two: a
        # path must stay slow 4 ticks (2 min at a 30 s tick) before it is degraded.
        "storage": Hysteresis(severe_state="checkpoint_unsafe", enter_ticks=4),
    }


class AssessConfig(BaseModel):
    """Everything the assess stage is tuned by (the `assess:` section of a policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    evidence: ev.EvidenceConfig = Field(default_factory=ev.EvidenceConfig)
    baselines: BaselineConfig = Field(default_factory=BaselineConfig)
    propagation: PropagationConfig = Field(default_factory=PropagationConfig)
    hysteresis: dict[str, Hysteresis] = Field(default_factory=_default_hysteresis)
    admissibility: AdmissibilityConfig = Field(default_factory=AdmissibilityConfig)
    parents: ParentConfig = Field(default_factory=ParentConfig)
    unnamed: UnnamedJudgeConfig = Field(default_factory=UnnamedJudgeConfig)

    def hysteresis_for(self, kind: Kind) -> Hysteresis:
        return self.hysteresis.get(kind.label) or Hysteresis()

    def history_depths(self, tick_s: float) -> dict[str, int]:
        """Rows each counter signal must keep for the windows that read it."""
        e = self.evidence
        rate = int(np.ceil(e.rate_window_s / tick_s)) + 1
        flap = int(np.ceil(e.flap_window_s / tick_s)) + 1
        out = {name: rate for name in ev.RATE_COUNTERS}
        out.update({name: flap for name in ev.FLAP_COUNTERS})
        out["node_infiniband_state_id"] = max(e.link_down_hard_ticks, 2)
        out["node_infiniband_physical_state_id"] = max(e.link_down_hard_ticks, 2)
        return out


@dataclass(frozen=True)
class Reason:
    """One channel of evidence behind a score: what was measured and how much it counted."""

    channel: str
    score: float
    value: float
    unit: str


@dataclass(frozen=True)
class Transition:
    """A state change of one entity, with the evidence that drove it."""

    t_s: float
    kind: Kind
    index: int
    entity: str
    from_state: State
    to_state: State
    gfs: float
    prs: float
    fae: float
    reasons: tuple[Reason, ...]


@dataclass(frozen=True, eq=False)
class KindAssessment:
    kind: Kind
    evidence: ev.Evidence
    gfs: np.ndarray
    prs: np.ndarray
    fae: np.ndarray
    states: StateVector
    slowdown: np.ndarray  # throughput the entity costs what waits on it now (0..1)

    def reasons(self, i: int, min_score: float = 0.05) -> tuple[Reason, ...]:
        e = self.evidence
        row_s, row_v = e.score[i], e.value[i]
        order = np.argsort(-row_s)
        return tuple(Reason(e.channels[c], round(float(row_s[c]), 4), float(row_v[c]), e.units[c])
                     for c in order if row_s[c] >= min_score)


@dataclass(frozen=True, eq=False)
class Assessment:
    t_s: float
    kinds: dict[Kind, KindAssessment]
    node_gfs: np.ndarray
    node_state: np.ndarray  # int8 State, the most severe of the node's GPUs and NICs
    node_domain_state: np.ndarray  # [nodes, 4]: compute, fabric, facilities, storage
    admissible: np.ndarray  # [nodes, classes + 1]: job classes then checkpoint/restore path
    transitions: list[Transition] = field(default_factory=list)
    frozen: tuple = ()  # quality.FrozenScope: scopes whose input failed; their states were held
    baselines: Baselines | None = None  # the per-entity baselines after this tick (the controller keeps them)
    job_uncommitted_s: np.ndarray | None = None  # per job, the runtime's rollback exposure (NaN: not reported)
    job_step_s: np.ndarray | None = None  # per job, the runtime's measured step time (NaN: not reported)
    job_steps_done: np.ndarray | None = None  # per job, the runtime's furthest step (NaN: not reported)
    unnamed: dict[Kind, UnnamedState] | None = None  # assess/unnamed.py's state after this tick (the controller keeps it)

    def state(self, kind: Kind) -> np.ndarray:
        return self.node_state if kind == Kind.NODE else self.kinds[kind].states.state

    def counts_by_state(self, kind: Kind) -> dict[str, int]:
        c = np.bincount(self.state(kind), minlength=len(State))
        return {s.label: int(c[s]) for s in State}


def initial_states(fleet: Fleet) -> dict[Kind, StateVector]:
    return {k: StateVector.initial(fleet.count(k)) for k in ASSESSED_KINDS}


def _slowdown(kind: Kind, e: ev.Evidence, cfg: AssessConfig) -> np.ndarray:
    p = cfg.propagation
    col = {c: i for i, c in enumerate(e.channels)}
    if kind == Kind.GPU:
        return np.maximum(np.nan_to_num(e.value[:, col["clock_deficit"]]),
                          np.nan_to_num(e.value[:, col["compute_excess"]]))
    if kind == Kind.NIC:
        flaps_per_h = e.value[:, col["flaps"]] * 3600.0 / cfg.evidence.flap_window_s
        return flaps_per_h * p.flap_stall_s / 3600.0
    if kind == Kind.LINK:
        return (np.nan_to_num(e.value[:, col["latency"]], nan=1.0) - 1.0) * p.comm_share
    if kind == Kind.STORAGE:
        return (np.nan_to_num(e.value[:, col["latency_ratio"]], nan=1.0) - 1.0) * p.checkpoint_share
    return np.zeros(e.score.shape[0])


def assess(fleet: Fleet, frame: Frame, hist: History, prev: dict[Kind, StateVector],
           cfg: AssessConfig, deps: dict[Kind, np.ndarray] | None = None,
           prev_node_state: np.ndarray | None = None, hold: dict[Kind, np.ndarray] | None = None,
           frozen: tuple = (), base: Baselines | None = None,
           unnamed: dict[Kind, UnnamedState] | None = None) -> Assessment:
    """Score, classify and explain every entity for one frame.

    ``hist`` holds the frames before ``frame``; ``deps`` may be passed in when the
    placement has not changed since the last tick (it is the only costly topology walk).
    ``hold``: entities whose input failed this tick (quality.scope_masks): their state
    machine does not step, so missing data neither raises nor clears a state.
    ``base``: the per-entity baselines after the previous tick (None: fresh, all warming);
    the updated ones come back in ``Assessment.baselines``. Entities that are failed or
    held do not teach their baselines. ``unnamed``: the series judge's state (assess/unnamed.py),
    likewise returned in ``Assessment.unnamed``.
    """
    deps = deps if deps is not None else all_dependents(fleet)
    frame = mask_stale(fleet, frame, frozen)  # a stale exporter's values are no measurements
    e_cfg, b_cfg = cfg.evidence, cfg.baselines
    base = base if base is not None else Baselines.initial(fleet, b_cfg)
    dt_s = base.dt(frame.t_s, hist.tick_s)

    def learn(kind: Kind) -> np.ndarray:
        ok = prev[kind].state != State.FAILED
        h = hold.get(kind) if hold is not None else None
        return ok & ~h if h is not None else ok

    evid: dict[Kind, ev.Evidence] = {}
    evid[Kind.COOLING_LOOP], (loop_b, supply_b) = ev.loop_evidence(fleet, frame, e_cfg, base, b_cfg, learn(Kind.COOLING_LOOP),
                                                       dt_s)
    evid[Kind.RACK] = ev.rack_evidence(fleet, frame, e_cfg)
    evid[Kind.GPU], gpu_b, r_th, r_n = ev.gpu_evidence(fleet, frame, hist, e_cfg, evid[Kind.COOLING_LOOP].gfs,
                                                      base, b_cfg, learn(Kind.GPU), dt_s)
    # Nodes that move together under one loop or one rack are its: one alarm, on it.
    evid[Kind.GPU], evid[Kind.RACK], evid[Kind.COOLING_LOOP] = facility_parents(
        fleet, evid[Kind.GPU], evid[Kind.RACK], evid[Kind.COOLING_LOOP], cfg.parents)
    evid[Kind.NIC], nic_b = ev.nic_evidence(fleet, frame, hist, e_cfg, base, b_cfg, learn(Kind.NIC), dt_s)
    evid[Kind.LINK], link_b = ev.link_evidence(fleet, frame, e_cfg, base, b_cfg, learn(Kind.LINK), dt_s)
    # Links that move together with their switch are the switch's: one alarm, on it.
    evid[Kind.SWITCH], evid[Kind.LINK] = fabric_parents(fleet, evid[Kind.LINK], e_cfg, cfg.parents)
    evid[Kind.STORAGE], sto_b = ev.storage_evidence(fleet, frame, e_cfg, base, b_cfg, learn(Kind.STORAGE), dt_s,
                                                    hist=hist)
    # A checkpoint's write burst is work: slow no longer than the path's own bursts is not evidence.
    evid[Kind.STORAGE], burst_b = storage_bursts(evid[Kind.STORAGE], base.bursts(fleet.count(Kind.STORAGE)),
                                                 learn(Kind.STORAGE) & (prev[Kind.STORAGE].state == State.HEALTHY),
                                                 dt_s, b_cfg, e_cfg.storage_latency_ratio[0])
    new_base = Baselines(gpu_b, nic_b, link_b, sto_b, loop_b, supply_b, r_th, r_n, frame.t_s, burst_b)
    new_unnamed = _unnamed(fleet, frame, evid, unnamed or {}, learn, cfg)

    kinds: dict[Kind, KindAssessment] = {}
    transitions: list[Transition] = []
    for kind in ASSESSED_KINDS:
        e = evid[kind]
        gfs = e.gfs
        p = prs(deps[kind], cfg.propagation)
        slow = np.clip(np.nan_to_num(_slowdown(kind, e, cfg), nan=0.0), 0.0, 1.0)
        f = fae(deps[kind], gfs, slow, cfg.propagation)
        before = prev[kind]
        hard = e.hard_event | ((before.state == State.FAILED) & e.hard_level)
        after = step_states(before, gfs, p, hard, cfg.hysteresis_for(kind), frame.t_s)
        h = hold.get(kind) if hold is not None else None
        if h is not None and h.any():
            after = StateVector(*(np.where(h, getattr(before, f), getattr(after, f)).astype(getattr(after, f).dtype)
                                  for f in ("state", "dwell", "above_degrade", "above_quarantine", "below_exit",
                                            "entered_t_s")))
        ka = KindAssessment(kind, e, gfs, p, f, after, slow)
        kinds[kind] = ka
        for i in np.flatnonzero(after.state != before.state).tolist():
            transitions.append(Transition(
                t_s=frame.t_s, kind=kind, index=i, entity=fleet.names(kind)[i],
                from_state=State(int(before.state[i])), to_state=State(int(after.state[i])),
                gfs=round(float(gfs[i]), 4), prs=round(float(p[i]), 4), fae=round(float(f[i]), 3),
                reasons=ka.reasons(i)))

    n_nodes = fleet.count(Kind.NODE)
    node_gfs = np.zeros(n_nodes)
    np.maximum.at(node_gfs, fleet.gpu_node, kinds[Kind.GPU].gfs)
    np.maximum.at(node_gfs, fleet.nic_node, kinds[Kind.NIC].gfs)
    domain = node_domain_states(fleet, {k: kinds[k].states.state for k in ASSESSED_KINDS})
    node_state = np.maximum(domain[:, 0], domain[:, 1]).astype(np.int8)
    if prev_node_state is not None:
        for i in np.flatnonzero(node_state != prev_node_state).tolist():
            cause = node_cause(fleet, kinds, i)
            transitions.append(Transition(
                t_s=frame.t_s, kind=Kind.NODE, index=i, entity=fleet.node_names[i],
                from_state=State(int(prev_node_state[i])), to_state=State(int(node_state[i])),
                gfs=round(float(node_gfs[i]), 4), prs=round(float(prs(deps[Kind.NODE][i:i + 1], cfg.propagation)[0]), 4),
                fae=round(float(cause[1]), 3), reasons=cause[2]))
    return Assessment(
        t_s=frame.t_s, kinds=kinds, node_gfs=node_gfs, node_state=node_state,
        node_domain_state=domain,
        admissible=node_admissibility(domain, cfg.admissibility),
        transitions=transitions, frozen=tuple(frozen), baselines=new_base,
        job_uncommitted_s=frame.get("seamguard_job_uncommitted_seconds"),
        job_step_s=frame.get("seamguard_job_step_seconds"), job_steps_done=frame.get("seamguard_job_step"),
        unnamed=new_unnamed,
    )


def _unnamed(fleet: Fleet, frame: Frame, evid: dict[Kind, ev.Evidence], prev: dict[Kind, UnnamedState],
             learn, cfg: AssessConfig) -> dict[Kind, UnnamedState]:
    """Judge the series nobody named (assess/unnamed.py) into ``evid`` in place; their new state.
    Peers share a load: the same job at work, idle nodes together (baselines.node_at_work)."""
    out = dict(prev)
    if not frame.series:
        return out
    work = node_at_work(fleet, frame.get("DCGM_FI_DEV_GPU_UTIL"), cfg.baselines.busy_util_pct)
    n_jobs = len(fleet.job_names)
    load = np.where(work & (fleet.node_job >= 0), fleet.node_job, np.where(work, n_jobs + 1, n_jobs))
    for block in frame.series:
        if block.kind not in evid:
            continue
        host = host_of(block.kind, fleet)
        group = load[host] if host is not None else np.zeros(fleet.count(block.kind), dtype=np.int64)
        evid[block.kind], out[block.kind] = series_evidence(evid[block.kind], block, prev.get(block.kind), frame.t_s,
                                                            group, learn(block.kind), host, cfg.unnamed)
    return out


def node_cause(fleet: Fleet, kinds: dict[Kind, KindAssessment], node: int) -> tuple[str, float, tuple[Reason, ...]]:
    """The worst component of a node, its FAE and its reasons (prefixed with its name)."""
    best: tuple[float, str, float, tuple[Reason, ...]] = (-1.0, "", 0.0, ())
    for kind, owner in ((Kind.GPU, fleet.gpu_node), (Kind.NIC, fleet.nic_node)):
        ka = kinds[kind]
        idx = np.flatnonzero(owner == node)
        if idx.size == 0:
            continue
        j = int(idx[np.argmax(ka.gfs[idx])])
        if ka.gfs[j] > best[0]:
            name = fleet.names(kind)[j]
            reasons = tuple(Reason(f"{name}:{r.channel}", r.score, r.value, r.unit) for r in ka.reasons(j))
            best = (float(ka.gfs[j]), name, float(ka.fae[j]), reasons)
    return best[1], best[2], best[3]
