"""`seamguard review` for deadlines: each job's recorded slip forecasts against when it ended.

The forecasts come from the planner's own decisions (a tight-deadline drain on the
16-node test fleet, tests/core/test_slip.py) written to a real SQLite ledger and read back
the way the CLI reads them; the CLI is run on that ledger with --job-end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from core.test_slip import J0, POL, _degraded, _fleet

from seamguard.app.config import ConfigError
from seamguard.app.review import parse_job_ends, read_all, slip_review
from seamguard.decide import planner as pl
from seamguard.ledger.sqlite import Ledger, LedgerReader

REPO = Path(__file__).resolve().parents[2]


def ev(job, t, slip, deadline, p, finish):
    return {"t_s": t, "event": "decided", "evidence": [
        {"channel": f"deadline_slip:{job}", "score": slip, "value": deadline, "unit": "s"},
        {"channel": f"deadline_miss:{job}", "score": p, "value": finish, "unit": "probability"},
        {"channel": "gpu003/probe", "score": 0.1, "value": 1.0, "unit": "x"}]}


def test_slip_review_sets_the_last_forecast_before_the_end_against_what_happened():
    rows = [ev("a", 100, 0.0, 10_000, 0.1, 9_000), ev("a", 500, 400.0, 10_000, 0.7, 10_500),
            ev("a", 20_000, 9.0, 10_000, 0.9, 20_500),       # after it ended: not a forecast of it
            ev("b", 200, 50.0, 8_000, 0.3, 7_900),
            {"t_s": 300, "event": "withdrawn", "evidence": ev("c", 0, 1, 1, 1, 1)["evidence"]}]
    out = slip_review(rows, {"a": 11_000.0})
    by = {r["job"]: r for r in out["jobs"]}
    assert sorted(by) == ["a", "b"]  # c's only row is not a decision
    a = by["a"]
    assert a["forecasts"] == 2 and a["first"]["t_s"] == 100 and a["last"]["t_s"] == 500
    assert a["observed_slip_s"] == 11_000 - 10_000 and a["missed"] is True
    assert a["finish_error_s"] == 10_500 - 11_000 and a["slip_error_s"] == 400 - 1_000
    assert by["b"]["ended_s"] is None and "observed_slip_s" not in by["b"]  # not ended: nothing to compare
    assert out["summary"] == {"jobs": 2, "ended": 1, "finish_mae_s": 500.0, "slip_mae_s": 600.0,
                              "p_miss_brier": round((0.7 - 1.0) ** 2, 4)}
    on_time = slip_review(rows, {"a": 9_500.0})["jobs"][0]
    assert on_time["missed"] is False and on_time["observed_slip_s"] == 0.0


@pytest.mark.parametrize("item, why", [("a", "expected JOB=TIME"), ("a=2027-01-01T00:00:00", "no timezone"),
                                       ("=2027-01-01T00:00:00Z", "expected JOB=TIME")])
def test_a_bad_job_end_names_itself(item, why):
    with pytest.raises(ConfigError, match=why):
        parse_job_ends([item])


def _ledger_with_deadline_forecasts(path: Path):
    """One tick of decide on the tight-deadline fleet recorded to a real ledger: the drain is held by the
    breaker (1 of 16 nodes), checkpoint_now and checkpoint_interval of the job are decided with its forecast."""
    fleet, a = _fleet(600.0), _degraded()
    decisions, _ = pl.decide(fleet, a, POL, pl.DecideState(), set())
    ckpt = next(act for k, act in decisions.desired.items() if k.startswith("checkpoint_now:"))
    led = Ledger(path)
    try:
        led.begin_tick(1, a.t_s, "dry_run", ())
        led.record_decisions(1, a.t_s, decisions.desired, decisions.held)
        led.finish_tick(1, 15.0)
    finally:
        led.close()
    return fleet, ckpt


def test_the_planners_forecast_round_trips_through_the_ledger_into_the_review(tmp_path):
    fleet, ckpt = _ledger_with_deadline_forecasts(tmp_path / "l.db")
    reader = LedgerReader(tmp_path / "l.db")
    try:
        rows = read_all(reader.decisions)
    finally:
        reader.close()
    job = fleet.job_names[J0]
    recorded = {e[0]: e for e in ckpt.evidence}
    deadline = float(fleet.job_deadline_s[J0])
    out = slip_review(rows, {job: deadline + 1800.0})
    row = next(r for r in out["jobs"] if r["job"] == job)
    assert row["last"]["expected_slip_s"] == recorded[f"deadline_slip:{job}"][1]
    assert row["last"]["p_miss"] == recorded[f"deadline_miss:{job}"][1]
    assert row["observed_slip_s"] == 1800.0 and row["missed"] is True
    assert np.isclose(row["finish_error_s"], recorded[f"deadline_miss:{job}"][2] - (deadline + 1800.0), atol=0.1)


def test_review_cli_reports_deadlines(tmp_path):
    fleet, _ = _ledger_with_deadline_forecasts(tmp_path / "l.db")
    job = fleet.job_names[J0]
    end = datetime.fromtimestamp(float(fleet.job_deadline_s[J0]) + 3600, tz=timezone.utc).isoformat()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    p = subprocess.run([sys.executable, "-m", "seamguard", "review", "--ledger", str(tmp_path / "l.db"),
                        "--job-end", f"{job}={end}", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)["deadlines"]
    assert d["summary"]["ended"] == 1 and d["jobs"][0]["observed_slip_s"] == 3600.0
    p = subprocess.run([sys.executable, "-m", "seamguard", "review", "--ledger", str(tmp_path / "l.db"),
                        "--job-end", f"{job}={end}"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and f"{job}" in p.stdout and "observed slip" in p.stdout and "missed" in p.stdout
    p = subprocess.run([sys.executable, "-m", "seamguard", "review", "--ledger", str(tmp_path / "l.db"),
                        "--job-end", f"{job}=yesterday"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and f"--job-end {job}" in p.stderr
