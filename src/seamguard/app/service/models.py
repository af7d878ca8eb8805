"""Typed response and request bodies of the HTTP API (they make /openapi.json useful).

Plain pydantic models, no logic: the renderers in `api.py` fill them from a Snapshot.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.assess.states import State
from seamguard.decide.policy import Mode
from seamguard.app.snapshot import ENTITY_KINDS

KindName = Enum("KindName", {k.label: k.label for k in ENTITY_KINDS}, type=str)  # type: ignore[misc]
KindName.__doc__ = "Entity kinds the API lists."
PinnableKind = Enum("PinnableKind", {k: k for k in ("cooling_loop", "rack", "gpu", "nic", "link", "storage")},
                    type=str)  # type: ignore[misc]
PinnableKind.__doc__ = "Entity kinds with a state machine, which an operator may pin."
StateName = Enum("StateName", {s.label: s.label for s in State}, type=str)  # type: ignore[misc]
StateName.__doc__ = "Entity states, least to most severe."
JobClassName = Enum("JobClassName", {c: c for c in ADMISSIBILITY_COLUMNS}, type=str)  # type: ignore[misc]
JobClassName.__doc__ = "Job classes (and the checkpoint/restore path) admissibility is judged for."


class DomainName(str, Enum):
    compute = "compute"
    fabric = "fabric"
    facilities = "facilities"
    storage = "storage"
    runtime = "runtime"


class SortKey(str, Enum):
    name = "name"
    gfs = "gfs"
    prs = "prs"
    fae = "fae"
    state = "state"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Breaker(_M):
    tripped: bool
    reason: str
    tripped_at_s: float | None
    enabled: bool = Field(description="false only when the policy switched it off explicitly")
    disrupted_nodes_in_window: int = Field(description="unique nodes newly restricted (drain, label, move) "
                                                       "within the window")
    window_s: float
    max_fleet_fraction: float = Field(description="rate: share of the fleet's nodes newly restricted per window")
    max_loop_fraction: float = Field(description="rate: share of one cooling loop's nodes per window")
    max_in_effect_fleet_fraction: float = Field(description="total: share of the fleet under any restriction")
    max_in_effect_loop_fraction: float
    max_in_effect_rack_fraction: float
    max_in_effect_leaf_fraction: float


class FrozenScopeOut(_M):
    scope: str = Field(description="'fleet', 'signal:<name>', 'cooling_loop:<name>' or 'rack:<name>'")
    reason: str
    since_t_s: float
    good_ticks: int = Field(description="consecutive good ticks since the data came back")
    rewarming: bool = Field(description="data is back; actions resume after the policy's rewarm_ticks")


class FailsafeEvent(_M):
    tick: int
    t_s: float
    wall_s: float
    event: str = Field(description="frozen, resumed, breaker_tripped, breaker_reset or breaker_disabled")
    scope: str
    detail: str
    by: str = Field(description="who (for a reset: the name of the operator's token)")


class Failsafe(_M):
    frozen: list[FrozenScopeOut] = Field(description="scopes where no new action is taken for want of data")
    events: list[FailsafeEvent] = Field(description="newest last")


class BreakerResetIn(_M):
    why: str = Field(min_length=1, max_length=500, pattern=r"\S",
                     description="why the breaker may act again (recorded; not only spaces)")


class TickTiming(_M):
    tick_s: float = Field(description="wall seconds of the last controller tick")
    assess_s: float
    decide_s: float
    act_s: float
    error: str = Field(description="why the last tick failed; empty when it did not")


class Pace(_M):
    """Whether the loop keeps the speed it was asked for (the dashboard's 'falling behind' banner)."""

    requested_speed: float = Field(description="simulated seconds per wall second asked for; 0 = manual ticking")
    achieved_speed: float | None = Field(description="simulated seconds per wall second over the last ticks "
                                                     "(null with manual ticking or fewer than 3 ticks)")
    window_ticks: int = Field(description="ticks the achieved speed is measured over")
    ticks_skipped: int = Field(description="grid ticks dropped since start because a tick ran past its slot")
    ticks_skipped_recent: int = Field(description="grid ticks dropped within the window")
    lag_s: float = Field(description="how far behind its wall-clock grid the loop was at the last tick")
    last_tick_age_s: float | None = Field(description="wall seconds since the last tick finished")
    behind: bool = Field(description="true when the loop is well below its requested speed, dropped ticks "
                                     "in the window, or has not ticked for several intervals")
    message: str = Field(description="one line saying what is wrong; empty when on pace")


class PinOut(_M):
    kind: str
    entity: str
    state: str
    note: str
    by: str
    since_wall_s: float


class Summary(_M):
    tick: int = Field(description="controller tick this snapshot was taken after (-1 before the first)")
    t_s: float = Field(description="controller time of the tick (simulated seconds for the twin)")
    wall_s: float
    source: str
    mode: Mode
    speed: float = Field(description="simulated seconds per wall second (twin); 0 = manual ticking")
    tick_interval_s: float
    sizes: dict[str, int] = Field(description="entity count per kind")
    states: dict[str, dict[str, int]] = Field(description="kind -> state -> count")
    domains: dict[str, dict[str, int]] = Field(description="domain (compute, fabric, facilities, storage, "
                                                           "runtime) -> state -> count")
    loops_not_healthy: int = Field(description="cooling loops with at least one non-healthy GPU or node")
    breaker: Breaker
    timing: TickTiming
    pins: int
    actions_in_effect: int
    useful_throughput: float | None = Field(description="useful work / ideal with control (twin only)")
    useful_throughput_without_control: float | None
    pace: Pace
    frozen_scopes: int = Field(0, description="scopes frozen for want of data (see /api/v1/failsafe)")


class EntityRow(_M):
    kind: str
    name: str
    state: str
    gfs: float = Field(description="gray-failure score in [0, 1]")
    prs: float = Field(description="propagation risk in [0, 1]")
    fae: float = Field(description="failure amplification: healthy GPU-hours per hour at risk")
    loop: str | None
    rack: str | None
    since_t_s: float = Field(description="when the entity entered its current state")
    pinned: bool


class EntityPage(_M):
    total: int
    limit: int
    offset: int
    items: list[EntityRow]


class ReasonOut(_M):
    channel: str
    score: float
    value: float | None
    unit: str


class TransitionOut(_M):
    tick: int
    t_s: float
    kind: str
    entity: str
    from_state: str
    to_state: str
    gfs: float
    prs: float
    fae: float
    reasons: list[ReasonOut]


class DecisionOut(_M):
    tick: int
    t_s: float
    key: str
    event: str = Field(description="decided, withdrawn or held_by_breaker")
    verb: str
    target: str
    reason: str
    cause: str
    evidence: list[ReasonOut]
    benefit_gpu_h_per_h: float | None
    cost_gpu_h_per_h: float | None
    criticality: float | None


class ActionOut(_M):
    tick: int
    t_s: float
    op: str = Field(description="apply or revert")
    key: str
    verb: str
    actuator: str
    status: str = Field(description="pending, done, failed, dry_run or interrupted")
    detail: str
    target: str
    reason: str
    cause: str


class ThresholdLine(_M):
    value: float
    label: str = Field(description="what crossing it means, e.g. 'degrade (GFS >= 0.5)'")


class SignalSeries(_M):
    name: str
    unit: str
    help: str
    t_s: list[float]
    values: list[float | None]
    peers: str = Field("", description="who the peer band is made of (empty when there is no band)")
    peer_p10: list[float | None] = Field(default_factory=list, description="10th percentile of the peers per point")
    peer_p50: list[float | None] = Field(default_factory=list, description="median of the peers per point")
    peer_p90: list[float | None] = Field(default_factory=list, description="90th percentile of the peers per point")
    thresholds: list[ThresholdLine] = Field(default_factory=list, description="levels the assessment acts on")


class ScoreThresholds(_M):
    degrade_enter: float = Field(description="GFS at or above which degradation starts counting")
    degrade_exit: float = Field(description="GFS below which recovery starts counting")
    quarantine_enter: float = Field(description="GFS at or above which quarantine starts counting")
    harmful_prs: float = Field(description="PRS at or above which a quarantine-level entity is harmful")
    prs_scale_gpus: float = Field(description="dependent GPUs at which PRS reaches 1 - 1/e")


class ChildCount(_M):
    kind: str
    states: dict[str, int]


class EntityDetail(_M):
    entity: EntityRow
    parents: dict[str, str] = Field(description="containing entities: cooling_loop, rack, node, job")
    children: list[ChildCount]
    evidence: list[ReasonOut] = Field(description="current evidence behind the score, strongest first")
    why: str = Field(description="one-line reason for the current state")
    entered_by: TransitionOut | None = Field(description="the transition that put it in its current state")
    history: list[TransitionOut] = Field(description="state history, newest first")
    signals: list[SignalSeries]
    gfs_series: SignalSeries = Field(description="the entity's GFS over the same ticks, with its state thresholds")
    thresholds: ScoreThresholds
    decisions: list[DecisionOut]
    actions: list[ActionOut]
    pin: PinOut | None
    since_t_s: float | None = Field(None, description="the range asked for (controller seconds); null = open")
    until_t_s: float | None = Field(None, description="the range asked for (controller seconds); null = open")
    state_at_since: str = Field("healthy", description="its state as the range (or its oldest signal point) opens, "
                                                       "from the ledger")
    persisted: Persisted | None = Field(None, description="where the signal and GFS points older than the signal "
                                                          "ring's came from (null: no range); the peer band is "
                                                          "the ring's only")


class AdmissibleNodes(_M):
    job_class: str
    admissible: int
    total_nodes: int
    limit: int
    offset: int
    nodes: list[str]


class AdmissibilitySummary(_M):
    total_nodes: int
    admissible: dict[str, int] = Field(description="job class -> admissible node count")


class JobOut(_M):
    name: str
    job_class: str
    criticality: float
    gpus: int
    nodes: int
    state: str = Field(description="worst state of the nodes it runs on")
    exposure: dict[str, int] = Field(description="its nodes per state")
    exposed_to: list[str] = Field(description="non-healthy nodes it runs on (first 20)")
    fae: float
    useful_throughput: float | None = Field(description="useful work / ideal, with control (twin only)")
    useful_throughput_without_control: float | None


class ThroughputPointOut(_M):
    t_s: float
    with_control: float
    without_control: float | None


class Throughput(_M):
    source: str
    useful_with_control: float | None
    useful_without_control: float | None
    gpu_hours_with_control: float | None
    gpu_hours_without_control: float | None
    gpu_hours_saved: float | None = Field(description="useful GPU-hours gained by control so far")
    job_failures_with_control: int | None
    job_failures_without_control: int | None
    fae_in_effect_gpu_h_per_h: float = Field(description="FAE summed over non-healthy GPUs, NICs, links, "
                                                         "storage and loops now")
    fae_contained_gpu_h_per_h: float = Field(description="FAE of entities whose nodes/paths seamguard took "
                                                         "out of the critical path (failure amplification avoided)")
    series: list[ThroughputPointOut]


class TimelineEvent(_M):
    t_s: float
    tick: int
    type: str = Field(description="transition or action")
    entity: str
    kind: str
    text: str
    state: str | None
    status: str | None


class MapLoop(_M):
    name: str
    index: int
    gpu_states: dict[str, int]
    node_states: dict[str, int]
    worst: str


class MapRack(_M):
    name: str
    nodes: list[str]
    node_states: str = Field(description="one digit per node: its state code")
    gpu_states: list[str] = Field(description="per node, one digit per GPU: state codes")
    gpu_names: list[list[str]]


class MapDetail(_M):
    loop: str
    state: str
    racks: list[MapRack]


class MapFabric(_M):
    kind: str
    total: int
    states: dict[str, int]
    codes: str | None = Field(description="one digit per entity when the kind is small enough to draw")
    not_healthy: list[EntityRow]


class FleetMap(_M):
    tick: int
    failed_nodes: list[EntityRow] = Field(description="failed nodes, fleet-wide (first 50)")
    state_codes: list[str] = Field(description="state name per digit used in the code strings")
    aggregated: bool = Field(description="true when only loop summaries are sent (large fleets)")
    loops: list[MapLoop]
    detail: list[MapDetail]
    fabric: list[MapFabric]
    storage: list[EntityRow]


class StateCountSeries(_M):
    kind: str
    counts: dict[str, list[int]] = Field(description="state -> count per point")


class Band(_M):
    p10: list[float | None]
    p50: list[float | None]
    p90: list[float | None]


class LoopCoolant(_M):
    name: str
    state: str = Field(description="state now")
    rated_flow_lpm: float
    flow_lpm: list[float | None]
    supply_c: list[float | None]
    return_c: list[float | None]
    states: str = Field(description="one digit per point: the loop's state code then")


class Persisted(_M):
    """Where a series' older points came from: the ledger's persisted rows (ledger/series.py),
    read for the part of a range before what the controller holds in memory (after a restart,
    or a range longer than its last ticks)."""

    until_t_s: float | None = Field(description="points before this time are the ledger's; null: none are")
    resolution_s: float | None = Field(description="the ledger rows read: 0 = one per tick, 60 or 900 = rolled up "
                                                   "per minute / 15 minutes (states and scores: the worst in it, "
                                                   "counts: the last, values: the mean)")
    rule: str = Field(description="what the ledger keeps of this series, and for how long")


class FleetHistory(_M):
    t_s: list[float] = Field(description="controller time of each point, oldest first: one per tick, or, when a "
                                         "range holds more than `points`, the last tick of each of `points` "
                                         "equal spans (values rolled up as in `persisted.resolution_s`)")
    wall_s: list[float | None] = Field(description="wall clock when each point's tick finished")
    state_codes: list[str] = Field(description="state name per digit used in the code strings")
    states: list[StateCountSeries] = Field(description="GPUs and nodes per state over time")
    loops_total: int
    loops: list[LoopCoolant] = Field(description="every loop when there are few; otherwise the loops not healthy "
                                                 "in the window (worst first) and the one asked for")
    flow_ratio_band: Band = Field(description="coolant flow / rated across all loops")
    supply_c_band: Band = Field(description="coolant supply temperature across all loops")
    flow_ratio_concern: float = Field(description="flow / rated below which loop evidence starts")
    flow_ratio_saturation: float = Field(description="flow / rated at which loop evidence saturates")
    held_since_t_s: float | None = Field(None, description="the oldest tick the controller still holds in memory; "
                                                           "a range starting before it reads the ledger's "
                                                           "persisted rows for the older part")
    useful_with: list[float | None] = Field(default_factory=list, description="useful throughput with control per "
                                                                             "point (share of ideal); null: none "
                                                                             "reported")
    useful_without: list[float | None] = Field(default_factory=list, description="the same without control (the "
                                                                                "counterfactual twin)")
    persisted: Persisted | None = Field(None, description="where the older points came from (null: no range)")


class StateHistory(_M):
    """Entities of one kind per state over a range, replayed from the ledger's transitions."""

    kind: str
    since_t_s: float = Field(description="the range asked for (controller seconds)")
    until_t_s: float = Field(description="its end, never past the snapshot's time")
    t_s: list[float] = Field(description="evenly spaced sample times, oldest first")
    counts: dict[str, list[int]] = Field(description="state -> entities in it at each sample time")
    complete_since_t_s: float | None = Field(description="samples start here: the later of the range's start and "
                                                         "the ledger's first tick (or where a capped read stopped)")
    moves: int = Field(description="grouped transition rows replayed")


class ModeIn(_M):
    mode: Mode


class PinIn(_M):
    state: StateName  # type: ignore[valid-type]
    note: str = Field(min_length=1, max_length=500, pattern=r"\S",
                      description="why the operator pinned it (recorded; not only spaces)")


class Health(_M):
    status: str
    tick: int
    controller_running: bool
    snapshot_age_s: float
    error: str = ""  # why the controller loop died, when it did


class Problem(_M):
    detail: str
