"""Time `twin calibrate` and `twin simulate --calibrated` on a week of a 10,240-GPU fleet (not a test).

The fleet is `seamguard fleet generate --gpus 10240`; its week of history is the event twin's own
(twin/history.py) written into a SQLite ledger; both commands then run as a user runs them.
Run: ``python -m tests.twin_calibrate.scale_check [--gpus N] [--days D]``; prints one JSON line.
Figures: docs/twin-events.md, "Calibrated on your fleet".
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10_240)
    ap.add_argument("--days", type=float, default=7.0)
    args = ap.parse_args()
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
                          "--json")
        doc = json.loads(out.strip().splitlines()[-1])
        print(json.dumps({"gpus": args.gpus, "days": args.days, "transitions": len(h.transitions),
                          "actions": len(h.actions), "calibrate_wall_s": round(cal_s, 2),
                          "simulate_wall_s": round(sim_s, 2), "simulate_inner_s": round(doc["wall_s"], 2),
                          "jobs": len(doc["jobs"]), "fleet_ettr": doc["fleet_ettr"]}))


if __name__ == "__main__":
    main()
