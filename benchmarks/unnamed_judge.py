"""Cost of judging the series nobody named (assess/unnamed.py) per tick, and its state's size.

A synthetic matrix, entities x series (half gauges, half counters), peer groups of 64 (one
job each), hosts of 8; the judge runs 20 ticks (15 warm its own baselines) and the median
and max of the last 5 (warm: the departures' spread is sorted too), wall and process CPU time,
are printed as one JSON line and written with the commit and load to
benchmarks/results/unnamed_judge_<entities>x<series>.json (``--out`` names another file).
docs/evidence.md, "Series nobody named", gives the figures.

    python benchmarks/unnamed_judge.py --entities 10000 --series 32
    python benchmarks/unnamed_judge.py --entities 100000 --series 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _record import RESULTS_DIR, provenance, write_result  # noqa: E402

from seamguard.assess.unnamed import UnnamedJudgeConfig, judge  # noqa: E402
from seamguard.fleet.model import Kind  # noqa: E402
from seamguard.observe.unnamed import SeriesBlock  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entities", type=int, default=10_000)
    ap.add_argument("--series", type=int, default=32)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="result file "
                    "(default: benchmarks/results/unnamed_judge_<entities>x<series>.json)")
    a = ap.parse_args()
    if a.entities < 64 or a.series < 1 or a.ticks < 6:
        ap.error("need --entities >= 64, --series >= 1, --ticks >= 6")
    started = provenance()
    n, s = a.entities, a.series
    rng = np.random.default_rng(0)
    group = np.arange(n) // 64
    host = np.arange(n) // 8
    counter = np.zeros(s, dtype=bool)
    counter[::2] = True
    names = tuple(f"series_{i}" for i in range(s))
    level = rng.normal(50.0, 2.0, (n, s))
    acc = np.zeros((n, s))
    cfg, st, took, cpu = UnnamedJudgeConfig(), None, [], []
    for k in range(a.ticks):
        acc += rng.random((n, s))
        x = np.where(counter, acc, level + rng.normal(0.0, 0.2, (n, s)))
        t0, c0 = time.perf_counter(), time.process_time()
        _, _, _, st = judge(SeriesBlock(Kind.GPU, names, counter, x), st, 30.0 * k, group, np.zeros(n),
                            np.ones(n, dtype=bool), host, cfg)
        took.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    result = {"benchmark": "unnamed_judge", "entities": n, "series": s,
              "judge_s_median": round(float(np.median(took[-5:])), 3),
              "judge_s_max": round(float(max(took[-5:])), 3),
              "judge_cpu_s_median": round(float(np.median(cpu[-5:])), 3), "state_mib": round(st.bytes / 2**20, 1)}
    write_result(a.out or RESULTS_DIR / f"unnamed_judge_{n}x{s}.json", result, started)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
