"""`seamguard review`: what the controller expected, against what happened afterwards.

Every decision in the ledger carries its expected benefit and cost and the entity whose
state caused it; every state change of every entity is in the ledger too. Afterwards one
can see, per verb, how often the cause went on to fail within a horizon (the failure the
action was priced against), recovered, or stayed unhealthy — and whether the hazard model
the economics use is calibrated on this fleet: for each entity that left healthy, the
model's probability of a hard failure within the horizon (``1 - exp(-h1 x GFS^2 x H)``,
GFS at least its state's entry threshold, docs/policy.md) against the share that did fail.

Pure functions over the ledger's rows (dicts, as ``Ledger.decisions`` / ``transitions``
return them); the CLI command reads the ledger and prints.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

FAILED, HEALTHY = "failed", "healthy"
BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.4, 1.0000001)


@dataclass(frozen=True)
class Outcome:
    key: str
    verb: str
    cause: str
    t_s: float
    outcome: str  # failed | recovered | unhealthy | open (the horizon has not passed yet)
    after_s: float | None  # seconds from the decision to the failure or recovery
    benefit_gpu_h_per_h: float
    cost_gpu_h_per_h: float


def _timelines(transitions: list[dict]) -> dict[str, list[tuple[float, str]]]:
    out: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for t in transitions:
        out[t["entity"]].append((float(t["t_s"]), t["to_state"]))
    for v in out.values():
        v.sort()
    return out


def _fate(line: list[tuple[float, str]], t0: float, horizon_s: float, end_s: float) -> tuple[str, float | None]:
    """What became of an entity within ``horizon_s`` after ``t0``: failed first, else healthy, else neither."""
    recovered = None
    for t, state in line:
        if t <= t0:
            continue
        if t > t0 + horizon_s:
            break
        if state == FAILED:
            return "failed", t - t0
        if state == HEALTHY and recovered is None:
            recovered = t - t0
    if recovered is not None:
        return "recovered", recovered
    return ("unhealthy", None) if t0 + horizon_s <= end_s else ("open", None)


def decision_outcomes(decisions: list[dict], transitions: list[dict], end_s: float,
                      horizon_s: float) -> list[Outcome]:
    """Each decided action (first decision per key) and what became of its cause."""
    lines = _timelines(transitions)
    out, seen = [], set()
    for d in sorted(decisions, key=lambda d: d["t_s"]):
        if d["event"] != "decided" or d["key"] in seen or not d.get("cause"):
            continue
        seen.add(d["key"])
        fate, after = _fate(lines.get(d["cause"], []), float(d["t_s"]), horizon_s, end_s)
        out.append(Outcome(d["key"], d["verb"], d["cause"], float(d["t_s"]), fate, after,
                           float(d.get("benefit_gpu_h_per_h") or 0.0), float(d.get("cost_gpu_h_per_h") or 0.0)))
    return out


def by_verb(outcomes: list[Outcome]) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for verb in sorted({o.verb for o in outcomes}):
        mine = [o for o in outcomes if o.verb == verb]
        fails = [o.after_s for o in mine if o.outcome == "failed"]
        rows[verb] = {"decided": len(mine), **{k: sum(o.outcome == k for o in mine)
                                               for k in ("failed", "recovered", "unhealthy", "open")},
                      "median_s_to_failure": float(np.median(fails)) if fails else None,
                      "expected_benefit_gpu_h_per_h": round(sum(o.benefit_gpu_h_per_h for o in mine), 4),
                      "expected_cost_gpu_h_per_h": round(sum(o.cost_gpu_h_per_h for o in mine), 4)}
    return rows


def predicted_failure(gfs: float, state: str, horizon_h: float, h1: float, floors: dict[str, float]) -> float:
    """The economics' P(hard failure within the horizon) for an entity entering ``state`` at ``gfs``."""
    g = max(float(gfs or 0.0), floors.get(state, 0.0))
    return -math.expm1(-h1 * g * g * horizon_h)


def calibration(transitions: list[dict], end_s: float, horizon_s: float, h1: float, floors: dict[str, float],
                kinds: tuple[str, ...] = ("gpu", "node")) -> list[dict]:
    """Per bucket of predicted probability: entities that left healthy, predicted vs observed failure share.

    Only episodes whose horizon has passed (or that failed within it) count; an episode
    entering ``failed`` directly is left out (it predicts nothing)."""
    lines = _timelines(transitions)
    pred, obs = [], []
    for t in transitions:
        if t["kind"] not in kinds or t["from_state"] != HEALTHY or t["to_state"] in (HEALTHY, FAILED):
            continue
        fate, _ = _fate(lines[t["entity"]], float(t["t_s"]), horizon_s, end_s)
        if fate == "open":
            continue
        pred.append(predicted_failure(t["gfs"], t["to_state"], horizon_s / 3600.0, h1, floors))
        obs.append(1.0 if fate == "failed" else 0.0)
    p, o = np.asarray(pred), np.asarray(obs)
    rows = []
    for lo, hi in zip(BUCKETS[:-1], BUCKETS[1:]):
        m = (p >= lo) & (p < hi)
        if m.any():
            rows.append({"predicted_range": [lo, min(hi, 1.0)], "episodes": int(m.sum()),
                         "predicted_mean": round(float(p[m].mean()), 4), "observed_share": round(float(o[m].mean()), 4),
                         "brier": round(float(((p[m] - o[m]) ** 2).mean()), 4)})
    return rows


def render(verbs: dict[str, dict], calib: list[dict], horizon_s: float) -> str:
    h = f"{horizon_s / 3600:g} h"
    lines = [f"decisions and what became of their cause within {h}:",
             f"  {'verb':<20} {'decided':>7} {'failed':>7} {'recovered':>9} {'unhealthy':>9} {'open':>5} "
             f"{'median s to fail':>16}"]
    for verb, r in verbs.items():
        med = "-" if r["median_s_to_failure"] is None else f"{r['median_s_to_failure']:.0f}"
        lines.append(f"  {verb:<20} {r['decided']:>7} {r['failed']:>7} {r['recovered']:>9} {r['unhealthy']:>9} "
                     f"{r['open']:>5} {med:>16}")
    lines.append(f"hazard model calibration (entities leaving healthy; P(failure within {h})):")
    if not calib:
        lines.append("  no episode whose horizon has passed")
    for r in calib:
        lo, hi = r["predicted_range"]
        lines.append(f"  predicted {lo:.2f}-{hi:.2f}: {r['episodes']:>5} episodes, predicted {r['predicted_mean']:.3f}, "
                     f"observed {r['observed_share']:.3f}, Brier {r['brier']:.3f}")
    return "\n".join(lines)


def read_all(fetch, page: int = 10_000) -> list[dict]:
    """Every row of a paged ledger query (``fetch(limit=, offset=)``, newest first)."""
    rows, offset = [], 0
    while True:
        got = fetch(limit=page, offset=offset)
        rows += got
        if len(got) < page:
            return rows
        offset += page

