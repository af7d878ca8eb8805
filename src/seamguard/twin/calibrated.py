"""The twin on a calibrated document: failure processes from the fleet's history, answers with intervals. Pure.

Why this file exists: `twin simulate --calibrated FILE` (app/twin_cli.py) must draw from the
rates `seamguard twin calibrate` measured (twin/calibrate.py) instead of the published
priors, and answer per job with intervals over seeds *and* over the estimates' own
uncertainty. Each parameter draw takes every measured rate from its Jeffreys posterior
Gamma(k + 1/2, exposure) (whose central 95 % lies inside the Garwood interval the document
states) and every measured mean duration from a normal on its stated interval; prior-backed
entries keep the prior. Per draw and seed:

- `failure_model`: the twin's FailureModel with the calibrated rates (hard: every cause of
  that component scaled to the measured total; gray node: fail-slows; gray cooling_loop:
  cooling degradations), durations and repair mean;
- `recommend`: per job, the checkpoint interval and tier (storage or peer memory) maximising
  ETTR over a first-order renewal run (Poisson failures at the job's hazard, each losing the
  work since the last checkpoint, the restore and a recovery drawn from the measured
  distribution), the hot spares covering the job's nodes in repair at once (finite source:
  each of its n nodes is down a share rho / (1 + rho) of the time, rho = the node's hazard x
  mean repair, so the count is Binomial(n, that share), at `SPARE_QUANTILE`; never more than
  n, and Poisson(n rho) while rho is small) and the release-slip probability (decide/slip.py
  `slip_forecast`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from seamguard.decide.slip import slip_forecast
from seamguard.twin.calibrate import HARD, GRAY, MIN_EVENTS, SCHEMA
from seamguard.reliability import Scope
from seamguard.twin.events.calibration import COMPONENTS_PER_NODE, CauseSpec, FailureModel
from seamguard.twin.events.config import PolicyParams
from seamguard.twin.events.detection import DetectionModel

__all__ = ["JobAsk", "check", "failure_model", "job_hazard_per_h", "recommend", "seamguard_params", "SPARE_QUANTILE"]

SPARE_QUANTILE = 0.99  # hot spares cover the nodes in repair at once this often
INTERVALS_S = np.geomspace(30.0, 6 * 3600.0, 60)  # candidate checkpoint intervals, 30 s to 6 h
PEER_STALL_FACTOR = 1.25  # replication to a peer: a quarter more than the local copy (twin's tier_costs)


def check(doc: object, where: str) -> dict:
    """The document if it is a calibrated twin config, else ValueError naming ``where`` and the field."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{where}: not a calibrated twin config (schema {SCHEMA!r} expected)")
    for key in ("window", "hazards", "durations", "recovery", "jobs", "checkpoint"):
        if key not in doc:
            raise ValueError(f"{where}: missing {key!r}")
    for i, h in enumerate(doc["hazards"]):
        if not isinstance(h, dict) or h.get("class") not in (HARD, GRAY) or not isinstance(h.get("domain"), str):
            raise ValueError(f"{where}: hazards[{i}]: needs domain and class (hard|gray)")
        if h.get("source") == "measured" and not (isinstance(h.get("entity_days"), (int, float))
                                                 and h["entity_days"] > 0 and isinstance(h.get("count"), int)):
            raise ValueError(f"{where}: hazards[{i}] ({h['domain']}/{h['class']}): measured without count/entity_days")
    return doc


def _rate(h: Mapping, rng: np.random.Generator | None) -> float | None:
    """Per entity-day: the point estimate, or a posterior draw; the prior's where the row says so."""
    if h.get("source") == "prior":
        return float(h["prior"]["rate_per_entity_day"])
    if h.get("source") != "measured":
        return None
    if rng is None:
        return h["count"] / h["entity_days"]
    return float(rng.gamma(h["count"] + 0.5, 1.0 / h["entity_days"]))


def _mean_s(d: Mapping, rng: np.random.Generator | None) -> float | None:
    if d.get("source") == "prior":
        return float(d["prior"]["mean_s"])
    m, ci = d.get("mean_s"), d.get("mean_ci95_s")
    if m is None:
        return None
    if rng is None or not ci:
        return float(m)
    return max(float(rng.normal(m, (ci[1] - ci[0]) / (2 * 1.96))), 1.0)


def rates(doc: Mapping, rng: np.random.Generator | None = None) -> dict[tuple[str, str], float]:
    """(domain, class) -> rate per entity-day: point estimates, or one draw."""
    return {(h["domain"], h["class"]): r for h in doc["hazards"] if (r := _rate(h, rng)) is not None}


def means_s(doc: Mapping, rng: np.random.Generator | None = None) -> dict[tuple[str, str], float]:
    return {(d["domain"], d["class"]): m for d in doc["durations"] if (m := _mean_s(d, rng)) is not None}


def failure_model(doc: Mapping, base: FailureModel, rng: np.random.Generator | None = None) -> FailureModel:
    """``base`` with the document's rates and durations (point estimates, or one draw)."""
    r, m = rates(doc, rng), means_s(doc, rng)
    causes = []
    for c in base.causes:
        total = sum(x.rate_per_component_day for x in base.causes if x.component == c.component)
        new = r.get((c.component, HARD))
        k = new / total if new is not None and total > 0 else 1.0
        causes.append(replace(c, rate_per_component_day=c.rate_per_component_day * k))
    have = {c.component for c in base.causes}
    causes += [CauseSpec(f"calibrated_{comp}", comp, rate, Scope.DOMAIN if comp == "switch" else Scope.NODE)
               for (comp, cls), rate in r.items() if cls == HARD and comp in COMPONENTS_PER_NODE and comp not in have]
    fm = replace(base, causes=tuple(causes))
    if (gray_node := r.get(("node", GRAY))) is not None:
        fm = replace(fm, fail_slow_per_node_day=gray_node)
    if (s := m.get(("node", GRAY))) is not None:
        fm = replace(fm, fail_slow_compute_mean_min=s / 60.0, fail_slow_comm_mean_min=s / 60.0)
    if (loop := r.get(("cooling_loop", GRAY))) is not None:
        fm = replace(fm, cooling_event_per_loop_day=loop)
    if (s := m.get(("cooling_loop", GRAY))) is not None:
        fm = replace(fm, cooling_event_mean_h=s / 3600.0)
    repair = [(d.get("n", 0), m[(d["domain"], HARD)]) for d in doc["durations"]
              if d["class"] == HARD and (d["domain"], HARD) in m and d["domain"] in COMPONENTS_PER_NODE]
    if sum(n for n, _ in repair) > 0:
        fm = replace(fm, repair_mean_h=sum(n * s for n, s in repair) / sum(n for n, _ in repair) / 3600.0)
    return fm


def seamguard_params(doc: Mapping, detection: DetectionModel | None = None) -> PolicyParams:
    """The seamguard policy the calibrated twin runs: the detector's measured per-class recall and delays
    when ``detection`` is given (benchmarks/detection.py's result), else acting after the median delay the
    controller measured in the window (where it had MIN_EVENTS or more), else the twin's default delay."""
    if detection is not None:
        return PolicyParams("seamguard", detection=detection)
    delay = (doc.get("detection") or {}).get("delay") or {}
    if delay.get("n", 0) >= MIN_EVENTS:
        return PolicyParams("seamguard", detection_delay_s=float(delay["p50_s"]))
    return PolicyParams("seamguard")


def job_hazard_per_h(doc: Mapping, job_nodes: float, draw: Mapping[tuple[str, str], float]) -> float:
    """Hard failures per hour striking a job on ``job_nodes`` nodes: its share of every domain's entities."""
    fleet_nodes = next((h["entities"] for h in doc["hazards"] if h["domain"] == "node" and h.get("entities")), 0)
    if not fleet_nodes:
        raise ValueError("the calibrated config has no node count (hazards of domain 'node')")
    share = min(job_nodes / fleet_nodes, 1.0)
    return sum(rate * h["entities"] * share / 24.0 for h in doc["hazards"]
               if h["class"] == HARD and (rate := draw.get((h["domain"], HARD))) is not None)


@dataclass(frozen=True)
class JobAsk:
    """One job the questions are asked about (from the topology, via the calibrated config)."""

    name: str
    gpus: int
    work_left_s: float = math.nan  # wall time its remaining steps take without failures
    deadline_in_s: float = math.nan  # seconds from now to its deadline


def _recovery(doc: Mapping, rng: np.random.Generator, size: int, fallback_s: float) -> np.ndarray:
    rec = doc["recovery"]
    ln = rec.get("lognormal")
    if rec.get("source") == "measured" and ln:
        return rng.lognormal(ln["mu"], max(ln["sigma"], 1e-9), size)
    return np.full(size, fallback_s)


def _ettr(hazard_per_h: float, horizon_s: float, write_s: float, restore_s: float, doc: Mapping,
          rng: np.random.Generator, fallback_recovery_s: float) -> np.ndarray:
    """ETTR at each of INTERVALS_S for one seed: failures drawn, each rollback uniform over a cycle."""
    n = int(rng.poisson(hazard_per_h * horizon_s / 3600.0))
    u = rng.random(n)[:, None] * (INTERVALS_S + write_s)[None, :]  # work since the last commit, per interval
    rec = _recovery(doc, rng, n, fallback_recovery_s)
    lost = u.sum(axis=0) + n * restore_s + rec.sum()
    return np.clip((horizon_s - lost) / horizon_s, 0.0, 1.0) * INTERVALS_S / (INTERVALS_S + write_s)


def _ci(x: Sequence[float]) -> list[float]:
    a = np.asarray(x, dtype=float)
    return [float(np.quantile(a, 0.025)), float(np.quantile(a, 0.5)), float(np.quantile(a, 0.975))]


def _best(lam: float, horizon_s: float, tiers: Mapping[str, tuple[float, float]], doc: Mapping,
          rng: np.random.Generator, fallback_recovery_s: float) -> tuple[float, float, str]:
    """(interval s, ETTR there, tier) maximising ETTR in one seed's draw of failures."""
    scored = {t: _ettr(lam, horizon_s, w, rs, doc, rng, fallback_recovery_s) for t, (w, rs) in tiers.items()}
    tier = max(scored, key=lambda t: scored[t].max())
    k = int(np.argmax(scored[tier]))
    return float(INTERVALS_S[k]), float(scored[tier][k]), tier


def _spares(lam_per_h: float, job_nodes: int, m: Mapping[tuple[str, str], float], fallback_repair_s: float) -> float:
    """The job's nodes in repair at once at SPARE_QUANTILE: each of ``job_nodes`` nodes fails at
    ``lam_per_h / job_nodes`` and is down for the mean repair, so it is down a share rho / (1 + rho)
    of the time; the count is Binomial(job_nodes, that share) (finite source: never above job_nodes)."""
    repair = [v for (d, c), v in m.items() if c == HARD and d in COMPONENTS_PER_NODE]
    mean_repair_s = float(np.mean(repair)) if repair else fallback_repair_s
    n = max(int(job_nodes), 1)
    rho = lam_per_h / n * mean_repair_s / 3600.0
    return float(stats.binom.ppf(SPARE_QUANTILE, n, rho / (1.0 + rho)))


def recommend(doc: Mapping, jobs: Sequence[JobAsk], tiers: Mapping[str, tuple[float, float]], horizon_s: float,
              draws: int, seeds: int, rng: np.random.Generator, gpus_per_node: int = 8,
              fallback_recovery_s: float = 600.0, fallback_repair_s: float = 86400.0) -> list[dict]:
    """Per job: best interval and tier, ETTR there, spares and slip probability, each as [2.5 %, median, 97.5 %]
    over ``draws`` parameter draws x ``seeds`` seeds; ``tiers``: name -> (write stall s, restore s)."""
    out = []
    param = [(rates(doc, rng), means_s(doc, rng)) for _ in range(draws)]
    for job in jobs:
        best, spares, p_miss = [], [], []
        for r, m in param:
            lam = job_hazard_per_h(doc, job.gpus / gpus_per_node, r)
            spares.append(_spares(lam, math.ceil(job.gpus / gpus_per_node), m, fallback_repair_s))
            mine = [_best(lam, horizon_s, tiers, doc, rng, fallback_recovery_s) for _ in range(seeds)]
            best += mine
            tier = max({t for _, _, t in mine}, key=[t for _, _, t in mine].count)
            loss = (float(np.median([iv for iv, _, _ in mine])) / 2 + tiers[tier][1]
                    + float(np.mean(_recovery(doc, rng, 64, fallback_recovery_s))))
            p_miss.append(float(slip_forecast(0.0, np.array([job.deadline_in_s]), np.array([job.work_left_s]),
                                              np.array([lam]), np.array([loss])).p_miss[0]))
        chosen = [t for _, _, t in best]
        out.append({"job": job.name, "gpus": job.gpus, "interval_s": _ci([b[0] for b in best]),
                    "ettr": _ci([b[1] for b in best]), "tier": max(set(chosen), key=chosen.count),
                    "tier_share": {t: chosen.count(t) / len(chosen) for t in sorted(set(chosen))},
                    "hot_spares": _ci(spares), "p_slip": _ci(p_miss) if np.isfinite(p_miss).all() else None,
                    "tiers_s": {t: {"write_stall": w, "restore": rs} for t, (w, rs) in tiers.items()},
                    "samples": {"draws": draws, "seeds": seeds}})
    return out


def predict_count(doc: Mapping, days: float, rng: np.random.Generator, cls: str = HARD,
                  draws: int = 4000) -> list[float]:
    """[2.5 %, median, 97.5 %] of the incidents of class ``cls`` over ``days`` on the same fleet:
    Poisson counts at rates drawn from each estimate's posterior (the prior's rate where it says so)."""
    n = np.zeros(draws)
    for h in doc["hazards"]:
        if h["class"] != cls or not h.get("entities"):
            continue
        ent_days = h["entities"] * days
        if h.get("source") == "measured":
            lam = rng.gamma(h["count"] + 0.5, 1.0 / h["entity_days"], draws) * ent_days
        elif h.get("source") == "prior":
            lam = np.full(draws, h["prior"]["rate_per_entity_day"] * ent_days)
        else:
            continue
        n += rng.poisson(lam)
    return np.quantile(n, [0.025, 0.5, 0.975]).tolist()
