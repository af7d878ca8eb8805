"""`seamguard review`: decisions against what became of their cause; the hazard model's calibration."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seamguard.app.review import by_verb, calibration, decision_outcomes, predicted_failure

REPO = Path(__file__).resolve().parents[2]
H = 3600.0
FLOORS = {"degraded": 0.5, "quarantine": 0.8}


def tr(t, entity, frm, to, gfs=0.5, kind="node"):
    return {"t_s": t, "entity": entity, "kind": kind, "from_state": frm, "to_state": to, "gfs": gfs}


def dec(t, key, verb, cause, event="decided", benefit=1.0):
    return {"t_s": t, "key": key, "verb": verb, "cause": cause, "event": event, "benefit_gpu_h_per_h": benefit,
            "cost_gpu_h_per_h": 0.5}


TRANSITIONS = [tr(100, "n1", "healthy", "degraded"), tr(900, "n1", "degraded", "failed"),
               tr(100, "n2", "healthy", "quarantine", 0.9), tr(2000, "n2", "quarantine", "healthy"),
               tr(100, "n3", "healthy", "degraded"),
               tr(9000, "n4", "healthy", "degraded"),
               tr(50, "n5", "healthy", "failed")]
DECISIONS = [dec(200, "drain:n1", "drain", "n1"), dec(300, "drain:n1", "drain", "n1"),  # one per key
             dec(200, "drain:n2", "drain", "n2"), dec(200, "checkpoint_now:j@t200", "checkpoint_now", "n3"),
             dec(9100, "drain:n4", "drain", "n4"), dec(500, "drain:n1", "drain", "n1", event="withdrawn")]


def test_each_decision_is_judged_by_what_became_of_its_cause():
    out = {o.key: o for o in decision_outcomes(DECISIONS, TRANSITIONS, end_s=10_000, horizon_s=H)}
    assert (out["drain:n1"].outcome, out["drain:n1"].after_s) == ("failed", 700)
    assert (out["drain:n2"].outcome, out["drain:n2"].after_s) == ("recovered", 1800)
    assert out["checkpoint_now:j@t200"].outcome == "unhealthy"  # neither within the hour
    assert out["drain:n4"].outcome == "open"  # its hour has not passed
    rows = by_verb(list(out.values()))
    assert rows["drain"] == {"decided": 3, "failed": 1, "recovered": 1, "unhealthy": 0, "open": 1,
                             "median_s_to_failure": 700.0, "expected_benefit_gpu_h_per_h": 3.0,
                             "expected_cost_gpu_h_per_h": 1.5}
    # a failure after the horizon does not count
    late = decision_outcomes(DECISIONS[:1], TRANSITIONS, end_s=10_000, horizon_s=600)
    assert late[0].outcome == "unhealthy"


def test_calibration_compares_the_models_probability_with_the_observed_share():
    rows = calibration(TRANSITIONS, end_s=10_000, horizon_s=H, h1=0.5, floors=FLOORS)
    # n1 (failed), n2 (recovered), n3 (unhealthy) count; n4's hour is open; n5 went straight to failed
    p_deg, p_q = predicted_failure(0.5, "degraded", 1.0, 0.5, FLOORS), predicted_failure(0.9, "quarantine", 1.0,
                                                                                          0.5, FLOORS)
    assert p_deg == pytest.approx(-math.expm1(-0.5 * 0.25)) and p_q == pytest.approx(-math.expm1(-0.5 * 0.81))
    assert [(r["episodes"], r["observed_share"]) for r in rows] == [(2, 0.5), (1, 0.0)]
    assert rows[0]["predicted_mean"] == pytest.approx(p_deg, abs=1e-4)
    # a GFS below its state's entry threshold counts as the threshold
    assert predicted_failure(0.1, "quarantine", 1.0, 0.5, FLOORS) == predicted_failure(0.8, "quarantine", 1.0, 0.5,
                                                                                        FLOORS)


def _cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "seamguard", *args], env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                          capture_output=True, text=True, timeout=timeout)


def test_review_of_a_demo_ledger_and_of_a_file_that_is_not_one(tmp_path):
    led = tmp_path / "demo.db"
    assert _cli("demo", "--gpus", "512", "--minutes", "20", "--ledger", str(led), "--json").returncode == 0
    p = _cli("review", "--ledger", str(led), "--horizon-h", "0.25", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["by_verb"] and all(r["decided"] == r["failed"] + r["recovered"] + r["unhealthy"] + r["open"]
                                  for r in out["by_verb"].values())
    assert sum(r["episodes"] for r in out["calibration"]) > 0
    bad = tmp_path / "not.db"
    bad.write_text("hello")
    p = _cli("review", "--ledger", str(bad))
    assert p.returncode == 2 and "cannot read it as a seamguard ledger" in p.stderr and "Traceback" not in p.stderr
    p = _cli("review", "--ledger", str(tmp_path / "absent.db"))
    assert p.returncode == 2 and "no such file" in p.stderr
