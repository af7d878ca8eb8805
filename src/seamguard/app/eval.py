"""Score a replay timeline against labelled incidents (`seamguard eval`, docs/evaluation.md).

Pure functions over parsed labels and timeline events; the files are read by the small
loaders at the top and nothing here does any other I/O.

Matching rule (an incident is *detected*): the timeline has a transition to a
non-healthy state, inside ``[start - tolerance, end]`` (no ``end``: to the end of the
timeline), of the labelled entity or of an entity in its *family*:

- the entity itself;
- everything it contains (a loop's racks, nodes, GPUs, NICs and NIC links; a rack's
  nodes and below; a node's GPUs, NICs and NIC links; a NIC's link);
- what contains it up to the node (a GPU's or NIC's node, a NIC link's NIC and node).
  Racks and loops above a node are not counted: a loop flagged for one GPU has not
  located the fault.

Coverage (what is *not* a false flag or a false action): a non-healthy transition or an
action is covered by an incident when it falls inside ``[start - tolerance, end + grace]``
and its entity (for an action: its target, or its ``cause`` when the record has one) is
in the incident's family, or is a job running on a node of the family, or is a job whose
nodes write to the labelled storage path. Everything else is false: flags of entities no
incident covers, drains of healthy nodes, checkpoints no fault asked for.

Figures: recall (detected / incidents), precision (flagged entities with every flag
covered / flagged entities), delay (first detection - start), lead (hard failure - first
detection), actions, false actions, healthy drains, actions and checkpoint requests per
incident — overall and per fault class.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from seamguard.app.config import read_yaml
from seamguard.fleet.model import Fleet, Kind

HEALTHY = "healthy"
MAINTENANCE = "maintenance"  # a labelled window of planned work: covers flags and actions, is no incident
LABEL_KINDS = ("cooling_loop", "rack", "node", "gpu", "nic", "link", "switch", "storage", "job")
DEFAULT_TOLERANCE_S = 60.0
DEFAULT_GRACE_S = 600.0


class EvalInputError(ValueError):
    """A labels file or timeline that cannot be read; the message names the file and the place."""


@dataclass(frozen=True)
class Incident:
    id: str
    kind: str
    entity: str
    fault: str
    start: float
    hard_failure: float | None = None
    end: float | None = None


# ---- reading ------------------------------------------------------------------------------------------
def parse_time(v: Any, where: str) -> float:
    """Unix seconds, RFC 3339 with a zone, or a datetime YAML already read; ``where`` names the field."""
    if isinstance(v, bool):
        raise EvalInputError(f"{where}: expected a time (Unix seconds or RFC 3339), got {v!r}")
    if isinstance(v, int | float):
        if not math.isfinite(v):
            raise EvalInputError(f"{where}: time must be finite, got {v!r}")
        return float(v)
    if isinstance(v, datetime):  # YAML reads an unquoted timestamp itself (UTC when it has no zone)
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).timestamp()
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
        try:
            d = datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
        except ValueError:
            raise EvalInputError(f"{where}: cannot read time {v!r}: give Unix seconds or RFC 3339 "
                                 f"(e.g. 2025-01-31T12:00:00Z)") from None
        if d.tzinfo is None:
            raise EvalInputError(f"{where}: time {v!r} has no time zone; add Z or an offset")
        return d.timestamp()
    raise EvalInputError(f"{where}: expected a time (Unix seconds or RFC 3339), got {type(v).__name__}")


def parse_labels(data: Any, source: str = "<labels>") -> list[Incident]:
    """Incidents from parsed YAML/JSON: ``{version: 1, incidents: [...]}`` or a bare list."""
    if isinstance(data, dict):
        if data.get("version", 1) != 1:
            raise EvalInputError(f"{source}: version: unsupported labels version {data.get('version')!r}; expected 1")
        items = data.get("incidents")
        if not isinstance(items, list):
            raise EvalInputError(f"{source}: incidents: expected a list of incidents")
    elif isinstance(data, list):
        items = data
    else:
        raise EvalInputError(f"{source}: expected a mapping with 'incidents:' or a list, got {type(data).__name__}")
    out: list[Incident] = []
    seen: set[str] = set()
    for i, it in enumerate(items):
        where = f"{source}: incidents[{i}]"
        if not isinstance(it, dict):
            raise EvalInputError(f"{where}: expected a mapping, got {type(it).__name__}")
        unknown = set(it) - {"id", "kind", "entity", "fault", "start", "hard_failure", "end", "note"}
        if unknown:
            raise EvalInputError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        for k in ("kind", "entity", "fault", "start"):
            if it.get(k) in (None, ""):
                raise EvalInputError(f"{where}: {k}: missing")
        kind = str(it["kind"])
        if kind not in LABEL_KINDS:
            raise EvalInputError(f"{where}: kind: {kind!r} is not one of {', '.join(LABEL_KINDS)}")
        start = parse_time(it["start"], f"{where}: start")
        hf = parse_time(it["hard_failure"], f"{where}: hard_failure") if it.get("hard_failure") is not None else None
        end = parse_time(it["end"], f"{where}: end") if it.get("end") is not None else None
        if end is not None and end < start:
            raise EvalInputError(f"{where}: end is before start")
        if hf is not None and hf < start:
            raise EvalInputError(f"{where}: hard_failure is before start")
        iid = str(it.get("id") or f"#{i + 1}")
        if iid in seen:
            raise EvalInputError(f"{where}: id {iid!r} appears twice")
        seen.add(iid)
        out.append(Incident(iid, kind, str(it["entity"]), str(it["fault"]), start, hf, end))
    return out


def load_labels(path: Path) -> list[Incident]:
    if not str(path).endswith(".json"):
        return parse_labels(read_yaml(path, "labels file", EvalInputError), str(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise EvalInputError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise EvalInputError(f"{path}: not valid JSON: {str(e).splitlines()[0]}") from None
    return parse_labels(data, str(path))


def read_timeline(path: Path) -> list[dict]:
    """JSON lines as `seamguard replay` / `seamguard run` write them; a bad line is an error naming it."""
    out = []
    try:
        fh = open(path, encoding="utf-8")
    except OSError as e:
        raise EvalInputError(f"{path}: cannot read: {e.strerror or e}") from None
    with fh:
        try:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    raise EvalInputError(f"{path}:{n}: not a JSON object") from None
                if not isinstance(ev, dict) or not isinstance(ev.get("t"), int | float):
                    raise EvalInputError(f"{path}:{n}: expected an event with a numeric 't'")
                out.append(ev)
        except UnicodeDecodeError:
            raise EvalInputError(f"{path}: not UTF-8 text") from None
    return out


# ---- relations: containment from the topology (or, without one, from names) ---------------------------
class Relations:
    """Who contains whom. With a Fleet: its arrays. Without: seamguard's naming (``node/gpuN``,
    ``node/mlx5_N``, ``node/mlx5_N~leaf``), and jobs and storage paths relate to nothing."""

    def __init__(self, fleet: Fleet | None = None) -> None:
        self.fleet = fleet
        self._parent: dict[tuple[str, str], tuple[str, str]] = {}
        self._children: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._job_nodes: dict[str, set[str]] = {}
        self._job_storage: dict[str, set[str]] = {}
        self._kind_by_name: dict[str, str] = {}
        if fleet is not None:
            self._build(fleet)

    def _link(self, child: tuple[str, str], parent: tuple[str, str]) -> None:
        self._parent[child] = parent
        self._children.setdefault(parent, []).append(child)

    def _build(self, f: Fleet) -> None:
        for r, lp in enumerate(f.rack_loop.tolist()):
            self._link(("rack", f.rack_names[r]), ("cooling_loop", f.loop_names[lp]))
        for n, r in enumerate(f.node_rack.tolist()):
            self._link(("node", f.node_names[n]), ("rack", f.rack_names[r]))
        for g, n in enumerate(f.gpu_node.tolist()):
            self._link(("gpu", f.gpu_names[g]), ("node", f.node_names[n]))
        for i, n in enumerate(f.nic_node.tolist()):
            self._link(("nic", f.nic_names[i]), ("node", f.node_names[n]))
        for li, nic in enumerate(f.link_nic.tolist()):
            if nic >= 0:
                self._link(("link", f.link_names[li]), ("nic", f.nic_names[nic]))
        for n, j in enumerate(f.node_job.tolist()):
            if j >= 0:
                jn = f.job_names[j]
                self._job_nodes.setdefault(jn, set()).add(f.node_names[n])
                self._job_storage.setdefault(jn, set()).add(f.storage_names[int(f.node_storage[n])])

    def kind_of(self, name: str) -> str | None:
        """The kind of an entity named ``name`` (an action's ``cause``), from the topology."""
        if self.fleet is None:
            return None
        if not self._kind_by_name:
            for k in Kind:
                for n in self.fleet.names(k):
                    self._kind_by_name.setdefault(n, k.label)
        return self._kind_by_name.get(name)

    def parent(self, key: tuple[str, str]) -> tuple[str, str] | None:
        if self.fleet is not None:
            return self._parent.get(key)
        kind, name = key
        if kind == "link" and "~" in name:
            return ("nic", name.split("~", 1)[0])
        if kind in ("gpu", "nic") and "/" in name:
            return ("node", name.rsplit("/", 1)[0])
        return None

    def family(self, key: tuple[str, str]) -> set[tuple[str, str]]:
        """The entity, everything under it, and what holds it up to the node."""
        fam = {key}
        up = key
        while up[0] not in ("node", "rack", "cooling_loop"):
            p = self.parent(up)
            if p is None:
                break
            fam.add(p)
            up = p
        if self.fleet is not None:
            todo = [key]
            while todo:
                k = todo.pop()
                for c in self._children.get(k, ()):
                    fam.add(c)
                    todo.append(c)
        return fam

    def covers(self, fam: set[tuple[str, str]], label: tuple[str, str], key: tuple[str, str],
               by_name: bool = True) -> bool:
        """``key`` is in the family, or a job on a family node / on the labelled storage path."""
        if key in fam:
            return True
        if self.fleet is None:
            # Names only: descendants by prefix (``node`` covers ``node/gpu3`` and ``node/mlx5_0~leaf``).
            return by_name and key[1].startswith(label[1] + "/")
        if key[0] == "job":
            nodes = self._job_nodes.get(key[1], set())
            if label[0] == "storage":
                return label[1] in self._job_storage.get(key[1], set())
            return any(("node", n) in fam for n in nodes)
        return False


# ---- scoring ------------------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else None


def _round(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def _episodes(events: Iterable[dict]) -> list[dict]:
    """Transitions from healthy to a non-healthy state (escalations inside an episode are not new)."""
    state: dict[tuple[str, str], str] = {}
    out = []
    for ev in events:
        if ev.get("entity") is None or ev.get("to") is None or ev.get("action"):
            continue
        key = (str(ev.get("kind")), str(ev["entity"]))
        prev = state.get(key, ev.get("from") or HEALTHY)
        to = ev["to"]
        state[key] = to
        if to != HEALTHY and prev == HEALTHY:
            out.append({"t": float(ev["t"]), "key": key, "to": to})
    return out


@dataclass(frozen=True)
class _Cover:
    """Which labelled incidents and maintenance windows cover an entity at a time."""

    rel: Relations
    incidents: list[Incident]
    windows: list[Incident]
    tolerance_s: float
    grace_s: float
    fams: list[set[tuple[str, str]]] = field(init=False)
    wfams: list[set[tuple[str, str]]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fams", [self.rel.family((i.kind, i.entity)) for i in self.incidents])
        object.__setattr__(self, "wfams", [self.rel.family((w.kind, w.entity)) for w in self.windows])

    def covering(self, key: tuple[str, str], t: float) -> list[int]:
        """The incidents whose window (tolerance before, grace after) and family hold ``key`` at ``t``."""
        return [i for i, inc in enumerate(self.incidents)
                if inc.start - self.tolerance_s <= t <= (inc.end + self.grace_s if inc.end is not None else math.inf)
                and self.rel.covers(self.fams[i], (inc.kind, inc.entity), key)]

    def planned(self, key: tuple[str, str], t: float) -> bool:
        """Inside a labelled maintenance window (planned work: neither an incident nor a false flag)."""
        return any(w.start - self.tolerance_s <= t <= (w.end if w.end is not None else math.inf) + self.grace_s
                   and self.rel.covers(self.wfams[i], (w.kind, w.entity), key) for i, w in enumerate(self.windows))


def _first_detections(cover: _Cover, events: list[dict]) -> dict[int, float]:
    """Per incident, the first transition to a non-healthy state (an escalation counts) of a family
    member inside ``[start - tolerance, end]``. A flag raised before the window and still standing
    is not a detection."""
    fam_index: dict[tuple[str, str], list[int]] = {}
    for i, fam in enumerate(cover.fams):
        for k in fam:
            fam_index.setdefault(k, []).append(i)
    first: dict[int, float] = {}
    for ev in events:
        if ev.get("entity") is None or ev.get("to") in (None, HEALTHY) or ev.get("action"):
            continue
        key, t = (str(ev["kind"]), str(ev["entity"])), float(ev["t"])
        cands = fam_index.get(key, ()) if cover.rel.fleet is not None else [
            i for i, inc in enumerate(cover.incidents) if cover.rel.covers(cover.fams[i], (inc.kind, inc.entity), key)]
        for i in cands:
            inc = cover.incidents[i]
            if i not in first and inc.start - cover.tolerance_s <= t <= (inc.end if inc.end is not None else math.inf):
                first[i] = t
    return first


def _false_flag_episodes(cover: _Cover, episodes: list[dict]) -> tuple[dict, dict]:
    """Episodes per flagged entity, and per entity the episodes no incident or maintenance covers."""
    flagged: dict[tuple[str, str], int] = {}
    false_eps: dict[tuple[str, str], int] = {}
    for ep in episodes:
        flagged[ep["key"]] = flagged.get(ep["key"], 0) + 1
        if not cover.covering(ep["key"], ep["t"]) and not cover.planned(ep["key"], ep["t"]):
            false_eps[ep["key"]] = false_eps.get(ep["key"], 0) + 1
    return flagged, false_eps


@dataclass
class _ActionTally:
    """Applied actions, credited to the incident that covers them or counted as false."""

    per_incident: list[int]
    checkpoints_per_incident: list[int]
    checkpoints_per_incident_job: dict[tuple[int, str], int] = field(default_factory=dict)
    false_actions: dict[str, int] = field(default_factory=dict)
    healthy_drains: int = 0
    checkpoints: int = 0


def _tally_actions(cover: _Cover, actions: list[dict]) -> _ActionTally:
    """An action belongs to the incident that covers its cause (a job asked to checkpoint for one of
    its nodes belongs to that node's incident, not to any incident on the job); a cause no incident
    covers makes it a false action. Without a known cause, it belongs to an incident covering its
    target; the most recently started covering incident takes the credit (or the blame)."""
    n = len(cover.incidents)
    tally = _ActionTally(per_incident=[0] * n, checkpoints_per_incident=[0] * n)
    for ev in actions:
        a, t = ev["action"], float(ev["t"])
        key = (str(ev.get("kind")), str(ev.get("entity")))
        cause = a.get("cause")
        cause_kind = cover.rel.kind_of(str(cause)) if cause else None
        cov = cover.covering((cause_kind, str(cause)), t) if cause_kind is not None else cover.covering(key, t)
        verb = a.get("verb")
        is_ckpt = verb == "checkpoint_now"
        tally.checkpoints += is_ckpt
        if not cov and cover.planned(key, t):
            continue  # planned work: not an action on a fault, not a false one
        if cov:
            i = max(cov, key=lambda k: cover.incidents[k].start)
            tally.per_incident[i] += 1
            tally.checkpoints_per_incident[i] += is_ckpt
            if is_ckpt:
                tally.checkpoints_per_incident_job[i, key[1]] = tally.checkpoints_per_incident_job.get((i, key[1]), 0) + 1
        else:
            label = f"{verb} {key[0]}:{key[1]}"
            tally.false_actions[label] = tally.false_actions.get(label, 0) + 1
            tally.healthy_drains += verb == "drain" and key[0] == "node"
    return tally


def _incident_row(i: int, inc: Incident, detected_at: float | None, tally: _ActionTally) -> dict[str, Any]:
    d = detected_at
    return {
        "id": inc.id, "fault": inc.fault, "kind": inc.kind, "entity": inc.entity, "start": inc.start,
        "detected": d is not None, "detected_at": d,
        "delay_s": _round(d - inc.start) if d is not None else None,
        "lead_s": _round(inc.hard_failure - d) if d is not None and inc.hard_failure is not None else None,
        "hard_failure": inc.hard_failure,
        "missed_hard_failure": inc.hard_failure is not None and (d is None or d >= inc.hard_failure),
        "actions": tally.per_incident[i], "checkpoint_requests": tally.checkpoints_per_incident[i],
        "max_checkpoint_requests_per_job": max((c for (k, _), c in tally.checkpoints_per_incident_job.items()
                                                if k == i), default=0)}


def _figures(rows: list[dict]) -> dict[str, Any]:
    """Recall, delay, lead and actions over a set of incident rows."""
    det = [r for r in rows if r["detected"]]
    delays = [r["delay_s"] for r in det]
    leads = [r["lead_s"] for r in det if r["lead_s"] is not None]
    n = len(rows)
    return {"incidents": n, "detected": len(det), "recall": _round(len(det) / n) if n else None,
            "median_delay_s": _round(_pct(delays, 50), 1), "p90_delay_s": _round(_pct(delays, 90), 1),
            "median_lead_s": _round(_pct(leads, 50), 1), "min_lead_s": _round(min(leads), 1) if leads else None,
            "with_hard_failure": sum(r["hard_failure"] is not None for r in rows),
            "hard_failures_unwarned": sum(r["missed_hard_failure"] for r in rows),
            "actions_per_fault": _round(sum(r["actions"] for r in rows) / n) if n else None,
            "checkpoint_requests_per_fault": _round(sum(r["checkpoint_requests"] for r in rows) / n) if n else None,
            "max_checkpoint_requests_per_fault": max((r["checkpoint_requests"] for r in rows), default=0),
            "max_checkpoint_requests_per_fault_and_job": max((r["max_checkpoint_requests_per_job"] for r in rows),
                                                             default=0)}


def check_labels(incidents: list[Incident], events: list[dict], relations: Relations,
                 tolerance_s: float = DEFAULT_TOLERANCE_S) -> tuple[list[str], list[str]]:
    """What makes a score meaningless before it is computed: (errors, warnings).

    Errors: an incident on an entity the topology does not have, or has as another kind (a
    typo would silently count as a miss). Warnings: an empty timeline, or labels of another
    window (no incident overlaps the span of the timeline's events; a timeline holds changes
    only, so its last event may come well before its window's end: one overlap is enough)."""
    errors = []
    if relations.fleet is not None:
        for inc in incidents:
            kind = relations.kind_of(inc.entity)
            if kind is None:
                errors.append(f"incident {inc.id}: {inc.kind} {inc.entity!r} is not in the topology")
            elif kind != inc.kind:
                errors.append(f"incident {inc.id}: {inc.entity!r} is a {kind} in the topology, labelled {inc.kind}")
    if not events:
        return errors, ["the timeline holds no events: every incident counts as missed"]
    t0, t1 = min(float(e["t"]) for e in events), max(float(e["t"]) for e in events)
    overlap = [i for i in incidents if i.start - tolerance_s <= t1 and (i.end is None or i.end >= t0)]
    if incidents and not overlap:
        return errors, [f"none of the {len(incidents)} incidents overlaps the timeline's events "
                        f"({_iso(t0)} to {_iso(t1)}): labels of another window?"]
    return errors, []


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def score(incidents: list[Incident], events: list[dict], relations: Relations | None = None,
          tolerance_s: float = DEFAULT_TOLERANCE_S, grace_s: float = DEFAULT_GRACE_S) -> dict[str, Any]:
    """The scorecard: overall figures, per fault class, per incident, false flags and actions."""
    rel = relations or Relations()
    cover = _Cover(rel, [inc for inc in incidents if inc.fault != MAINTENANCE],
                   [inc for inc in incidents if inc.fault == MAINTENANCE], tolerance_s, grace_s)
    events = sorted(events, key=lambda e: float(e["t"]))
    first = _first_detections(cover, events)
    eps = _episodes(events)
    flagged, false_eps = _false_flag_episodes(cover, eps)
    # Actions: applied decisions (held by the breaker or withdrawn ones are not actions).
    actions = [e for e in events if isinstance(e.get("action"), dict) and e["action"].get("op") == "apply"]
    tally = _tally_actions(cover, actions)
    per_inc = [_incident_row(i, inc, first.get(i), tally) for i, inc in enumerate(cover.incidents)]
    n_inc = len(cover.incidents)
    overall = _figures(per_inc)
    overall.update({
        "precision": _round((len(flagged) - len(false_eps)) / len(flagged)) if flagged else None,
        "flagged_entities": len(flagged), "false_flags": len(false_eps),
        "false_flag_episodes": sum(false_eps.values()), "flag_episodes": len(eps),
        "actions": len(actions), "false_actions": sum(tally.false_actions.values()),
        "healthy_drains": tally.healthy_drains, "checkpoint_requests": tally.checkpoints,
        "actions_per_fault": _round(len(actions) / n_inc) if n_inc else None,
        "checkpoint_requests_per_fault": _round(tally.checkpoints / n_inc) if n_inc else None,
        "controller_errors": sum(1 for e in events if e.get("kind") == "controller"),
    })
    classes = {fault: _figures([r for r in per_inc if r["fault"] == fault])
               for fault in sorted({r["fault"] for r in per_inc})}
    return {"overall": overall, "per_class": classes, "incidents": per_inc,
            "false_flags": {f"{k}:{n}": c for (k, n), c in sorted(false_eps.items())},
            "false_actions": dict(sorted(tally.false_actions.items())),
            "maintenance_windows": len(cover.windows),
            "rules": {"tolerance_s": tolerance_s, "grace_s": grace_s, "topology": rel.fleet is not None}}


def as_dict(inc: Incident) -> dict:
    return asdict(inc)


__all__ = ["DEFAULT_GRACE_S", "DEFAULT_TOLERANCE_S", "EvalInputError", "Incident", "Relations", "check_labels",
           "load_labels",
           "parse_labels", "parse_time", "read_timeline", "score"]
