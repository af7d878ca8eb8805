"""Calibration recovers what the twin drew: hazard rates, repair and recovery distributions, across seeds;
and calibrated on the first half of a history it predicts the second half (holdout)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seamguard.twin.calibrate import HARD, calibrate, garwood, incidents, published_priors
from seamguard.twin.calibrated import failure_model, predict_count
from seamguard.twin.events.calibration import llama3_failure_model
from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.processes import generate_streams
from seamguard.twin.events.simulator import simulate_run, simulate_streams
from seamguard.twin.history import HistoryTruth, exposure, history_from_streams, window

PRIORS = published_priors(llama3_failure_model())


def _true_rates(cfg: ClusterConfig) -> dict[tuple[str, str], float]:
    fm = cfg.failures
    out = {}
    for c in fm.causes:
        out[(c.component, HARD)] = out.get((c.component, HARD), 0.0) + c.rate_per_component_day
    out[("node", "gray")] = fm.fail_slow_per_node_day
    return out


def _history(cfg, seed, truth=HistoryTruth()):
    rng = np.random.default_rng(seed)
    s = generate_streams(cfg, rng)
    return s, history_from_streams(cfg, s, rng, truth)


def test_garwood_is_the_exact_poisson_interval():
    lo, hi = garwood(0, 1.0)
    assert lo == 0.0 and hi == pytest.approx(3.689, abs=1e-3)  # -ln(0.025)
    lo, hi = garwood(10, 2.0)
    assert (lo, hi) == (pytest.approx(4.795 / 2, abs=1e-3), pytest.approx(18.39 / 2, abs=1e-2))


def test_incidents_pair_leaving_and_returning_to_healthy():
    rows = [{"id": 1, "t_s": 0, "kind": "node", "entity": "n1", "from_state": "healthy", "to_state": "degraded", "tick": 1},
            {"id": 2, "t_s": 5, "kind": "node", "entity": "n1", "from_state": "degraded", "to_state": "failed", "tick": 2},
            {"id": 3, "t_s": 9, "kind": "node", "entity": "n1", "from_state": "failed", "to_state": "healthy", "tick": 3},
            {"id": 4, "t_s": 7, "kind": "gpu", "entity": "g1", "from_state": "healthy", "to_state": "degraded", "tick": 4}]
    got = incidents(rows)
    assert [(i.entity, i.cls, i.start_s, i.end_s, i.ticks) for i in got] == [
        ("n1", "hard", 0.0, 9.0, (1, 2, 3)), ("g1", "gray", 7.0, math.inf, (4,))]


def test_calibration_recovers_rates_and_distributions_across_seeds():
    cfg = ClusterConfig(gpus=8192, days=60, workload="single")
    truth, true = HistoryTruth(), _true_rates(cfg)
    inside, checked, means = 0, 0, []
    for seed in (1, 2, 3):
        _, h = _history(cfg, seed, truth)
        doc = calibrate(h.transitions, h.actions, h.runs, exposure(cfg), 0.0, cfg.horizon_s, *PRIORS)
        for row in doc["hazards"]:
            key = (row["domain"], row["class"])
            if row["source"] == "measured" and key in true and row["count"] >= 3:
                lo, hi = row["ci95_per_entity_day"]
                inside += lo <= true[key] <= hi
                checked += 1
                assert row["records"]["total"] == row["count"]  # every count names its incidents
        for d in doc["durations"]:
            if d["class"] == HARD and d["n"] >= 20:
                lo, hi = d["mean_ci95_s"]
                inside += lo <= cfg.failures.repair_mean_h * 3600 <= hi
                checked += 1
        rec = doc["recovery"]
        mu, sigma, n = rec["lognormal"]["mu"], rec["lognormal"]["sigma"], rec["n"]
        assert abs(mu - math.log(truth.recovery_median_s)) < 3 * truth.recovery_sigma / math.sqrt(n)
        assert abs(sigma - truth.recovery_sigma) < 3 * truth.recovery_sigma / math.sqrt(2 * (n - 1))
        means.append(doc["detection"]["delay"]["mean_s"])
    assert checked >= 15
    assert inside / checked >= 0.85, f"{inside} of {checked} 95 % intervals hold the true value"
    # delays are cut short by incidents that end first: the measured mean is at most the drawn one, near it
    assert all(0.8 * truth.detect_mean_s <= m <= 1.1 * truth.detect_mean_s for m in means)


def test_holdout_predicts_the_second_half():
    """Calibrate on days 0-30 of a twin history, predict days 30-60: the hard-incident count and
    the fleet ETTR each fall inside the stated 95 % interval, for each of three histories."""
    half_d = 30.0
    for seed in (11, 12, 13):
        cfg = ClusterConfig(gpus=8192, days=2 * half_d, workload="mix")
        s, h = _history(cfg, seed)
        doc = calibrate(h.transitions, h.actions, h.runs, exposure(cfg), 0.0, half_d * 86400, *PRIORS)
        rng = np.random.default_rng(seed)
        lo, _, hi = predict_count(doc, half_d, rng)
        actual = sum(1 for i in incidents(h.transitions) if i.cls == HARD and i.start_s >= half_d * 86400)
        assert lo <= actual <= hi, (seed, lo, actual, hi)
        half = ClusterConfig(gpus=8192, days=half_d, workload="mix")
        pp = PolicyParams("seamguard")
        ettr = [simulate_run(ClusterConfig(gpus=8192, days=half_d, workload="mix",
                                           failures=failure_model(doc, cfg.failures, rng)), pp,
                             np.random.SeedSequence([seed, k])).ettr for k in range(40)]
        lo, hi = np.quantile(ettr, [0.025, 0.975])
        seen = simulate_streams(half, pp, window(s, half_d * 86400, 2 * half_d * 86400)).ettr
        assert lo <= seen <= hi, (seed, lo, seen, hi)


def test_the_twin_draws_from_the_calibrated_rates_and_keeps_priors_where_it_says_so():
    cfg = ClusterConfig(gpus=8192, days=60, workload="single")
    _, h = _history(cfg, 5)
    doc = calibrate(h.transitions, h.actions, h.runs, exposure(cfg), 0.0, cfg.horizon_s, *PRIORS)
    rows = {(r["domain"], r["class"]): r for r in doc["hazards"]}
    rows[("gpu", HARD)]["count"] *= 3  # as if the fleet's GPUs failed three times as often
    fm = failure_model(doc, cfg.failures)
    per = {c: sum(x.rate_per_component_day for x in fm.causes if x.component == c) for c in ("gpu", "node")}
    assert per["gpu"] == pytest.approx(rows[("gpu", HARD)]["count"] / rows[("gpu", HARD)]["entity_days"])
    assert per["node"] == pytest.approx(rows[("node", HARD)]["rate_per_entity_day"])
    mix = [x.rate_per_component_day / per["gpu"] for x in fm.causes if x.component == "gpu"]
    assert mix == pytest.approx([x.rate_per_component_day / _true_rates(cfg)[("gpu", HARD)]
                                 for x in cfg.failures.causes if x.component == "gpu"])  # Llama 3's mix kept
    loop = rows[("cooling_loop", "gray")]  # 8 loops x 60 days: a handful of degradations, or fewer than 3
    want = loop["prior"]["rate_per_entity_day"] if loop["source"] == "prior" else loop["rate_per_entity_day"]
    assert fm.cooling_event_per_loop_day == pytest.approx(want)
    assert (loop["source"] == "prior") == (loop["count"] < 3)
    draws = [failure_model(doc, cfg.failures, np.random.default_rng(k)).rf_per_node_day() for k in range(200)]
    assert np.std(draws) > 0 and np.mean(draws) == pytest.approx(fm.rf_per_node_day(), rel=0.05)
