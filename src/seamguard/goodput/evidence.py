"""Records for the attribution from what the scheduler and the ledger already wrote. Pure.

- `parse_sacct`: ``sacct -P -n --format=JobID,JobName,State,Start,End,NodeList`` text (with
  slurmdbd, or ``-c`` from the job-completion log) -> one `Run` per allocation. A requeued
  allocation is its own row: slurmdbd says REQUEUED, the completion log the state the job
  went back to (PENDING); either way the row ends a run and the job starts again later.
- `run_from_scontrol`: the allocation running now (``scontrol show job -o``), which the
  completion log has not written yet.
- `job_entities`: the entities a job runs on (its GPUs, their nodes, NICs, links, storage,
  racks, cooling loops), from the topology.
- `episodes_from_ledger`: transitions of those entities out of healthy -> STRAGGLER episodes
  (seam: the evidence channel that scored highest), each from when its evidence began
  (`evidence_onset`, when the sources found it) rather than from the flag; actions done on
  them -> DEGRADED (in effect from apply to revert) or RESTART (a move or drain restarts
  the job's ranks).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, tzinfo

import numpy as np

from seamguard.act.slurm_jobs import parse_show_job
from seamguard.assess.states import STATE_BY_LABEL, State
from seamguard.decide.actions import ActionKey, Verb
from seamguard.fleet.model import Fleet, Kind
from seamguard.goodput.attribution import Cause, Episode, Goodput, JobSeries, Run, attribute

SACCT_FORMAT = "JobID,JobName,State,Start,End,NodeList"
_OPEN = ("Unknown", "None", "", "N/A")
_NOT_STARTED = ("PENDING",)
# Verbs whose effect slows a running job while in effect (the runtime avoids a rail, writes
# checkpoints elsewhere or more often) and verbs that restart its ranks when applied.
DEGRADING = (Verb.AVOID_LINK, Verb.AVOID_STORAGE, Verb.CHECKPOINT_INTERVAL)
RESTARTING = (Verb.MOVE_JOB, Verb.DRAIN)
# How far before its flag an entity's evidence may have begun: the state machine's entry
# hysteresis (ticks above the entry threshold) and the scores' rise take a few ticks; at the
# default 15 s tick, 40 ticks. An entity gray for longer than this without being flagged is
# not charged for what lies further back.
EVIDENCE_LOOKBACK_S = 600.0


class SacctError(ValueError):
    """sacct/scontrol text that does not parse; the message says which line and field."""


def _time(text: str, tz: tzinfo | None, where: str) -> float:
    if text in _OPEN:
        return math.inf
    try:
        d = datetime.fromisoformat(text)
    except ValueError:
        raise SacctError(f"{where}: {text!r} is not a time (YYYY-MM-DDTHH:MM:SS)") from None
    return (d if d.tzinfo is not None else d.replace(tzinfo=tz) if tz is not None else d.astimezone()).timestamp()


def parse_sacct(text: str, job: str | None = None, tz: tzinfo | None = None) -> list[Run]:
    """Allocations (``Run``) of the job named ``job`` (every job when None), oldest first.

    ``tz``: the zone sacct printed its times in (None: this machine's local zone). Rows of
    job steps (``123.batch``) and rows that never started are skipped."""
    runs: list[Run] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 6:
            raise SacctError(f"sacct line {n}: {len(f)} fields, expected {SACCT_FORMAT} (-P): {line[:120]!r}")
        job_id, name, state, start, end, nodes = f[:6]
        if "." in job_id or (job is not None and name != job):
            continue
        state = state.split()[0] if state.strip() else ""
        t0 = _time(start, tz, f"sacct line {n} Start")
        if not math.isfinite(t0):
            continue
        t1 = _time(end, tz, f"sacct line {n} End")
        if t1 < t0:
            raise SacctError(f"sacct line {n}: End {end} is before Start {start}")
        if t1 == t0 and state in _NOT_STARTED:
            continue
        runs.append(Run(t0, t1, state if math.isfinite(t1) else "RUNNING", nodes))
    return _disjoint(sorted(runs, key=lambda r: (r.start_s, r.end_s)))


def _disjoint(runs: list[Run]) -> list[Run]:
    """One row per allocation: a row repeated by two sources (slurmdbd and scontrol) kept once."""
    out: list[Run] = []
    for r in runs:
        if out and r.start_s < out[-1].end_s:
            p = out[-1]
            out[-1] = Run(p.start_s, max(p.end_s, r.end_s), r.state if r.end_s >= p.end_s else p.state,
                          p.nodes or r.nodes)
        else:
            out.append(r)
    return out


def run_from_scontrol(text: str, tz: tzinfo | None = None) -> Run | None:
    """The allocation running now from one ``scontrol show job -o`` line (None if not running)."""
    f = parse_show_job(text)
    if f.get("JobState") not in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
        return None
    start = _time(f.get("StartTime", ""), tz, "scontrol StartTime")
    return Run(start, math.inf, "RUNNING", f.get("NodeList", "")) if math.isfinite(start) else None


def merge_runs(done: Sequence[Run], now: Run | None) -> list[Run]:
    """The finished allocations plus the one running now (sources overlap: kept once)."""
    return _disjoint(sorted([*done, *([now] if now else [])], key=lambda r: (r.start_s, r.end_s)))


def job_entities(fleet: Fleet, job: str) -> set[str]:
    """Names of every entity the job runs on: GPUs, nodes, NICs, their links and leaf switches
    (and, on a rail whose NICs sit under more than one leaf, those leaves' uplinks and spines:
    its traffic crosses them), storage, racks, loops."""
    j = fleet.index_of(Kind.JOB, job)
    gpus = np.flatnonzero(fleet.gpu_job == j)
    nodes = np.unique(fleet.gpu_node[gpus])
    nics = np.flatnonzero(np.isin(fleet.nic_node, nodes))
    links = fleet.nic_link[nics]
    out = {fleet.gpu_names[g] for g in gpus} | {fleet.node_names[n] for n in nodes}
    out |= {fleet.nic_names[i] for i in nics} | {fleet.link_names[k] for k in links if k >= 0}
    out |= _switches(fleet, nics, links)
    for kind, idx in ((Kind.STORAGE, fleet.node_storage[nodes]), (Kind.RACK, fleet.node_rack[nodes]),
                      (Kind.COOLING_LOOP, fleet.node_loop[nodes])):
        names = fleet.names(kind)
        out |= {names[i] for i in np.unique(idx) if 0 <= i < len(names)}
    return out


def _switches(fleet: Fleet, nics: np.ndarray, links: np.ndarray) -> set[str]:
    """The leaves the job's NIC links attach to; the uplinks and spines of the leaves of any
    rail on which its NICs sit under more than one leaf."""
    ok = links >= 0
    leaves = fleet.link_leaf[links[ok]]
    rails = fleet.nic_rail[nics[ok]]
    out = {fleet.switch_names[x] for x in np.unique(leaves) if x >= 0}
    crossing = [x for r in np.unique(rails) if np.unique(leaves[rails == r]).size > 1 for x in leaves[rails == r]]
    up = np.flatnonzero((fleet.link_nic < 0) & np.isin(fleet.link_leaf, crossing))
    out |= {fleet.link_names[k] for k in up} | {fleet.switch_names[x] for x in fleet.link_spine[up] if x >= 0}
    return out


def _seam(reasons: list[dict], kind: str) -> tuple[str, str]:
    """(seam, evidence text): the channel that scored highest, with its value."""
    if not reasons:
        return kind, ""
    r = max(reasons, key=lambda r: (r.get("score") or 0.0))
    v = r.get("value")
    return r["channel"], f"{r['channel']} {v:g} {r.get('unit') or ''}".rstrip() if v is not None else r["channel"]


def evidence_onset(flag_s: float, ticks_s: np.ndarray, watched_s: np.ndarray, floor_s: float = -math.inf,
                   lookback_s: float = EVIDENCE_LOOKBACK_S) -> float:
    """When the evidence behind a flag at ``flag_s`` began: the first of the unbroken run of the
    controller's ticks (``ticks_s``, the ledger's fleet series) up to the flag in which the entity
    was watched (``watched_s``: its rows in the ledger's entity series, kept while its GFS is at
    least `WATCH_GFS` or it is not healthy). Never before ``floor_s`` (its previous state change)
    nor ``lookback_s`` before the flag; ``flag_s`` itself when the ledger kept no such ticks."""
    ticks = np.sort(np.asarray(ticks_s, dtype=float))
    ticks = ticks[(ticks <= flag_s) & (ticks >= max(floor_s, flag_s - lookback_s))]
    seen = np.isin(ticks, np.asarray(watched_s, dtype=float))
    if not ticks.size or not seen[-1]:
        return flag_s
    gaps = np.flatnonzero(~seen)
    return float(ticks[gaps[-1] + 1] if gaps.size else ticks[0])


def _state_episodes(transitions: Iterable[dict]) -> list[Episode]:
    """An episode per stretch out of healthy; one that left healthy starts where its evidence
    began (the transition's ``evidence_since_s``, when the sources found it), not at the flag:
    the job's slow steps while the controller was still gathering evidence are the entity's."""
    out: list[Episode] = []
    open_: dict[str, tuple[float, State, str, str, str]] = {}
    last_change: dict[str, float] = {}
    for tr in sorted(transitions, key=lambda r: (r["t_s"], r.get("tick", 0))):
        ent, t, to = tr["entity"], float(tr["t_s"]), STATE_BY_LABEL.get(tr["to_state"], State.HEALTHY)
        start = t
        if ent in open_:
            t0, st, seam, why, kind = open_.pop(ent)
            out.append(Episode(t0, t, Cause.STRAGGLER, ent, seam, why, int(st)))
        elif to != State.HEALTHY and isinstance(tr.get("evidence_since_s"), (int, float)):
            start = min(t, max(float(tr["evidence_since_s"]), last_change.get(ent, -math.inf)))
        last_change[ent] = t
        if to != State.HEALTHY:
            seam, ev = _seam(tr.get("reasons") or [], tr["kind"])
            why = f"{tr['kind']} {ent} {to.label}" + (f" ({ev})" if ev else "")
            if start < t:
                why += f"; its evidence began {t - start:.1f} s before the flag"
            open_[ent] = (start, to, seam, why, tr["kind"])
            if to == State.FAILED:
                out.append(Episode(t, t, Cause.RESTART, ent, seam, f"{why}: a hard failure stops the job"))
    out += [Episode(t0, math.inf, Cause.STRAGGLER, e, seam, why, int(st))
            for e, (t0, st, seam, why, _k) in open_.items()]
    return out


def _action_episodes(actions: Iterable[dict], seams: dict[str, str]) -> list[Episode]:
    out: list[Episode] = []
    applied: dict[str, tuple[float, str, str, str]] = {}
    for a in sorted(actions, key=lambda r: (r["t_s"], r.get("tick", 0))):
        if a.get("status") != "done":
            continue
        try:
            verb = ActionKey.parse(a["key"]).verb
        except ValueError:
            continue
        who = a.get("cause") or a.get("target") or ""
        why = f"{verb.value} {a.get('target', '')} ({a.get('reason') or 'no reason recorded'})"
        seam = seams.get(who, verb.value)
        t = float(a["t_s"])
        if a.get("op") == "apply" and verb in RESTARTING:
            out.append(Episode(t, t, Cause.RESTART, who, seam, f"{why}: restarts the job's ranks"))
        elif verb in DEGRADING and a.get("op") == "apply":
            applied.setdefault(a["key"], (t, who, seam, why))
        elif verb in DEGRADING and a.get("op") == "revert" and a["key"] in applied:
            t0, w, s, y = applied.pop(a["key"])
            out.append(Episode(t0, t, Cause.DEGRADED, w, s, f"{y}: in effect"))
    out += [Episode(t0, math.inf, Cause.DEGRADED, w, s, f"{y}: in effect") for t0, w, s, y in applied.values()]
    return out


def _key_entity(key: str) -> str | None:
    try:
        return ActionKey.parse(key).entity
    except ValueError:  # a key written by a newer or older seamguard: not ours to read
        return None


def episodes_from_ledger(transitions: Iterable[dict], actions: Iterable[dict], job: str,
                         entities: set[str] | None) -> list[Episode]:
    """Episodes of the job's entities (every entity when ``entities`` is None) and of actions
    on them or on the job itself; ledger rows as `LedgerReader.transitions/actions` return them."""
    trs = [t for t in transitions if entities is None or t["entity"] in entities]
    states = _state_episodes(trs)
    seams = {e.entity: e.seam for e in states}
    mine = [a for a in actions if a.get("target") == job or entities is None or a.get("target") in entities
            or _key_entity(a.get("key", "")) == job]
    return states + _action_episodes(mine, seams)


def goodput_of(job: str, since_s: float, until_s: float, series: JobSeries, runs: Sequence[Run],
               transitions: Iterable[dict], actions: Iterable[dict], entities: set[str] | None) -> Goodput:
    """`attribute` over what the sources read: the ledger's rows become episodes first."""
    return attribute(job, since_s, until_s, series, runs, episodes_from_ledger(transitions, actions, job, entities))
