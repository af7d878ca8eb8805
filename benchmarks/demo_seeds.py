"""The README's demo figures, per seed, as a committed result.

Why this file exists: the README opens with what `seamguard demo` shows (faults detected,
false actions, delay, thermal lead, useful throughput with and without the controller);
those figures must come from a result file like every other headline. This runs the demo
for a few seeds, each in its own process with a bounded wait, and writes them with the
commit and load to benchmarks/results/demo.json (demo_quick.json with --quick).

    python benchmarks/demo_seeds.py            # seeds 0, 1, 2: 2,048 GPUs, 30 min each
    python benchmarks/demo_seeds.py --quick    # seed 0 only

Last line: one JSON object (the file's contents).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _record import RESULTS_DIR, provenance, write_result

#: The demo's figures this result keeps, per seed.
FIELDS = ("faults", "detected", "false_actions", "median_detection_delay_s", "thermal_lead_time_s",
          "useful_throughput_with_control", "useful_throughput_without_control",
          "job_failures_with_control", "job_failures_without_control", "controller_errors")
SRC = Path(__file__).resolve().parent.parent / "src"


def run_seed(seed: int, timeout_s: float) -> dict:
    """One `seamguard demo -o json --seed S`, run from this checkout's src/."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(SRC), os.environ.get("PYTHONPATH")))))
    out = subprocess.run([sys.executable, "-m", "seamguard", "demo", "-o", "json", "--seed", str(seed)],
                         capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"error: demo --seed {seed} exited {out.returncode}: {out.stderr.strip()[-300:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return {"seed": seed, **{k: d.get(k) for k in FIELDS}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="seed 0 only")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="the most one seed may take")
    ap.add_argument("--out", type=Path, default=None,
                    help="result file (default: benchmarks/results/demo.json, demo_quick.json with --quick)")
    args = ap.parse_args()
    out = args.out or RESULTS_DIR / ("demo_quick.json" if args.quick else "demo.json")
    started = provenance()
    seeds = [run_seed(s, args.timeout_s) for s in ((0,) if args.quick else (0, 1, 2))]
    for s in seeds:
        print(" ".join(f"{k}={v}" for k, v in s.items()), file=sys.stderr)
    result = {"benchmark": "demo_seeds", "quick": args.quick, "command": "seamguard demo -o json --seed S",
              "seeds": seeds}
    write_result(out, result, started)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
