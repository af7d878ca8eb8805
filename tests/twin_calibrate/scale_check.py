"""Time `twin calibrate` and `twin simulate --calibrated` on a week of a 10,240-GPU fleet, and
count how often the stated intervals hold over more seeds than the tests run (not a test).

The fleet is `seamguard fleet generate --gpus 10240`; its week of history is the event twin's own
(twin/history.py) written into a SQLite ledger; both commands then run as a user runs them.
Run: ``python -m tests.twin_calibrate.scale_check [--gpus N] [--days D]`` (the simulate step asks six
policy what-ifs too: dry run, three breaker bounds, two drain floors), or with
``--coverage FIRST-LAST`` the recovery and holdout checks of test_recover.py over those seeds;
prints one JSON line. Figures: docs/twin-events.md, "Calibrated on your fleet".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from seamguard.assess.assessment import Transition
from seamguard.assess.states import STATE_BY_LABEL
from seamguard.fleet.model import KIND_BY_LABEL
from seamguard.ledger import Ledger
from seamguard.twin.events.config import ClusterConfig
from seamguard.twin.events.processes import generate_streams
from seamguard.twin.history import history_from_streams

T0 = 1_760_000_000.0


def write_ledger(path: Path, transitions: list[dict], actions: list[dict]) -> None:
    led = Ledger(path)
    try:
        for k, tr in enumerate(transitions):
            led.record_transitions(k, [Transition(T0 + tr["t_s"], KIND_BY_LABEL[tr["kind"]], 0, tr["entity"],
                                                  STATE_BY_LABEL[tr["from_state"]], STATE_BY_LABEL[tr["to_state"]],
                                                  0.9, 0.1, 0.5, ())])
        for a in actions:
            led.begin_action(0, T0 + a["t_s"], "apply", a["key"], a["key"].split(":")[0], "slurm")
            led.finish_action(a["key"], "apply", "done", "")
    finally:
        led.close()


def _run(*args: str) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "seamguard", *args], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(r.stderr.strip() or r.stdout.strip())
    return time.perf_counter() - t, r.stdout


def coverage(seeds: range) -> dict:
    """Stated 95 % intervals that hold the truth: calibration (8,192 GPUs, 60 days) and holdout (30 + 30 days)."""
    from seamguard.twin.calibrate import HARD, calibrate, incidents
    from seamguard.twin.calibrated import failure_model, predict_count
    from seamguard.twin.events.config import PolicyParams
    from seamguard.twin.events.simulator import simulate_run, simulate_streams
    from seamguard.twin.history import exposure, window
    from tests.twin_calibrate.test_recover import PRIORS, _history, _true_rates

    cfg = ClusterConfig(gpus=8192, days=60, workload="single")
    true, inside, checked = _true_rates(cfg), 0, 0
    count_ok = ettr_ok = 0
    for seed in seeds:
        _, h = _history(cfg, seed)
        doc = calibrate(h.transitions, h.actions, h.runs, exposure(cfg), 0.0, cfg.horizon_s, *PRIORS)
        for row in doc["hazards"]:
            if row["source"] == "measured" and (row["domain"], row["class"]) in true and row["count"] >= 3:
                lo, hi = row["ci95_per_entity_day"]
                inside, checked = inside + int(lo <= true[(row["domain"], row["class"])] <= hi), checked + 1
        for d in doc["durations"]:
            if d["class"] == HARD and d["n"] >= 20:
                lo, hi = d["mean_ci95_s"]
                inside, checked = inside + int(lo <= cfg.failures.repair_mean_h * 3600 <= hi), checked + 1
        mix = ClusterConfig(gpus=8192, days=60, workload="mix")
        s, h = _history(mix, seed)
        doc = calibrate(h.transitions, h.actions, h.runs, exposure(mix), 0.0, 30 * 86400, *PRIORS)
        rng = np.random.default_rng(seed)
        lo, _, hi = predict_count(doc, 30.0, rng)
        n = sum(1 for i in incidents(h.transitions) if i.cls == HARD and i.start_s >= 30 * 86400)
        count_ok += int(lo <= n <= hi)
        half, pp = ClusterConfig(gpus=8192, days=30, workload="mix"), PolicyParams("seamguard")
        e = [simulate_run(ClusterConfig(gpus=8192, days=30, workload="mix", failures=failure_model(doc, mix.failures,
                                                                                                 rng)),
                          pp, np.random.SeedSequence([seed, k])).ettr for k in range(40)]
        lo, hi = np.quantile(e, [0.025, 0.975])
        ettr_ok += int(lo <= simulate_streams(half, pp, window(s, 30 * 86400, 60 * 86400)).ettr <= hi)
    return {"seeds": [seeds.start, seeds.stop - 1], "calibration_inside": inside, "calibration_checked": checked,
            "holdout_count_inside": count_ok, "holdout_ettr_inside": ettr_ok, "histories": len(seeds)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10_240)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--coverage", metavar="FIRST-LAST", help="count the intervals that hold over these seeds")
    args = ap.parse_args()
    if args.coverage:
        first, _, last = args.coverage.partition("-")
        print(json.dumps(coverage(range(int(first), int(last or first) + 1))))
        return
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        _run("fleet", "generate", "--gpus", str(args.gpus), "--out", str(d / "fleet.yaml"))
        cfg = ClusterConfig(gpus=args.gpus, days=args.days, workload="mix")
        rng = np.random.default_rng(0)
        h = history_from_streams(cfg, generate_streams(cfg, rng), rng)
        write_ledger(d / "ledger.db", h.transitions, h.actions)
        until = T0 + args.days * 86400
        cal_s, _ = _run("twin", "calibrate", "--topology", str(d / "fleet.yaml"), "--ledger", str(d / "ledger.db"),
                        "--since", str(T0), "--until", str(until), "-o", str(d / "cal.yaml"))
        sim_s, out = _run("twin", "simulate", "--calibrated", str(d / "cal.yaml"), "--runs", "4", "--draws", "8",
                          "--whatif", "mode=dry_run", "--whatif", "breaker=0.001,0.01,off",
                          "--whatif", "drain_min_slowdown=0.2,0.4", "--json")
        doc = json.loads(out.strip().splitlines()[-1])
        print(json.dumps({"gpus": args.gpus, "days": args.days, "transitions": len(h.transitions),
                          "actions": len(h.actions), "calibrate_wall_s": round(cal_s, 2),
                          "simulate_wall_s": round(sim_s, 2), "simulate_inner_s": round(doc["wall_s"], 2),
                          "fleet_ettr": doc["fleet_ettr"],
                          "whatif": {v["variant"]: {"delta_ettr": v["delta_ettr"], "drained_nodes": v["drained_nodes"],
                                                    "held_by_breaker": v["held_by_breaker"]}
                                     for v in doc["whatif"]["variants"]},
                          "jobs": {j["job"]: {"gpus": j["gpus"], "ettr": j["ettr"], "interval_s": j["interval_s"],
                                              "hot_spares": j["hot_spares"]} for j in doc["jobs"]}}))


if __name__ == "__main__":
    main()
