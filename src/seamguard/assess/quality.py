"""Data quality and the freeze: degrade to doing less, never more, when inputs fail.

Pure functions over a Frame. A *scope* is the fleet, one signal (``signal:<name>``),
or one domain (``cooling_loop:<name>``, ``rack:<name>``). A scope is *bad* this tick when
too much of its input is missing or its source flagged the signal as failed; a bad
scope freezes: its entities' states are held where they were (missing data neither
raises nor clears a state) and no new action is taken on them, while the actions in
effect stay. It thaws after ``rewarm_ticks`` consecutive good ticks.

The absence of one node while its peers report is not a bad scope: it stays evidence
(the ``missing`` channel), as the bounds are on shares of a scope. A node whose exporter
serves stale values (its gauges stop moving while its peers' move) is one
(``stale:<kind>:<node>``): a telemetry fault of that node, never a hardware verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame
from seamguard.observe.history import History
from seamguard.observe.signals import REGISTRY, Domain

# Signals whose absence is itself read as evidence (the ``missing`` channel): they are
# judged even before they were ever seen (a controller started during an outage).
PRESENCE_SIGNALS = ("DCGM_FI_DEV_GPU_TEMP", "node_infiniband_state_id", "seamguard_coolant_flow_lpm")
_FAILED_FLAGS = ("retryable", "permanent")


class FailsafeConfig(BaseModel):
    """The `failsafe:` section of a policy: when missing data freezes new actions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_signal_missing_fraction: float = Field(0.5, gt=0, lt=1, strict=True, allow_inf_nan=False,
                                               description="a signal missing for more than this share is out")
    max_domain_missing_fraction: float = Field(0.5, gt=0, lt=1, strict=True, allow_inf_nan=False,
                                               description="a loop/rack with more than this share of nodes dark")
    max_fleet_missing_fraction: float = Field(0.2, gt=0, lt=1, strict=True, allow_inf_nan=False,
                                              description="the fleet with more than this share of nodes dark")
    rewarm_ticks: int = Field(6, ge=1, strict=True, description="good ticks before a frozen scope acts again")
    stale_ticks: int = Field(2, ge=1, strict=True, description="scrapes in a row in which every gauge of an "
                             "entity repeats its value exactly, while its peers' move, before its exporter is "
                             "read as serving stale values")
    stale_peer_share: float = Field(0.5, gt=0, le=1, strict=True, allow_inf_nan=False,
                                    description="share of the kind's reporting entities whose gauges must move "
                                                "over the same scrapes for a still one to be stale")


@dataclass(frozen=True)
class FrozenScope:
    """One frozen scope: why, since when, and whether its data is back (re-warming)."""

    scope: str
    reason: str
    since_t_s: float
    good_ticks: int = 0  # consecutive good ticks since the data came back

    @property
    def rewarming(self) -> bool:
        return self.good_ticks > 0

    def to_json(self) -> list:
        return [self.scope, self.reason, self.since_t_s, self.good_ticks]


@dataclass(frozen=True)
class FreezeState:
    """What the freeze carries from tick to tick (persisted with the breaker)."""

    scopes: tuple[FrozenScope, ...] = ()
    seen: tuple[str, ...] = ()  # signals reported at least once (only those, and presence signals, are judged)

    def frozen_scopes(self) -> tuple[FrozenScope, ...]:
        return self.scopes

    @property
    def frozen(self) -> bool:
        return bool(self.scopes)

    def to_json(self) -> dict:
        return {"scopes": [s.to_json() for s in self.scopes], "seen": list(self.seen)}

    @classmethod
    def from_json(cls, d: dict | None) -> FreezeState:
        if not d:
            return cls()
        return cls(tuple(FrozenScope(str(s), str(r), float(t), int(g)) for s, r, t, g in d.get("scopes", [])),
                   tuple(str(x) for x in d.get("seen", [])))


def _flagged(flags: tuple[str, ...]) -> dict[str, str]:
    """Signals a source says it failed to read this tick: ``<source>:<signal>:<kind>: detail``."""
    out: dict[str, str] = {}
    for fl in flags:
        parts = fl.split(":", 3)
        if len(parts) >= 3 and parts[1] in REGISTRY and parts[2].strip() in _FAILED_FLAGS:
            out.setdefault(parts[1], fl)
    return out


NODE_KINDS = (Kind.GPU, Kind.NIC, Kind.LINK)  # the kinds whose series a node's own exporters produce


def dark_nodes(fleet: Fleet, frame: Frame, expected: set[str] | tuple[str, ...]) -> np.ndarray:
    """Nodes none of whose expected series reports this tick (bool per node). Pure.

    ``expected`` names the signals judged this tick (seen so far, presence signals, flagged
    ones); those of a per-GPU, per-NIC or per-NIC-link kind are a node's. A node is dark when
    it has at least one such entity and every value of every such signal on it is missing:
    a node without GPU telemetry (no NVML, no dcgm-exporter) whose agent still reports its
    NICs, its fabric links or its GPUs' kernel-log XIDs is not dark, and a node whose GPUs
    stopped reporting while its NICs still do has failed GPUs, not failed telemetry.
    """
    n = fleet.count(Kind.NODE)
    edge = fleet.link_nic >= 0
    link_node = np.full(fleet.link_nic.shape[0], -1, dtype=np.int64)
    link_node[edge] = fleet.nic_node[fleet.link_nic[edge]]
    owner = {Kind.GPU: fleet.gpu_node, Kind.NIC: fleet.nic_node, Kind.LINK: link_node}
    have = np.zeros(n)
    reporting = np.zeros(n)
    for name in sorted(expected):
        sig = REGISTRY.get(name)
        if sig is None or sig.kind not in owner:
            continue
        arr, own = frame.get(name), owner[sig.kind]
        if arr.size != own.size:
            continue
        mine = own >= 0
        have += np.bincount(own[mine], minlength=n)
        reporting += np.bincount(own[mine], weights=~np.isnan(arr[mine]), minlength=n)
    return (have > 0) & (reporting == 0)


STALE_KINDS = {Kind.GPU: "gpu_node", Kind.NIC: "nic_node"}  # kinds a node's exporters report, their node


def stale_entities(frame: Frame, hist: History, kind: Kind, cfg: FailsafeConfig) -> np.ndarray:
    """Entities of ``kind`` whose exporter serves stale values (bool per entity). Pure.

    A live gauge (a die temperature, a board's power draw, a utilisation) is a measurement and
    moves from scrape to scrape; an exporter that lost its source (a hung DCGM host engine, a
    stuck collector) serves its last scrape again. An entity is stale when, over the last
    ``stale_ticks`` scrapes, none of its gauges changed by as little as one unit in the last
    place while at least ``stale_peer_share`` of the kind's reporting entities saw one of
    theirs change: a quiet fleet (every gauge flat, a simulator, integer sensors at idle)
    gives no verdict. Counters are not read (a counter that stands still is normal), nor the
    runtime's gauges (a step time changes when a step ends, and a paused job ends none).
    """
    k = cfg.stale_ticks
    names = [n for n, sig in REGISTRY.items() if sig.kind == kind and not sig.counter
             and sig.domain != Domain.RUNTIME and n in frame.values]
    n_ent = frame.sizes.get(kind.label, 0) if not names else frame.values[names[0]].shape[0]
    out = np.zeros(n_ent, dtype=bool)
    # Judged per exporter (the metric's namespace: DCGM_, node_, seamguard_): one exporter of an
    # entity can hang while another (the runtime's step timings) still reports.
    for exporter in sorted({_exporter(n) for n in names}):
        moved = np.zeros(n_ent, dtype=bool)
        still = np.zeros(n_ent, dtype=bool)
        for name in (n for n in names if _exporter(n) == exporter):
            rows = hist.rows(name, k)
            if rows is None or len(rows) < k:
                continue
            seq = [*rows, frame.values[name]]
            have = np.isfinite(seq[-1])  # a gap before it compares unequal: no repeat across a gap
            same = np.logical_and.reduce([a == b for a, b in zip(seq[:-1], seq[1:])])
            moved |= have & ~same
            still |= have & same
        still &= ~moved
        reporting = moved | still
        if reporting.any() and moved.sum() >= cfg.stale_peer_share * reporting.sum():
            out |= still
    return out


def _whole_nodes(stale: np.ndarray, owner: np.ndarray, n_nodes: int) -> np.ndarray:
    """Stale entities on nodes where every entity of the kind is stale: an exporter serves a
    node, so a hung one stops them all; one still entity among moving ones is no exporter's."""
    per_node = np.bincount(owner[stale], minlength=n_nodes)
    size = np.bincount(owner, minlength=n_nodes)
    return stale & (per_node == size)[owner]


def _exporter(name: str) -> str:
    return name.split("_", 1)[0]


def stale_scopes(fleet: Fleet, frame: Frame, hist: History, cfg: FailsafeConfig) -> dict[str, str]:
    """``stale:<kind>:<node>`` -> reason, for every node with entities whose exporter is stale. Pure.

    A telemetry fault, not a hardware one: the scope freezes those entities (no verdict rests
    on values that stopped being measurements) and names the exporter's node."""
    out: dict[str, str] = {}
    for kind, owner_attr in STALE_KINDS.items():
        stale = stale_entities(frame, hist, kind, cfg)
        if not stale.any():
            continue
        owner = getattr(fleet, owner_attr)
        stale = _whole_nodes(stale, owner, fleet.count(Kind.NODE))
        per_node = np.bincount(owner[stale], minlength=fleet.count(Kind.NODE))
        size = np.bincount(owner, minlength=fleet.count(Kind.NODE))
        for i in np.flatnonzero(per_node).tolist():
            out[f"stale:{kind.label}:{fleet.node_names[i]}"] = (
                f"all {size[i]} {kind.label}s on {fleet.node_names[i]} repeat every gauge for "
                f"{cfg.stale_ticks} scrape(s) of one exporter while their peers' move: it serves stale values")
    return out


def mask_stale(fleet: Fleet, frame: Frame, scopes: tuple[FrozenScope, ...] | list[FrozenScope]) -> Frame:
    """The frame with the values of entities in (non-rewarming) stale scopes as missing. Pure.

    What a stale exporter serves is not a measurement: nothing downstream (a node's load class,
    a peer median, a baseline) may read it as one."""
    masks = {k: v for k, v in scope_masks(fleet, [s for s in scopes if s.scope.startswith("stale:")
                                                 and not s.rewarming]).items() if v.any()}
    if not masks:
        return frame
    values = dict(frame.values)
    for name, arr in frame.values.items():
        sig = REGISTRY.get(name)
        m = masks.get(sig.kind) if sig is not None else None
        if m is not None and m.shape == arr.shape:
            values[name] = np.where(m, np.nan, arr)
    return replace(frame, values=values)


def bad_scopes(fleet: Fleet, frame: Frame, cfg: FailsafeConfig, seen: tuple[str, ...],
               hist: History | None = None) -> tuple[dict[str, str], tuple[str, ...]]:
    """(scope -> reason for every scope whose input failed this tick, signals seen so far). Pure.

    With ``hist`` (the frames before this one) a node whose exporter serves stale values is a
    scope too (``stale_scopes``)."""
    bad: dict[str, str] = {} if hist is None else stale_scopes(fleet, frame, hist, cfg)
    flagged = _flagged(frame.flags)
    now_seen = set(seen)
    judged = set(seen) | set(PRESENCE_SIGNALS) | set(flagged)
    for name in sorted(judged):
        sig = REGISTRY.get(name)
        if sig is None or sig.kind == Kind.JOB:
            continue
        arr = frame.get(name)
        if arr.size == 0:
            continue
        share = float(np.isnan(arr).mean())
        if share < 1.0:
            now_seen.add(name)
        if name in flagged:
            bad[f"signal:{name}"] = flagged[name]
        elif share > cfg.max_signal_missing_fraction and sig.coverage_judged:
            bad[f"signal:{name}"] = f"{name} missing for {share:.0%} of {arr.size} {sig.kind.label}s"
    # Dark nodes: none of the series expected of a node reports for it (see dark_nodes).
    n_nodes = fleet.count(Kind.NODE)
    if n_nodes:
        dark = dark_nodes(fleet, frame, judged)
        share = float(dark.mean())
        # Fleet-wide only when the darkness is spread: nodes that die together in one or two
        # cooling loops (a loop that lost its flow) freeze those loops, not the whole fleet.
        n_loops = fleet.count(Kind.COOLING_LOOP)
        spread = np.unique(fleet.node_loop[dark]).size > n_loops / 2
        if share > cfg.max_fleet_missing_fraction and spread:
            bad["fleet"] = (f"{int(dark.sum())} of {n_nodes} nodes in {np.unique(fleet.node_loop[dark]).size} of "
                            f"{n_loops} cooling loops report no telemetry ({share:.0%})")
        dark_loop = np.zeros(fleet.count(Kind.COOLING_LOOP), dtype=bool)
        for kind, owner in ((Kind.COOLING_LOOP, fleet.node_loop), (Kind.RACK, fleet.node_rack)):
            if "fleet" in bad:
                break  # the fleet scope covers every domain
            size = np.bincount(owner, minlength=fleet.count(kind))
            d = np.bincount(owner, weights=dark, minlength=fleet.count(kind))
            frac = np.where(size > 0, d / np.maximum(size, 1), 0.0)
            for i in np.flatnonzero(frac > cfg.max_domain_missing_fraction).tolist():
                if kind == Kind.COOLING_LOOP:
                    dark_loop[i] = True
                elif dark_loop[fleet.rack_loop[i]]:
                    continue  # its loop's scope covers it
                bad[f"{kind.label}:{fleet.names(kind)[i]}"] = (
                    f"{int(d[i])} of {int(size[i])} nodes report no telemetry ({frac[i]:.0%})")
    flow = frame.get("seamguard_coolant_flow_lpm")
    if flow.size and "signal:seamguard_coolant_flow_lpm" not in bad and "fleet" not in bad:
        for i in np.flatnonzero(np.isnan(flow)).tolist():
            bad.setdefault(f"cooling_loop:{fleet.loop_names[i]}", "the loop's flow sensor reports nothing")
    return bad, tuple(sorted(now_seen))


def step_freeze(prev: FreezeState, bad: dict[str, str], seen: tuple[str, ...], t_s: float,
                cfg: FailsafeConfig) -> tuple[FreezeState, list[tuple[str, str, str]]]:
    """The freeze after this tick, and its events (``frozen``/``resumed``, scope, detail). Pure."""
    events: list[tuple[str, str, str]] = []
    out: list[FrozenScope] = []
    known = {s.scope: s for s in prev.scopes}
    for s in prev.scopes:
        if s.scope in bad:
            out.append(replace(s, reason=bad[s.scope], good_ticks=0))
        elif s.good_ticks + 1 >= cfg.rewarm_ticks:
            events.append(("resumed", s.scope, f"data back for {cfg.rewarm_ticks} tick(s); frozen since "
                                               f"t={s.since_t_s:.0f}s ({s.reason})"))
        else:
            out.append(replace(s, good_ticks=s.good_ticks + 1))
    for scope, why in sorted(bad.items()):
        if scope not in known:
            out.append(FrozenScope(scope, why, t_s))
            events.append(("frozen", scope, why))
    return FreezeState(tuple(out), seen), events


def scope_masks(fleet: Fleet, scopes: tuple[FrozenScope, ...] | list[FrozenScope]) -> dict[Kind, np.ndarray]:
    """Entities each kind has inside the given scopes (bool per entity)."""
    kinds = (Kind.COOLING_LOOP, Kind.RACK, Kind.NODE, Kind.GPU, Kind.NIC, Kind.LINK, Kind.STORAGE)
    m = {k: np.zeros(fleet.count(k), dtype=bool) for k in kinds}
    edge = fleet.link_nic >= 0

    def nodes(sel: np.ndarray) -> None:
        m[Kind.NODE] |= sel
        m[Kind.GPU] |= sel[fleet.gpu_node]
        m[Kind.NIC] |= sel[fleet.nic_node]
        m[Kind.LINK][edge] |= sel[fleet.nic_node[fleet.link_nic[edge]]]

    for s in scopes:
        head, _, name = s.scope.partition(":")
        if head == "fleet":
            for k in kinds:
                m[k][:] = True
        elif head == "signal":
            sig = REGISTRY.get(name)
            if sig is None:
                continue
            k = sig.kind
            if k in (Kind.GPU, Kind.NIC):
                nodes(np.ones(fleet.count(Kind.NODE), dtype=bool))
            elif k in m:
                m[k][:] = True
        elif head == "stale":
            label, _, node = name.partition(":")
            kind = next((k for k in STALE_KINDS if k.label == label), None)
            try:
                i = fleet.index_of(Kind.NODE, node) if kind is not None else -1
            except KeyError:
                continue
            if kind is not None:
                m[kind] |= getattr(fleet, STALE_KINDS[kind]) == i
        elif head in (Kind.COOLING_LOOP.label, Kind.RACK.label):
            kind = Kind.COOLING_LOOP if head == Kind.COOLING_LOOP.label else Kind.RACK
            try:
                i = fleet.index_of(kind, name)
            except KeyError:
                continue
            m[kind][i] = True
            if kind == Kind.COOLING_LOOP:
                m[Kind.RACK] |= fleet.rack_loop == i
                nodes(fleet.node_loop == i)
            else:
                nodes(fleet.node_rack == i)
    return m


@dataclass(frozen=True, eq=False)
class FreezeView:
    """What decide needs of the freeze: the scopes, and the entities that take no new action."""

    scopes: tuple[FrozenScope, ...]
    no_action: dict[Kind, np.ndarray]

    def frozen(self, kind: Kind, i: int) -> bool:
        m = self.no_action.get(kind)
        return bool(m is not None and 0 <= i < m.size and m[i])
