"""Pure renderers: Snapshot (+ ledger rows) -> API models. No I/O of their own.

Each function reads one snapshot and builds only what the response carries: filters are
numpy masks over the per-kind arrays, pages are slices of the matching indices, so the
cost of a request does not grow with the fleet beyond one vectorized pass.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.assess.overrides import Pin
from seamguard.assess.states import STATE_BY_LABEL, State
from seamguard.decide.actions import ActionKey, Verb
from seamguard.fleet.model import JobClass, Kind
from seamguard.observe.signals import signals_for
from seamguard.ledger.series import decode_fleet
from seamguard.app.service import models as m
from seamguard.app.service import persisted
from seamguard.app.service.timerange import ALL, TimeRange
from seamguard.app.signal_ring import score_row
from seamguard.app.snapshot import ENTITY_KINDS, KIND_DOMAIN, Snapshot

STATE_LABELS = [s.label for s in State]
_SORTABLE = {"gfs", "prs", "fae", "state"}


def _f(x: float) -> float:
    x = float(x)
    return 0.0 if x != x else round(x, 4)


def breaker(s: Snapshot, policy_breaker) -> m.Breaker:
    b = s.breaker
    c = policy_breaker
    return m.Breaker(tripped=b.tripped, reason=b.reason, tripped_at_s=b.tripped_at_s, enabled=c.enabled,
                     disrupted_nodes_in_window=len({n for _, n in b.drained}),
                     window_s=c.window_s, max_fleet_fraction=c.max_fleet_fraction,
                     max_loop_fraction=c.max_loop_fraction,
                     max_in_effect_fleet_fraction=c.max_in_effect_fleet_fraction,
                     max_in_effect_loop_fraction=c.max_in_effect_loop_fraction,
                     max_in_effect_rack_fraction=c.max_in_effect_rack_fraction,
                     max_in_effect_leaf_fraction=c.max_in_effect_leaf_fraction)


def failsafe(s: Snapshot, reader, limit: int) -> m.Failsafe:
    # +1: an operator event (a reset) is recorded against the tick that comes next
    events = reader.failsafe_events(upto_tick=s.tick + 1)[-limit:]
    return m.Failsafe(frozen=[m.FrozenScopeOut(scope=f.scope, reason=f.reason, since_t_s=f.since_t_s,
                                               good_ticks=f.good_ticks, rewarming=f.rewarming)
                              for f in s.failsafe],
                      events=[m.FailsafeEvent(**e) for e in events])


PACE_WINDOW = 12  # ticks the achieved speed is measured over
PACE_MIN_RATIO = 0.8  # achieved below this share of the requested speed is "behind"
STALL_INTERVALS = 5  # no tick for this many intervals is "behind" too


def pace(s: Snapshot, now: float | None = None) -> m.Pace:
    """Achieved vs requested speed over the last ticks, dropped grid ticks, stalls."""
    now = time.time() if now is None else now
    h = s.fleet_history[-PACE_WINDOW:]
    age = round(now - h[-1].wall_s, 3) if h else None
    achieved = None
    if s.speed > 0 and len(h) >= 3 and h[-1].wall_s > h[0].wall_s:
        achieved = round((h[-1].t_s - h[0].t_s) / (h[-1].wall_s - h[0].wall_s), 3)
    recent = (h[-1].ticks_skipped - h[0].ticks_skipped) if h else 0
    msg = ""
    if s.speed > 0:
        stall = max(STALL_INTERVALS * s.tick_interval_s, 2.0)
        if age is not None and age > stall:
            msg = f"no tick for {age:.0f} s (one is due every {s.tick_interval_s:.2g} s): the loop is stuck or slow"
        elif achieved is not None and achieved < PACE_MIN_RATIO * s.speed:
            msg = (f"running at {achieved:.3g}x instead of the requested {s.speed:g}x: a tick takes longer than "
                   f"its {s.tick_interval_s:.2g} s slot")
        elif recent > 0:
            msg = f"{recent} tick(s) skipped in the last {len(h)}: the loop fell behind its schedule"
        if msg and s.ticks_skipped:
            msg += f" ({s.ticks_skipped} grid ticks skipped since start)"
    return m.Pace(requested_speed=s.speed, achieved_speed=achieved, window_ticks=len(h),
                  ticks_skipped=s.ticks_skipped, ticks_skipped_recent=int(recent),
                  lag_s=round(s.schedule_lag_s, 3), last_tick_age_s=age, behind=bool(msg), message=msg)


def summary(s: Snapshot, policy_breaker, now: float | None = None) -> m.Summary:
    states = {k.label: s.kinds[k].counts() for k in ENTITY_KINDS}
    domains: dict[str, dict[str, int]] = {}
    for k in ENTITY_KINDS:
        d = domains.setdefault(KIND_DOMAIN[k], dict.fromkeys(STATE_LABELS, 0))
        for st, n in states[k.label].items():
            d[st] += n
    bad_loops = int(((s.loop_counts[Kind.GPU][:, 1:].sum(axis=1) + s.loop_counts[Kind.NODE][:, 1:].sum(axis=1)) > 0).sum())
    p = s.progress
    return m.Summary(
        tick=s.tick, t_s=s.t_s, wall_s=s.wall_s, source=s.source, mode=m.Mode(s.mode), speed=s.speed,
        tick_interval_s=s.tick_interval_s, sizes={k.label: s.fleet.count(k) for k in Kind}, states=states,
        domains=domains, loops_not_healthy=bad_loops, breaker=breaker(s, policy_breaker),
        timing=m.TickTiming(tick_s=s.tick_s, assess_s=s.assess_s, decide_s=s.decide_s, act_s=s.act_s,
                            error=s.tick_error),
        pins=len(s.pins), actions_in_effect=len(s.in_effect),
        useful_throughput=None if p is None else round(p.useful_with, 5),
        useful_throughput_without_control=None if p is None or p.useful_without is None else round(p.useful_without, 5),
        pace=pace(s, now), frozen_scopes=len(s.failsafe))


def _pinned_mask(s: Snapshot, kind: Kind) -> np.ndarray:
    mask = np.zeros(s.fleet.count(kind), dtype=bool)
    for p in s.pins:
        if p.kind == kind:
            mask[p.index] = True
    return mask


def entity_row(s: Snapshot, kind: Kind, i: int, pinned: bool | None = None) -> m.EntityRow:
    v = s.kinds[kind]
    lp, rk = int(v.loop[i]), int(v.rack[i])
    if pinned is None:
        pinned = any(p.kind == kind and p.index == i for p in s.pins)
    return m.EntityRow(kind=kind.label, name=v.names[i], state=STATE_LABELS[int(v.state[i])], gfs=_f(v.gfs[i]),
                       prs=_f(v.prs[i]), fae=_f(v.fae[i]),
                       loop=s.fleet.loop_names[lp] if lp >= 0 else None,
                       rack=s.fleet.rack_names[rk] if rk >= 0 else None,
                       since_t_s=float(v.entered_t_s[i]), pinned=pinned)


def select(s: Snapshot, kind: Kind, states: list[str] | None = None, loop: str | None = None,
           rack: str | None = None, min_gfs: float | None = None, sort: str = "name") -> np.ndarray:
    """Indices of matching entities, in the requested order. Raises KeyError on unknown loop/rack."""
    v = s.kinds[kind]
    mask = np.ones(v.count, dtype=bool)
    if states:
        mask &= np.isin(v.state, [STATE_BY_LABEL[x] for x in states])
    if loop is not None:
        mask &= v.loop == s.fleet.index_of(Kind.COOLING_LOOP, loop)
    if rack is not None:
        mask &= v.rack == s.fleet.index_of(Kind.RACK, rack)
    if min_gfs is not None:
        mask &= np.nan_to_num(v.gfs) >= min_gfs
    idx = np.flatnonzero(mask)
    if sort in _SORTABLE and idx.size:
        key = getattr(v, sort)[idx]
        # Worst first; ties keep name (index) order.
        idx = idx[np.argsort(-np.nan_to_num(key.astype(float)), kind="stable")]
    return idx


def entities(s: Snapshot, kind: Kind, limit: int, offset: int, **filters) -> m.EntityPage:
    idx = select(s, kind, **filters)
    page = idx[offset:offset + limit]
    pinned = _pinned_mask(s, kind)
    return m.EntityPage(total=int(idx.size), limit=limit, offset=offset,
                        items=[entity_row(s, kind, int(i), bool(pinned[i])) for i in page])


def reasons_out(reasons) -> list[m.ReasonOut]:
    return [m.ReasonOut(channel=r.channel, score=_f(r.score), value=None if r.value != r.value else float(r.value),
                        unit=r.unit) for r in reasons]


def why(row: m.EntityRow, evidence: list[m.ReasonOut], entered_by: dict | None, pin: Pin | None) -> str:
    if pin is not None:
        return f"pinned {pin.state.label} by {pin.by}: {pin.note}"
    if row.state == "healthy":
        if evidence:
            top = evidence[0]
            return f"healthy; strongest evidence {top.channel} (score {top.score:.2f}) is below the degrade threshold"
        return "healthy: no evidence above the noise floor"
    src = entered_by["reasons"] if entered_by and entered_by.get("reasons") else [e.model_dump() for e in evidence]
    parts = [f"{r['channel']}={_fmt(r['value'])}{(' ' + r['unit']) if r['unit'] else ''} (score {r['score']:.2f})"
             for r in src[:3]]
    if entered_by:
        head = f"{row.state} since t={entered_by['t_s']:.0f}s; evidence at that transition: "
    else:
        head = f"{row.state}; evidence now: "
    return head + (", ".join(parts) if parts else "none recorded")


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g}"


def parents(s: Snapshot, kind: Kind, i: int) -> dict[str, str]:
    f = s.fleet
    out: dict[str, str] = {}
    node = None
    if kind == Kind.GPU:
        node = int(f.gpu_node[i])
    elif kind == Kind.NIC:
        node = int(f.nic_node[i])
    elif kind == Kind.LINK and f.link_nic[i] >= 0:
        node = int(f.nic_node[f.link_nic[i]])
        out["nic"] = f.nic_names[int(f.link_nic[i])]
    elif kind == Kind.NODE:
        node = i
    if kind == Kind.LINK:
        out["leaf"] = f.switch_names[int(f.link_leaf[i])]
        if f.link_spine[i] >= 0:
            out["spine"] = f.switch_names[int(f.link_spine[i])]
    if node is not None:
        if kind != Kind.NODE:
            out["node"] = f.node_names[node]
        j = int(f.node_job[node])
        if j >= 0:
            out["job"] = f.job_names[j]
        out["storage"] = f.storage_names[int(f.node_storage[node])]
    v = s.kinds[kind]
    if v.rack[i] >= 0 and kind != Kind.RACK:
        out["rack"] = f.rack_names[int(v.rack[i])]
    if v.loop[i] >= 0 and kind != Kind.COOLING_LOOP:
        out["cooling_loop"] = f.loop_names[int(v.loop[i])]
    return out


def _counts(states: np.ndarray) -> dict[str, int]:
    c = np.bincount(states.astype(np.int64), minlength=len(State))
    return {STATE_LABELS[j]: int(c[j]) for j in range(len(State))}


def children(s: Snapshot, kind: Kind, i: int) -> list[m.ChildCount]:
    f = s.fleet
    out = []
    g, nd = s.kinds[Kind.GPU], s.kinds[Kind.NODE]
    if kind == Kind.COOLING_LOOP:
        out.append(m.ChildCount(kind="rack", states=_counts(s.kinds[Kind.RACK].state[f.rack_loop == i])))
        out.append(m.ChildCount(kind="node", states=_counts(nd.state[nd.loop == i])))
        out.append(m.ChildCount(kind="gpu", states=_counts(g.state[g.loop == i])))
    elif kind == Kind.RACK:
        out.append(m.ChildCount(kind="node", states=_counts(nd.state[nd.rack == i])))
        out.append(m.ChildCount(kind="gpu", states=_counts(g.state[g.rack == i])))
    elif kind == Kind.NODE:
        out.append(m.ChildCount(kind="gpu", states=_counts(g.state[f.gpu_node == i])))
        out.append(m.ChildCount(kind="nic", states=_counts(s.kinds[Kind.NIC].state[f.nic_node == i])))
    elif kind == Kind.STORAGE:
        out.append(m.ChildCount(kind="node", states=_counts(nd.state[f.node_storage == i])))
    elif kind == Kind.JOB:
        out.append(m.ChildCount(kind="node", states=_counts(nd.state[f.node_job == i])))
    return out


PEERS_MAX = 2048  # peers a band is computed over (strided beyond)


_PLURAL = {Kind.GPU: "GPUs", Kind.NIC: "NICs", Kind.NODE: "nodes", Kind.RACK: "racks", Kind.LINK: "links",
           Kind.COOLING_LOOP: "cooling loops", Kind.STORAGE: "storage paths", Kind.JOB: "jobs"}


def peers(s: Snapshot, kind: Kind, i: int) -> tuple[np.ndarray, str]:
    """The entities an entity is compared with in the dashboard's peer band."""
    f, v = s.fleet, s.kinds[kind]
    n = v.count
    if kind == Kind.LINK:
        idx, who = np.flatnonzero(f.link_leaf == f.link_leaf[i]), f"links on leaf {f.switch_names[int(f.link_leaf[i])]}"
    elif kind in (Kind.GPU, Kind.NIC, Kind.NODE, Kind.RACK) and v.loop[i] >= 0:
        idx, who = np.flatnonzero(v.loop == v.loop[i]), f"other {_PLURAL[kind]} on {f.loop_names[int(v.loop[i])]}"
    else:
        idx, who = np.arange(n), f"the other {_PLURAL.get(kind, kind.label)}"
    idx = idx[idx != i]
    if idx.size > PEERS_MAX:
        idx = idx[:: -(-idx.size // PEERS_MAX)]
    return idx, f"{who} ({idx.size}), 10th–90th percentile"


def _opt(a: np.ndarray, digits: int = 4) -> list[float | None]:
    return [None if x != x else round(float(x), digits) for x in a]


def _series(s: Snapshot, ring, name: str, unit: str, help_: str, i: int, peer_idx: np.ndarray, who: str,
            last: int | None, thresholds: list[m.ThresholdLine], rng: TimeRange = ALL,
            older: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, how: str = "mean") -> m.SignalSeries:
    """One signal of one entity with its peers' band: the last ``last`` ticks, or, given a
    range, the ring's ticks inside it after the ledger's ``older`` points (times, values, ticks
    per point), rolled up (``how``: mean, or max for a score) to at most ``last`` points."""
    t, vals = ring.series(name, i, s.ring_upto, last if rng == ALL else None)
    keep = list(range(len(t))) if rng == ALL else [k for k, x in enumerate(t) if rng.holds(x)]
    band: dict = {}
    cols = {"values": np.array([np.nan if vals[k] is None else vals[k] for k in keep], dtype=np.float64)}
    if peer_idx.size >= 3 and keep:
        _, mat = ring.matrix(name, peer_idx, s.ring_upto, len(t))
        if mat.size:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN points stay NaN
                cols.update(zip(("peer_p10", "peer_p50", "peer_p90"), np.nanpercentile(mat[keep], [10, 50, 90], axis=1)))
            band = dict(peers=who)
    times = np.array([t[k] for k in keep], dtype=np.float64)
    n = np.ones(times.size)
    if rng != ALL:
        if older is not None and older[0].size:
            times, n = np.r_[older[0], times], np.r_[older[2], n]
            cols = {k: np.r_[older[1] if k == "values" else np.full(older[0].size, np.nan), v] for k, v in cols.items()}
        times, cols = persisted.thin_series(times, cols, {"values": how}, n, last or persisted.RANGE_POINTS_MAX)
    band.update({k: _opt(v) for k, v in cols.items() if k != "values"})
    return m.SignalSeries(name=name, unit=unit, help=help_, t_s=times.tolist(), values=_opt(cols["values"]),
                          thresholds=thresholds, **band)


def signal_thresholds(s: Snapshot, kind: Kind, i: int, name: str, ev_cfg) -> list[m.ThresholdLine]:
    """Absolute levels the evidence acts on, where a raw signal has them."""
    if ev_cfg is None:
        return []
    if name == "seamguard_coolant_flow_lpm":
        rated = float(s.fleet.loop_rated_flow_lpm[i])
        hi, lo = ev_cfg.flow_ratio
        return [m.ThresholdLine(value=round(rated * hi, 2), label=f"evidence starts ({hi:.0%} of rated)"),
                m.ThresholdLine(value=round(rated * lo, 2), label=f"evidence saturates ({lo:.0%} of rated)")]
    if name == "seamguard_storage_write_latency_ms":
        lo, hi = (float(s.fleet.storage_budget[i]) * r for r in ev_cfg.storage_budget_ratio)
        return [m.ThresholdLine(value=lo, label="evidence starts (the path's budget)"),
                m.ThresholdLine(value=hi, label="evidence saturates")]
    return []


def signals(s: Snapshot, ring, kind: Kind, i: int, last: int | None = None, ev_cfg=None,
            rng: TimeRange = ALL, older: persisted.EntityOlder | None = None) -> list[m.SignalSeries]:
    peer_idx, who = peers(s, kind, i)
    return [_series(s, ring, sig.name, sig.unit, sig.help, i, peer_idx, who, last,
                    signal_thresholds(s, kind, i, sig.name, ev_cfg), rng,
                    None if older is None else (older.t_s, older.values[:, j], older.n))
            for j, sig in enumerate(signals_for(kind))]


def score_thresholds(assess_cfg, kind: Kind) -> m.ScoreThresholds:
    h = assess_cfg.hysteresis_for(kind)
    return m.ScoreThresholds(degrade_enter=h.degrade_enter, degrade_exit=h.degrade_exit,
                             quarantine_enter=h.quarantine_enter, harmful_prs=h.harmful_prs,
                             prs_scale_gpus=assess_cfg.propagation.prs_scale_gpus)


def gfs_series(s: Snapshot, ring, kind: Kind, i: int, last: int | None, th: m.ScoreThresholds,
               rng: TimeRange = ALL, older: persisted.EntityOlder | None = None) -> m.SignalSeries:
    peer_idx, who = peers(s, kind, i)
    lines = [m.ThresholdLine(value=th.quarantine_enter, label=f"quarantine (GFS >= {th.quarantine_enter:g})"),
             m.ThresholdLine(value=th.degrade_enter, label=f"degrade (GFS >= {th.degrade_enter:g})"),
             m.ThresholdLine(value=th.degrade_exit, label=f"recover (GFS < {th.degrade_exit:g})")]
    return _series(s, ring, score_row(kind.label), "score",
                   "gray-failure score: noisy-OR of the evidence channels, 0 to 1", i, peer_idx, who, last, lines, rng,
                   None if older is None else (older.t_s, older.gfs, older.n), how="max")


def pin_out(p: Pin) -> m.PinOut:
    return m.PinOut(kind=p.kind.label, entity=p.entity, state=p.state.label, note=p.note, by=p.by,
                    since_wall_s=p.since_wall_s)


def _state_before(reader, s: Snapshot, name: str, rng: TimeRange, hist: list[dict], now: str,
                  limit: int) -> str:
    """The entity's state as the range opens (``hist``: its transitions in the range, newest
    first): the last one at or before it, else the state the earliest later one left."""
    if rng.since_t_s is not None:
        before = reader.transitions(upto_tick=s.tick, entity=name, until_t_s=rng.since_t_s, limit=1)
        if before:
            return before[0]["to_state"]
    if hist:
        return hist[-1]["from_state"]
    if rng.until_t_s is None:
        return now
    later = reader.transitions(upto_tick=s.tick, entity=name, since_t_s=rng.until_t_s, limit=limit)
    return later[-1]["from_state"] if later else now


def entity_detail(s: Snapshot, ring, reader, kind: Kind, name: str, history_limit: int = 50,
                  signal_points: int | None = None, assess_cfg=None, rng: TimeRange = ALL) -> m.EntityDetail:
    i = s.fleet.index_of(kind, name)  # KeyError -> 404
    row = entity_row(s, kind, i)
    ev = reasons_out(s.reasons(kind, i))
    newest = reader.transitions(upto_tick=s.tick, entity=name, limit=1)
    entered = newest[0] if newest and newest[0]["to_state"] == row.state else None
    span = dict(since_t_s=rng.since_t_s, until_t_s=rng.until_t_s)
    hist = reader.transitions(upto_tick=s.tick, entity=name, limit=history_limit, **span)
    pin = next((p for p in s.pins if p.kind == kind and p.index == i), None)
    targets = [name]
    if assess_cfg is None:
        from seamguard.assess.assessment import AssessConfig
        assess_cfg = AssessConfig()
    th = score_thresholds(assess_cfg, kind)
    node = parents(s, kind, i).get("node")
    ring_t, _ = ring.series(score_row(kind.label), i, s.ring_upto)
    older = persisted.entity_older(s, reader, kind.label, name, rng, ring_t[0] if ring_t else None,
                                   len(signals_for(kind)))
    decisions = reader.decisions(upto_tick=s.tick, entity=name, limit=50, **span)
    actions = reader.actions(upto_tick=s.tick, entity=name, limit=50, **span)
    if node is not None and not decisions:
        # A GPU's or NIC's actions usually target its node.
        decisions = reader.decisions(upto_tick=s.tick, entity=node, limit=50, **span)
        actions = reader.actions(upto_tick=s.tick, entity=node, limit=50, **span)
        targets.append(node)
    return m.EntityDetail(
        entity=row, parents=parents(s, kind, i), children=children(s, kind, i), evidence=ev,
        why=why(row, ev, entered, pin),
        entered_by=m.TransitionOut(**entered) if entered else None,
        history=[m.TransitionOut(**h) for h in hist],
        signals=signals(s, ring, kind, i, signal_points, assess_cfg.evidence, rng, older),
        gfs_series=gfs_series(s, ring, kind, i, signal_points, th, rng, older), thresholds=th,
        since_t_s=rng.since_t_s, until_t_s=rng.until_t_s,
        state_at_since=_state_before(reader, s, name, rng, hist, row.state, history_limit),
        decisions=[m.DecisionOut(**d) for d in decisions], actions=[m.ActionOut(**a) for a in actions],
        pin=pin_out(pin) if pin else None, persisted=older.persisted if older is not None else None)


def admissible(s: Snapshot, job_class: str, limit: int, offset: int, loop: str | None = None) -> m.AdmissibleNodes:
    n = s.fleet.count(Kind.NODE)
    a = s.assessment
    j = ADMISSIBILITY_COLUMNS.index(job_class)
    ok = a.admissible[:, j] if a is not None else np.ones(n, dtype=bool)
    if loop is not None:
        ok = ok & (s.fleet.node_loop == s.fleet.index_of(Kind.COOLING_LOOP, loop))
    idx = np.flatnonzero(ok)
    return m.AdmissibleNodes(job_class=job_class, admissible=int(idx.size), total_nodes=n, limit=limit,
                             offset=offset, nodes=[s.fleet.node_names[int(i)] for i in idx[offset:offset + limit]])


def admissibility_summary(s: Snapshot) -> m.AdmissibilitySummary:
    n = s.fleet.count(Kind.NODE)
    a = s.assessment
    counts = a.admissible.sum(axis=0) if a is not None else np.full(len(ADMISSIBILITY_COLUMNS), n)
    return m.AdmissibilitySummary(total_nodes=n, admissible={c: int(counts[k]) for k, c in enumerate(ADMISSIBILITY_COLUMNS)})


def jobs(s: Snapshot) -> list[m.JobOut]:
    f = s.fleet
    nd, jv = s.kinds[Kind.NODE], s.kinds[Kind.JOB]
    p = s.progress
    out = []
    for j, name in enumerate(f.job_names):
        nodes = np.flatnonzero(f.node_job == j)
        bad = nodes[nd.state[nodes] != State.HEALTHY]
        out.append(m.JobOut(
            name=name, job_class=JobClass(int(f.job_class[j])).label, criticality=float(f.job_criticality[j]),
            gpus=int(f.job_gpu_count[j]), nodes=int(nodes.size), state=STATE_LABELS[int(jv.state[j])],
            exposure=_counts(nd.state[nodes]), exposed_to=[f.node_names[int(x)] for x in bad[:20]],
            fae=_f(jv.fae[j]),
            useful_throughput=None if p is None else round(float(p.job_useful_with[j]), 5),
            useful_throughput_without_control=None if p is None or p.job_useful_without is None
            else round(float(p.job_useful_without[j]), 5)))
    return out


def _contained_fae(s: Snapshot) -> float:
    """FAE of entities whose node or path is held out of the critical path by an action in effect."""
    f = s.fleet
    held = {ak.entity for ak in map(ActionKey.parse, s.in_effect)
            if ak.verb in (Verb.DRAIN, Verb.AVOID_LINK, Verb.AVOID_STORAGE)}
    if not held:
        return 0.0
    total = 0.0
    g, nic = s.kinds[Kind.GPU], s.kinds[Kind.NIC]
    drained = []
    for n in held:
        try:
            drained.append(f.index_of(Kind.NODE, n))
        except KeyError:
            pass
    if drained:
        total += float(np.nan_to_num(g.fae[np.isin(f.gpu_node, drained)]).sum())
        total += float(np.nan_to_num(nic.fae[np.isin(f.nic_node, drained)]).sum())
    for kind in (Kind.LINK, Kind.STORAGE):
        v = s.kinds[kind]
        for n in held:
            try:
                total += float(np.nan_to_num(v.fae[f.index_of(kind, n)]))
            except KeyError:
                pass
    return round(total, 3)


def throughput(s: Snapshot) -> m.Throughput:
    p = s.progress
    fae_now = 0.0
    for kind in (Kind.COOLING_LOOP, Kind.GPU, Kind.NIC, Kind.LINK, Kind.STORAGE):
        v = s.kinds[kind]
        fae_now += float(np.nan_to_num(v.fae[v.state != State.HEALTHY]).sum())
    saved = None
    if p is not None and p.gpu_hours_without is not None:
        saved = round(p.gpu_hours_with - p.gpu_hours_without, 3)
    return m.Throughput(
        source=s.source,
        useful_with_control=None if p is None else round(p.useful_with, 5),
        useful_without_control=None if p is None or p.useful_without is None else round(p.useful_without, 5),
        gpu_hours_with_control=None if p is None else round(p.gpu_hours_with, 3),
        gpu_hours_without_control=None if p is None or p.gpu_hours_without is None else round(p.gpu_hours_without, 3),
        gpu_hours_saved=saved,
        job_failures_with_control=None if p is None else p.failures_with,
        job_failures_without_control=None if p is None else p.failures_without,
        fae_in_effect_gpu_h_per_h=round(fae_now, 3), fae_contained_gpu_h_per_h=_contained_fae(s),
        series=[m.ThroughputPointOut(t_s=x.t_s, with_control=x.useful_with, without_control=x.useful_without)
                for x in s.throughput])


def timeline(s: Snapshot, reader, limit: int, rng: TimeRange = ALL) -> list[m.TimelineEvent]:
    span = dict(since_t_s=rng.since_t_s, until_t_s=rng.until_t_s)
    trs = reader.transitions(upto_tick=s.tick, non_healthy_only=True, limit=limit, **span)
    acts = reader.actions(upto_tick=s.tick, limit=limit, **span)
    ev = [m.TimelineEvent(t_s=t["t_s"], tick=t["tick"], type="transition", entity=t["entity"], kind=t["kind"],
                          text=f"{t['from_state']} → {t['to_state']}" +
                               (f": {t['reasons'][0]['channel']}" if t["reasons"] else ""),
                          state=t["to_state"], status=None) for t in trs]
    ev += [m.TimelineEvent(t_s=a["t_s"], tick=a["tick"], type="action", entity=a["target"], kind=a["verb"],
                           text=f"{a['op']} {a['verb']} {a['target']} [{a['status']}]" +
                                (f": {a['reason']}" if a["reason"] else ""),
                           state=None, status=a["status"]) for a in acts]
    ev.sort(key=lambda e: (e.tick, e.type == "action"), reverse=True)
    return ev[:limit]


# ---- the fleet map ----------------------------------------------------------------------------
DETAIL_MAX_GPUS = 4096
FABRIC_CODES_MAX = 20000


def _codes(states: np.ndarray) -> str:
    return (states.astype(np.uint8) + 48).tobytes().decode("ascii")


def _loop_detail(s: Snapshot, loop: int) -> m.MapDetail:
    f = s.fleet
    g, nd = s.kinds[Kind.GPU], s.kinds[Kind.NODE]
    racks = []
    for r in np.flatnonzero(f.rack_loop == loop).tolist():
        nodes = np.flatnonzero(f.node_rack == r)
        gpu_codes, gpu_names = [], []
        for n in nodes.tolist():
            gs = np.flatnonzero(f.gpu_node == n)
            gpu_codes.append(_codes(g.state[gs]))
            gpu_names.append([f.gpu_names[int(x)] for x in gs])
        racks.append(m.MapRack(name=f.rack_names[r], nodes=[f.node_names[int(n)] for n in nodes],
                               node_states=_codes(nd.state[nodes]), gpu_states=gpu_codes, gpu_names=gpu_names))
    return m.MapDetail(loop=f.loop_names[loop], state=STATE_LABELS[int(s.kinds[Kind.COOLING_LOOP].state[loop])],
                       racks=racks)


def fleet_map(s: Snapshot, loop: str | None = None, not_healthy_limit: int = 50) -> m.FleetMap:
    f = s.fleet
    lc_g, lc_n = s.loop_counts[Kind.GPU], s.loop_counts[Kind.NODE]
    loop_state = s.kinds[Kind.COOLING_LOOP].state
    loops = []
    for i, name in enumerate(f.loop_names):
        worst_child = max([j for j in range(len(State)) if lc_g[i, j] or lc_n[i, j]] or [0])
        loops.append(m.MapLoop(name=name, index=i, gpu_states={STATE_LABELS[j]: int(lc_g[i, j]) for j in range(len(State))},
                               node_states={STATE_LABELS[j]: int(lc_n[i, j]) for j in range(len(State))},
                               worst=STATE_LABELS[max(int(loop_state[i]), worst_child)]))
    aggregated = f.count(Kind.GPU) > DETAIL_MAX_GPUS
    if loop is not None:
        detail = [_loop_detail(s, f.index_of(Kind.COOLING_LOOP, loop))]
    elif not aggregated:
        detail = [_loop_detail(s, i) for i in range(len(f.loop_names))]
    else:
        detail = []
    fabric = []
    for kind in (Kind.NIC, Kind.LINK):
        v = s.kinds[kind]
        bad = select(s, kind, states=STATE_LABELS[1:], sort="gfs")[:not_healthy_limit]
        fabric.append(m.MapFabric(kind=kind.label, total=v.count, states=v.counts(),
                                  codes=_codes(v.state) if v.count <= FABRIC_CODES_MAX else None,
                                  not_healthy=[entity_row(s, kind, int(i)) for i in bad]))
    storage = [entity_row(s, Kind.STORAGE, i) for i in range(f.count(Kind.STORAGE))]
    failed = select(s, Kind.NODE, states=["failed"])[:not_healthy_limit]
    return m.FleetMap(tick=s.tick, failed_nodes=[entity_row(s, Kind.NODE, int(i)) for i in failed], state_codes=STATE_LABELS, aggregated=aggregated and loop is None, loops=loops,
                      detail=detail, fabric=fabric, storage=storage)


# ---- fleet-level history -----------------------------------------------------------------------
LOOPS_ALL_MAX = 12  # up to this many loops every loop is drawn; above, the band and the bad ones


def _band(a: np.ndarray) -> m.Band:
    if a.size == 0:
        return m.Band(p10=[], p50=[], p90=[])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p10, p50, p90 = np.nanpercentile(a, [10, 50, 90], axis=1)
    return m.Band(p10=_opt(p10), p50=_opt(p50), p90=_opt(p90))


def fleet_history(s: Snapshot, points: int = 360, loop: str | None = None, ev_cfg=None,
                  rng: TimeRange = ALL, reader=None) -> m.FleetHistory:
    """State counts, per-loop coolant and useful throughput over the last ``points`` ticks, or
    over ``rng`` rolled up to at most ``points``: memory's ticks, and before the oldest of
    them the ledger's persisted rows (`persisted.fleet_rows`). KeyError on an unknown loop."""
    f = s.fleet
    want = f.index_of(Kind.COOLING_LOOP, loop) if loop is not None else None
    src = persisted.fleet_rows(s, reader, rng, points)
    d = decode_fleet(src.rows)
    n_loops = f.count(Kind.COOLING_LOOP)
    t = src.t_s.tolist()
    states = [m.StateCountSeries(kind=kind, counts={STATE_LABELS[j]: d[col][:, j].round().astype(np.int64).tolist()
                                                    for j in range(len(State))})
              for kind, col in (("gpu", "gpu_counts"), ("node", "node_counts"))]
    ls = d["loop_state"].round().astype(np.int8)
    cool = d["coolant"]
    rated = f.loop_rated_flow_lpm.astype(float)
    now = s.kinds[Kind.COOLING_LOOP].state
    if n_loops <= LOOPS_ALL_MAX:
        chosen = list(range(n_loops))
    else:
        worst = ls.max(axis=0) if len(t) else np.zeros(n_loops, dtype=np.int8)
        worst = np.maximum(worst, now)
        bad = np.flatnonzero(worst > 0)
        chosen = bad[np.argsort(-worst[bad], kind="stable")][:LOOPS_ALL_MAX].tolist()
    if want is not None and want not in chosen:
        chosen.append(want)
    loops = [m.LoopCoolant(name=f.loop_names[i], state=STATE_LABELS[int(now[i])], rated_flow_lpm=round(float(rated[i]), 2),
                           flow_lpm=_opt(cool[:, i, 0]), supply_c=_opt(cool[:, i, 1]), return_c=_opt(cool[:, i, 2]),
                           states=(ls[:, i].astype(np.uint8) + 48).tobytes().decode("ascii"))
             for i in chosen]
    hi, lo = ev_cfg.flow_ratio if ev_cfg is not None else (0.92, 0.80)
    return m.FleetHistory(t_s=t, wall_s=_opt(src.wall_s), state_codes=STATE_LABELS, states=states,
                          held_since_t_s=s.fleet_history[0].t_s if s.fleet_history else None,
                          loops_total=n_loops, loops=loops, flow_ratio_band=_band(cool[:, :, 0] / rated),
                          supply_c_band=_band(cool[:, :, 1]), flow_ratio_concern=hi, flow_ratio_saturation=lo,
                          useful_with=_opt(d["useful_with"], 5), useful_without=_opt(d["useful_without"], 5),
                          persisted=src.persisted)


# ---- state counts replayed from the ledger -------------------------------------------------------
STATE_ROWS_MAX = 200_000  # grouped transition rows one request replays (a tick's moves are one row per pair)


def replay_counts(now: dict[str, int], moves: list[dict], grid_t_s: np.ndarray) -> np.ndarray:
    """Counts per state [len(grid), len(State)] at each grid time, from the counts ``now`` and
    the moves after the grid's start (newest first: tick, t_s, from_state, to_state, n).
    A move at time t is in effect at t: the count at t includes it."""
    cur = np.array([now.get(x, 0) for x in STATE_LABELS], dtype=np.int64)
    if not moves:
        return np.tile(cur, (grid_t_s.size, 1))
    col = {x: j for j, x in enumerate(STATE_LABELS)}
    delta = np.zeros((len(moves), len(STATE_LABELS)), dtype=np.int64)  # newest first
    for k, mv in enumerate(moves):
        delta[k, col[mv["to_state"]]] += mv["n"]
        delta[k, col[mv["from_state"]]] -= mv["n"]
    undone = np.vstack([np.zeros(len(STATE_LABELS), dtype=np.int64), np.cumsum(delta, axis=0)])
    t_desc = np.array([mv["t_s"] for mv in moves], dtype=float)
    # moves later than each grid time: they are undone to get back to it
    later = np.searchsorted(-t_desc, -grid_t_s, side="left")
    return cur[None, :] - undone[later]


def state_history(s: Snapshot, reader, kind: Kind, rng: TimeRange, points: int,
                  default_span_s: float = 3600.0) -> m.StateHistory:
    """Entities of ``kind`` per state over ``rng`` (default: the last hour), replayed from the
    ledger's transitions back from the snapshot's counts: as long as the ledger reaches, not
    only the ticks the controller holds in memory."""
    end = s.t_s if rng.until_t_s is None else min(rng.until_t_s, s.t_s)
    start = end - default_span_s if rng.since_t_s is None else rng.since_t_s
    first = reader.first_tick_t_s()
    begins = start if first is None else max(start, first)
    if s.tick < 0 or end <= begins:
        return m.StateHistory(kind=kind.label, since_t_s=start, until_t_s=end, t_s=[], counts={},
                              complete_since_t_s=None, moves=0)
    moves = reader.transition_counts(kind.label, since_t_s=begins, upto_tick=s.tick, limit=STATE_ROWS_MAX + 1)
    complete = begins
    if len(moves) > STATE_ROWS_MAX:
        # The oldest tick read may be cut short: keep whole ticks, and say where exactness starts.
        last_tick = moves[STATE_ROWS_MAX]["tick"]
        moves = [mv for mv in moves[:STATE_ROWS_MAX] if mv["tick"] != last_tick]
        complete = moves[-1]["t_s"] if moves else end
    grid = np.linspace(complete, end, num=max(2, points)) if points > 1 else np.array([end])
    counts = replay_counts(s.kinds[kind].counts(), moves, grid)
    return m.StateHistory(kind=kind.label, since_t_s=start, until_t_s=end, t_s=[round(float(x), 3) for x in grid],
                          counts={x: counts[:, j].tolist() for j, x in enumerate(STATE_LABELS)},
                          complete_since_t_s=complete, moves=len(moves))
