"""Calibrate the twin on the fleet's own history: ledger rows and scheduler runs in, one document out. Pure.

Why this file exists: `seamguard twin calibrate` (app/twin_cli.py, which reads the topology, the
ledger and sacct) hands its rows here; `twin simulate --calibrated` (twin/calibrated.py) reads
the document back. Every estimate carries the count it rests on and the records it came from:

- **hazards**, per domain (the ledger's entity kind: gpu, node, nic, link, switch,
  cooling_loop, storage) and class (``hard``: the entity reached ``failed``; ``gray``: it left
  healthy without failing): ``count / (entities x days)``, with the exact Poisson (Garwood)
  interval ``[chi2(a/2, 2k)/2, chi2(1-a/2, 2k+2)/2] / exposure``;
- **durations** of those incidents (leaving healthy -> healthy again: repair for hard ones)
  and the scheduler's **recovery** (an allocation that ended by a failure, `_INTERRUPTED`, -> the
  job's next start): empirical quantiles and a lognormal fitted to the logs, with n;
- **detection**: per incident the time from the entity leaving healthy to the controller's
  first applied action on it, and the incidents it closed without acting (misses);
- **checkpoint** write and restore seconds, where the runtime's measurements were given, and
  each job's own snapshot stall from its series (`snapshot_stall`).

A (domain, class) with fewer than `MIN_EVENTS` incidents keeps the published prior the
caller passes (twin/events/calibration.py), and says so (``source: prior``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from seamguard.decide.actions import ActionKey

__all__ = ["MIN_EVENTS", "SCHEMA", "Incident", "JobRun", "garwood", "incidents", "lognormal_fit", "calibrate",
           "snapshot_stall", "published_priors"]

SCHEMA = "seamguard.twin.calibrated/1"
MIN_EVENTS = 3  # below this a rate's interval spans orders of magnitude: keep the prior
MAX_IDS = 2000  # record ids listed per estimate (the count and time span are always given)
HARD, GRAY = "hard", "gray"
# How an allocation ends when something struck it (sacct states; the job-completion log writes the
# state a requeued job went back to, PENDING). CANCELLED, TIMEOUT, COMPLETED and RUNNING are not failures.
_INTERRUPTED = ("NODE_FAIL", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "FAILED", "PREEMPTED", "BOOT_FAIL",
                "OUT_OF_MEMORY", "PENDING")


@dataclass(frozen=True)
class Incident:
    """One entity's stay out of healthy, from the ledger's transitions."""

    domain: str
    entity: str
    cls: str  # HARD or GRAY
    start_s: float
    end_s: float  # math.inf: still open at the window's end
    ticks: tuple[int, ...]  # the ledger ticks of the transition rows that opened, worsened and closed it


@dataclass(frozen=True)
class JobRun:
    """One allocation of a job by the scheduler (sacct row or the running one)."""

    job: str
    start_s: float
    end_s: float
    state: str
    gpus: int = 0


def garwood(count: int, exposure: float, conf: float = 0.95) -> tuple[float, float]:
    """Exact Poisson interval on ``count / exposure`` (Garwood 1936)."""
    if exposure <= 0:
        return math.nan, math.nan
    a = 1.0 - conf
    lo = 0.0 if count == 0 else stats.chi2.ppf(a / 2, 2 * count) / 2.0
    hi = stats.chi2.ppf(1 - a / 2, 2 * count + 2) / 2.0
    return float(lo) / exposure, float(hi) / exposure


def incidents(transitions: Iterable[Mapping]) -> list[Incident]:
    """Each entity's stays out of healthy, oldest first; rows as the ledger reader returns them."""
    out: list[Incident] = []
    open_: dict[str, Incident] = {}  # entity -> its open incident (end_s inf), grown row by row
    for tr in sorted(transitions, key=lambda r: (float(r["t_s"]), r.get("tick") or 0)):
        ent, t, to, tick = tr["entity"], float(tr["t_s"]), tr["to_state"], int(tr.get("tick") or 0)
        cur = open_.get(ent)
        if cur is not None:
            cur = replace(cur, cls=HARD if to == "failed" else cur.cls, ticks=(*cur.ticks, tick))
            if to == "healthy":
                out.append(replace(cur, end_s=t))
                del open_[ent]
            else:
                open_[ent] = cur
        elif to != "healthy":
            open_[ent] = Incident(tr["kind"], ent, HARD if to == "failed" else GRAY, t, math.inf, (tick,))
    return sorted([*out, *open_.values()], key=lambda i: i.start_s)


def lognormal_fit(values_s: Sequence[float]) -> dict:
    """Quantiles, the sample mean with its 95 % interval (t), a lognormal fit (mu, sigma of ln s), and n.

    The mean is the sample's own, not the lognormal's: a fit to the logs misstates the mean of
    a distribution that is not lognormal (by +28 % for an exponential one)."""
    v = np.asarray([x for x in values_s if x > 0 and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return {"n": 0}
    logs = np.log(v)
    mu, sigma = float(logs.mean()), float(logs.std(ddof=1)) if v.size > 1 else 0.0
    mean = float(v.mean())
    half = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else None
    return {"n": int(v.size), "p10_s": float(np.quantile(v, 0.1)), "p50_s": float(np.quantile(v, 0.5)),
            "p90_s": float(np.quantile(v, 0.9)), "mean_s": mean,
            "mean_ci95_s": [max(mean - half, 0.0), mean + half] if half is not None else None,
            "lognormal": {"mu": mu, "sigma": sigma}}


def _records(items: Sequence[Incident]) -> dict:
    """Where an estimate came from: each incident as [entity, left healthy at, back at] (its transition
    rows in the ledger), the ticks of those rows, and the time span."""
    span = [min(i.start_s for i in items), max(i.start_s for i in items)] if items else None
    return {"incidents": [[i.entity, i.start_s, i.end_s] for i in items[:MAX_IDS]], "total": len(items),
            "ticks": sorted({t for i in items for t in i.ticks})[:MAX_IDS], "span_s": span}


def _hazards(incs: Sequence[Incident], exposure: Mapping[str, int], days: float,
             priors: Mapping[tuple[str, str], dict]) -> list[dict]:
    by: dict[tuple[str, str], list[Incident]] = defaultdict(list)
    for i in incs:
        by[(i.domain, i.cls)].append(i)
    out = []
    for dom, cls in sorted({*by, *((d, c) for d in exposure for c in (HARD, GRAY))}):
        items, n_ent = by.get((dom, cls), []), exposure.get(dom, 0)
        ent_days = n_ent * days
        lo, hi = garwood(len(items), ent_days)
        row = {"domain": dom, "class": cls, "count": len(items), "entities": n_ent, "entity_days": ent_days,
               "rate_per_entity_day": len(items) / ent_days if ent_days > 0 else None,
               "ci95_per_entity_day": [lo, hi] if ent_days > 0 else None, "records": _records(items)}
        prior = priors.get((dom, cls))
        if len(items) >= MIN_EVENTS and ent_days > 0:
            row["source"] = "measured"
        elif prior is not None:
            row.update(source="prior", prior=prior, why=f"{len(items)} incidents (< {MIN_EVENTS}): the prior is used")
        else:
            row.update(source="measured" if ent_days > 0 else "none",
                       why=f"{len(items)} incidents and no published prior for {dom}/{cls}")
        out.append(row)
    return out


def _durations(incs: Sequence[Incident], priors: Mapping[tuple[str, str], dict]) -> list[dict]:
    by: dict[tuple[str, str], list[Incident]] = defaultdict(list)
    for i in incs:
        by[(i.domain, i.cls)].append(i)
    out = []
    for (dom, cls), items in sorted(by.items()):
        closed = [i for i in items if math.isfinite(i.end_s)]
        row = {"domain": dom, "class": cls, **lognormal_fit([i.end_s - i.start_s for i in closed]),
               "still_open": len(items) - len(closed), "records": _records(closed)}
        if len(closed) < MIN_EVENTS and (dom, cls) in priors:
            row.update(source="prior", prior=priors[(dom, cls)], why=f"{len(closed)} closed (< {MIN_EVENTS})")
        else:
            row["source"] = "measured"
        out.append(row)
    return out


def _detection(incs: Sequence[Incident], actions: Iterable[Mapping]) -> dict:
    first: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for a in actions:
        if a.get("op") != "apply" or a.get("status") not in (None, "done"):
            continue
        try:
            ent = ActionKey.parse(str(a.get("key", ""))).entity
        except ValueError:
            continue
        first[ent].append((float(a["t_s"]), str(a.get("key"))))
    delays, acted, missed = [], [], []
    for i in incs:
        hit = min(((t, aid) for t, aid in first.get(i.entity, ()) if i.start_s <= t <= i.end_s), default=None)
        if hit is not None:
            delays.append(hit[0] - i.start_s)
            acted.append(hit[1])
        elif math.isfinite(i.end_s):
            missed.append(i)
    closed = sum(math.isfinite(i.end_s) for i in incs)
    return {"incidents": len(incs), "acted": len(acted), "missed": len(missed),
            "miss_fraction": len(missed) / closed if closed else None,
            "miss_ci95": list(stats.beta.interval(0.95, len(missed) + 0.5, closed - len(missed) + 0.5))
            if closed else None,  # Jeffreys interval
            "delay": lognormal_fit(delays), "actions": acted[:MAX_IDS],
            "missed_records": _records(missed)}


def _jobs(runs: Sequence[JobRun], since_s: float, until_s: float) -> tuple[dict, dict]:
    per: dict[str, list[JobRun]] = defaultdict(list)
    for r in runs:
        per[r.job].append(r)
    jobs, gaps, gap_runs = {}, [], []
    for job, rs in sorted(per.items()):
        rs.sort(key=lambda r: r.start_s)
        ends = [r for r in rs if (r.state.split() or [""])[0] in _INTERRUPTED and math.isfinite(r.end_s)]
        run_h = sum(max(0.0, min(r.end_s, until_s) - max(r.start_s, since_s)) for r in rs) / 3600.0
        for a, b in zip(rs, rs[1:]):
            if a in ends and b.start_s >= a.end_s:
                gaps.append(b.start_s - a.end_s)
                gap_runs.append([a.start_s, a.end_s, b.start_s])
        lo, hi = garwood(len(ends), run_h)
        jobs[job] = {"allocations": len(rs), "interruptions": len(ends), "run_h": run_h,
                     "gpus": max((r.gpus for r in rs), default=0),
                     "interruptions_per_h": len(ends) / run_h if run_h > 0 else None,
                     "ci95_per_h": [lo, hi] if run_h > 0 else None,
                     "interrupted_runs": [[r.start_s, r.end_s, r.state] for r in ends][:MAX_IDS]}
    recovery = {**lognormal_fit(gaps), "records": {"runs_start_end_next_s": gap_runs[:MAX_IDS]}}
    return jobs, recovery


def calibrate(transitions: Sequence[Mapping], actions: Sequence[Mapping], runs: Sequence[JobRun],
              exposure: Mapping[str, int], since_s: float, until_s: float,
              priors: Mapping[tuple[str, str], dict], duration_priors: Mapping[tuple[str, str], dict],
              checkpoint: Mapping | None = None) -> dict:
    """The calibrated twin document (module docstring) for the window ``[since_s, until_s]``.

    ``exposure``: entities of each domain in the topology; ``priors``/``duration_priors``:
    the published rate (``rate_per_entity_day``) / duration (``mean_s``) per (domain, class),
    with their source; ``checkpoint``: the runtime's measured write/restore seconds and where
    they came from (None: not measured, the twin keeps its defaults)."""
    if not until_s > since_s:
        raise ValueError(f"the window is empty ({since_s} .. {until_s})")
    days = (until_s - since_s) / 86400.0
    incs = [i for i in incidents(transitions) if since_s <= i.start_s <= until_s]
    jobs, recovery = _jobs(runs, since_s, until_s)
    recovery["source"] = "measured" if recovery.get("n", 0) >= MIN_EVENTS else "prior"
    return {"schema": SCHEMA, "window": {"since_s": since_s, "until_s": until_s, "days": days},
            "min_events": MIN_EVENTS, "hazards": _hazards(incs, exposure, days, priors),
            "durations": _durations(incs, duration_priors), "detection": _detection(incs, actions),
            "recovery": recovery, "jobs": jobs,
            "checkpoint": dict(checkpoint) if checkpoint else {"source": "prior", "why": "no runtime measurement given"}}


def snapshot_stall(t_s: Sequence[float], stall_s: Sequence[float]) -> dict:
    """The runtime's own snapshot stall of one job: the fit of its steps that waited on a snapshot copy.

    ``stall_s`` is the slowest rank's wait in its last step (``seamguard_rank_checkpoint_stall_seconds``)
    at times ``t_s``; steps that took no snapshot read 0 and are left out."""
    t, v = np.asarray(t_s, dtype=float), np.asarray(stall_s, dtype=float)
    hit = np.isfinite(v) & (v > 0)
    return {**lognormal_fit(v[hit].tolist()), "source": "measured" if hit.sum() >= MIN_EVENTS else "prior",
            "records": {"series": "max over ranks of seamguard_rank_checkpoint_stall_seconds",
                        "samples": int(np.isfinite(v).sum()),
                        "span_s": [float(t[hit].min()), float(t[hit].max())] if hit.any() else None}}


def published_priors(fm, nodes_per_loop: int = 64) -> tuple[dict, dict]:
    """(rate priors, duration priors) per (domain, class) from the twin's FailureModel ``fm``
    (twin/events/calibration.py: Llama 3 per-cause counts, FALCON fail-slows, assumed cooling)."""
    from seamguard.twin.events.calibration import COMPONENTS_PER_NODE

    src_hard = "Llama 3 Table 5 (arXiv 2407.21783), twin/events/calibration.py"
    rates: dict[tuple[str, str], dict] = {}
    for comp in COMPONENTS_PER_NODE:
        r = sum(c.rate_per_component_day for c in fm.causes if c.component == comp)
        if r > 0:
            rates[(comp, HARD)] = {"rate_per_entity_day": r, "from": src_hard}
    rates[("node", GRAY)] = {"rate_per_entity_day": fm.fail_slow_per_node_day, "from": "FALCON (ATC'25) fail-slows"}
    rates[("cooling_loop", GRAY)] = {"rate_per_entity_day": fm.cooling_event_per_loop_day, "from": "assumed"}
    rates[("cooling_loop", HARD)] = {"rate_per_entity_day": fm.cooling_event_per_loop_day * fm.cooling_trip_probability,
                                     "from": "assumed"}
    repair = {"mean_s": fm.repair_mean_h * 3600.0, "from": "assumed (twin FailureModel.repair_mean_h)"}
    slow = fm.fail_slow_comm_share * fm.fail_slow_comm_mean_min + (1 - fm.fail_slow_comm_share) * \
        fm.fail_slow_compute_mean_min
    durations = {(c, HARD): repair for c in COMPONENTS_PER_NODE}
    durations[("node", GRAY)] = {"mean_s": slow * 60.0, "from": "FALCON (ATC'25) fail-slow durations"}
    durations[("cooling_loop", GRAY)] = {"mean_s": fm.cooling_event_mean_h * 3600.0, "from": "assumed"}
    return rates, durations
