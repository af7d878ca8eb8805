"""The event twin's failures written as a ledger and a scheduler would have written them.

Why this file exists: calibration (twin/calibrate.py) is checked by calibrating on a history
whose true rates are known. This turns one run's exogenous streams (twin/events/processes.py)
into ledger-like rows — a transition out of healthy and back per incident, an applied action
after a detection delay (or none: a miss) — and the sacct-like allocations of the job that
spans the non-spare nodes (a hard failure on one of them ends the allocation; the next starts
after a recovery time). `window` cuts streams to a time span for holdout checks. Pure: rows
out, no files; the seed decides everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from seamguard.twin.calibrate import JobRun
from seamguard.twin.events.calibration import COMPONENTS_PER_NODE
from seamguard.twin.events.config import ClusterConfig
from seamguard.twin.events.processes import Streams

__all__ = ["HistoryTruth", "History", "exposure", "history_from_streams", "window", "JOB"]

JOB = "twin-job"
_FIELDS_BY_STREAM = {
    "fail": ("fail_t", "fail_cause", "fail_node", "fail_nnodes", "fail_has_precursor", "fail_lead_s"),
    "planned": ("planned_t", "planned_node"),
    "slow": ("slow_t", "slow_node", "slow_comm", "slow_dur_s", "slow_sev"),
    "flap": ("flap_t", "flap_node"),
    "cool": ("cool_t", "cool_loop", "cool_dur_s", "cool_trip"),
}


@dataclass(frozen=True)
class HistoryTruth:
    """What the history's controller and scheduler did, drawn (the values a calibration should find)."""

    detect_mean_s: float = 120.0
    """Mean time from an entity leaving healthy to the controller's action (exponential)."""
    miss_fraction: float = 0.1
    """Share of incidents the controller never acts on."""
    recovery_median_s: float = 600.0
    """Median time from an interrupted allocation to the job's next start (lognormal)."""
    recovery_sigma: float = 0.5
    """Sigma of ln(recovery seconds)."""


@dataclass(frozen=True)
class History:
    """Ledger-like rows of one run: `LedgerReader.transitions` / `.actions` shapes, and JobRuns."""

    transitions: list[dict]
    actions: list[dict]
    runs: list[JobRun]


def exposure(cfg: ClusterConfig) -> dict[str, int]:
    """Entities per domain of the twin's cluster (the topology a calibration divides by)."""
    out = {comp: int(round(cfg.nodes * per)) for comp, per in COMPONENTS_PER_NODE.items()}
    out["cooling_loop"] = max(1, -(-cfg.nodes // cfg.nodes_per_loop))
    return out


def window(s: Streams, t0_s: float, t1_s: float) -> Streams:
    """The events of ``s`` in ``[t0_s, t1_s)``, their times shifted to start at 0."""
    out = {}
    for fields in _FIELDS_BY_STREAM.values():
        t = getattr(s, fields[0])
        keep = (t >= t0_s) & (t < t1_s)
        out[fields[0]] = t[keep] - t0_s
        out.update({f: getattr(s, f)[keep] for f in fields[1:]})
    return replace(s, **out)


class _Rows:
    def __init__(self) -> None:
        self.transitions: list[dict] = []
        self.actions: list[dict] = []

    def incident(self, kind: str, entity: str, t0: float, t1: float, worst: str, act_at: float | None) -> None:
        n = len(self.transitions)
        self.transitions.append({"id": n + 1, "tick": 0, "t_s": t0, "kind": kind, "entity": entity,
                                 "from_state": "healthy", "to_state": worst, "reasons": []})
        self.transitions.append({"id": n + 2, "tick": 0, "t_s": t1, "kind": kind, "entity": entity,
                                 "from_state": worst, "to_state": "healthy", "reasons": []})
        if act_at is not None:
            self.actions.append({"id": len(self.actions) + 1, "tick": 0, "t_s": act_at, "op": "apply",
                                 "key": f"drain:{entity}", "status": "done"})


def history_from_streams(cfg: ClusterConfig, s: Streams, rng: np.random.Generator,
                         truth: HistoryTruth = HistoryTruth()) -> History:
    """The rows a ledger and sacct would hold for the streams ``s`` on the cluster ``cfg``.

    Hard failures: ``failed`` until repaired (exponential, the model's ``repair_mean_h``, as
    the simulator draws it); fail-slows (node) and cooling degradations (loop): ``degraded``
    for their drawn duration. Each incident is acted on after ``detect_mean_s`` on average,
    or missed with ``miss_fraction``."""
    fm, rows = cfg.failures, _Rows()
    repair = rng.exponential(fm.repair_mean_h * 3600.0, s.fail_t.size)
    events = [(float(t), fm.causes[int(c)].component, f"{fm.causes[int(c)].component}-{int(n)}-{i}",
               float(t) + float(r), "failed") for i, (t, c, n, r) in enumerate(zip(s.fail_t, s.fail_cause,
                                                                                  s.fail_node, repair))]
    events += [(float(t), "node", f"node-{int(n)}-slow{i}", float(t + d), "degraded")
               for i, (t, n, d) in enumerate(zip(s.slow_t, s.slow_node, s.slow_dur_s))]
    events += [(float(t), "cooling_loop", f"loop-{int(k)}-{i}", float(t + d), "degraded")
               for i, (t, k, d) in enumerate(zip(s.cool_t, s.cool_loop, s.cool_dur_s))]
    events.sort()
    delays = rng.exponential(truth.detect_mean_s, len(events))
    missed = rng.random(len(events)) < truth.miss_fraction
    for (t0, kind, ent, t1, worst), d, miss in zip(events, delays, missed):
        act = None if miss or t0 + d > t1 else t0 + d
        rows.incident(kind, ent, t0, t1, worst, act)
    return History(rows.transitions, rows.actions, _job_runs(cfg, s, rng, truth))


def _job_runs(cfg: ClusterConfig, s: Streams, rng: np.random.Generator, truth: HistoryTruth) -> list[JobRun]:
    """One job on the non-spare nodes: each hard failure on them ends its allocation."""
    usable, gpus = cfg.nodes - cfg.spare_nodes, (cfg.nodes - cfg.spare_nodes) * cfg.gpus_per_node
    hits = np.sort(s.fail_t[s.fail_node < usable])
    runs, start = [], 0.0
    for t in hits:
        if t < start:  # struck while it was not running: nothing to end
            continue
        runs.append(JobRun(JOB, start, float(t), "NODE_FAIL", gpus))
        start = float(t) + float(rng.lognormal(math.log(truth.recovery_median_s), truth.recovery_sigma))
    if start < cfg.horizon_s:
        runs.append(JobRun(JOB, start, cfg.horizon_s, "COMPLETED", gpus))
    return runs
