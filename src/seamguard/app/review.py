"""`seamguard review`: what the controller expected, against what happened afterwards.

Every decision in the ledger carries its expected benefit and cost and the entity whose
state caused it; every state change of every entity is in the ledger too. Afterwards one
can see, per verb, how often the cause went on to fail within a horizon (the failure the
action was priced against), recovered, or stayed unhealthy — and whether the hazard model
the economics use is calibrated on this fleet: for each entity that left healthy, the
model's probability of a hard failure within the horizon (``1 - exp(-h1 x GFS^2 x H)``,
GFS at least its state's entry threshold, docs/policy.md) against the share that did fail.
And for jobs with a deadline (decide/slip.py): each decision about such a job records the
job's forecast (``deadline_slip:<job>``, ``deadline_miss:<job>`` in its evidence); given when
each job actually ended (or its last step, ``--job-end``), :func:`slip_review` sets the
forecasts against the slip that happened: predicted vs observed finish and slip, and the
Brier score of P(miss).

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


def _forecasts(decisions: list[dict]) -> dict[str, list[dict]]:
    """Per job, in time order: every decided action's forecast of it (from its evidence)."""
    out: dict[str, dict[float, dict]] = defaultdict(dict)
    for d in decisions:
        if d["event"] != "decided":
            continue
        for e in d.get("evidence") or []:
            head, _, job = str(e["channel"]).partition(":")
            if not job or head not in ("deadline_slip", "deadline_miss"):
                continue
            row = out[job].setdefault(float(d["t_s"]), {"t_s": float(d["t_s"])})
            if head == "deadline_slip":
                row["expected_slip_s"], row["deadline_s"] = float(e["score"]), float(e["value"])
            else:
                row["p_miss"], row["expected_finish_s"] = float(e["score"]), float(e["value"])
    return {j: [r for _, r in sorted(rows.items()) if len(r) == 5] for j, rows in out.items()}


def slip_review(decisions: list[dict], ended_s: dict[str, float]) -> dict:
    """Per job with a recorded forecast: the first and last forecast before it ended against what happened.

    ``ended_s``: job -> Unix seconds it ended (or of its last step). A job not in it is ``open``
    (nothing to compare yet). Observed slip is ``max(0, end - deadline)``; the summary gives the
    mean absolute error of the last forecast's finish and slip, and the Brier score of its P(miss)."""
    jobs: list[dict] = []
    for job, rows in sorted(_forecasts(decisions).items()):
        end = ended_s.get(job)
        rows = [r for r in rows if end is None or r["t_s"] <= end]
        if not rows:
            continue
        first, last = rows[0], rows[-1]
        row = {"job": job, "deadline_s": last["deadline_s"], "forecasts": len(rows),
               "first": {k: first[k] for k in ("t_s", "expected_finish_s", "expected_slip_s", "p_miss")},
               "last": {k: last[k] for k in ("t_s", "expected_finish_s", "expected_slip_s", "p_miss")},
               "ended_s": end}
        if end is not None:
            slip = max(end - last["deadline_s"], 0.0)
            row.update(observed_slip_s=round(slip, 1), missed=slip > 0,
                       finish_error_s=round(last["expected_finish_s"] - end, 1),
                       slip_error_s=round(last["expected_slip_s"] - slip, 1))
        jobs.append(row)
    done = [r for r in jobs if r["ended_s"] is not None]
    summary = {"jobs": len(jobs), "ended": len(done)}
    if done:
        summary.update(
            finish_mae_s=round(float(np.mean([abs(r["finish_error_s"]) for r in done])), 1),
            slip_mae_s=round(float(np.mean([abs(r["slip_error_s"]) for r in done])), 1),
            p_miss_brier=round(float(np.mean([(r["last"]["p_miss"] - float(r["missed"])) ** 2 for r in done])), 4))
    return {"jobs": jobs, "summary": summary}


def parse_job_ends(items: list[str]) -> dict[str, float]:
    """``--job-end JOB=TIME`` values -> job -> Unix seconds; a ConfigError naming the one that is wrong."""
    from seamguard.app.config import ConfigError
    from seamguard.app.slurm_placement import parse_deadline

    out: dict[str, float] = {}
    for item in items:
        job, sep, when = item.partition("=")
        if not sep or not job:
            raise ConfigError(f"--job-end {item!r}: expected JOB=TIME (ISO 8601 with timezone)")
        try:
            out[job] = parse_deadline(when, f"--job-end {job}")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return out


def render_slip(review: dict) -> list[str]:
    lines = ["deadlines: the last forecast before each job ended against what happened:"]
    if not review["jobs"]:
        return lines + ["  no decision recorded a job with a deadline"]
    for r in review["jobs"]:
        last = r["last"]
        head = (f"  {r['job']:<28} predicted slip {last['expected_slip_s']:>8.0f} s, P(miss) {last['p_miss']:.2f}")
        if r["ended_s"] is None:
            lines.append(head + ", not ended (give --job-end)")
        else:
            lines.append(head + f"; observed slip {r['observed_slip_s']:>8.0f} s "
                                f"({'missed' if r['missed'] else 'on time'}), finish off by {r['finish_error_s']:+.0f} s")
    s = review["summary"]
    if s.get("ended"):
        lines.append(f"  {s['ended']} ended: finish MAE {s['finish_mae_s']:.0f} s, slip MAE {s['slip_mae_s']:.0f} s, "
                     f"P(miss) Brier {s['p_miss_brier']:.3f}")
    return lines


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

