"""The rails job's flap-free steps/s on two versions of the code, run alternately.

Why this exists: `rail_failover.py --steady` compares seamguard's rails with the bond, and
on this shared 2-core VM that ratio moves by more than a change to the rails is worth. To
see whether a change helped, this runs `seamguard/testbed/rails_job.py` (4 hosts x 2
rails, no flaps) from a checkout of the old code and from this one, in pairs whose order
alternates, and reports each pair's new/old steps/s (first to last commit, rank 0's log).

    git worktree add /tmp/old-rails <commit>
    PYTHONPATH=src python benchmarks/rail_steady_ab.py --old /tmp/old-rails --pairs 4 --out DIR
    python benchmarks/rail_steady_ab.py --recompute DIR    # the figures again from DIR's logs

Each run imports the job and the testbed from its own tree (PYTHONPATH), so the old run
uses the old rails end to end. The last stdout line is one JSON object (also DIR/ab.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_RUN = """
import json, sys
from pathlib import Path
from seamguard.testbed.job import JobSpec, run_rail_job
from seamguard.testbed.net import Testbed, TestbedSpec
with Testbed(TestbedSpec(hosts=4, rails=2)) as tb:
    res = run_rail_job(tb, JobSpec(steps=int(sys.argv[2]), timeout_s=300), [], Path(sys.argv[1]))
sys.exit(0 if res.ok else 1)
"""


def steps_per_s(run_dir: Path) -> float:
    t = [json.loads(line)["t_wall"] for line in (run_dir / "steps.0.jsonl").read_text().splitlines()]
    return (len(t) - 1) / (t[-1] - t[0])


def run(tree: Path, out: Path, steps: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([sys.executable, "-c", _RUN, str(out), str(steps)], env=env, check=True, timeout=600)


def summarize(root: Path) -> dict:
    pairs = []
    for d in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: int(p.name)):
        rate = {w: steps_per_s(d / w) for w in ("old", "new")}
        pairs.append({**rate, "ratio_new_over_old": rate["new"] / rate["old"]})
    ratios = [p["ratio_new_over_old"] for p in pairs]
    return {"pairs": pairs, "ratio_new_over_old": {"median": statistics.median(ratios), "min": min(ratios),
                                                   "max": max(ratios), "n": len(ratios)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, help="a checkout of the code to compare against")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, help="where the runs' logs go")
    ap.add_argument("--recompute", type=Path, default=None, help="no runs: the figures of an earlier --out")
    a = ap.parse_args()
    if a.recompute is None:
        if a.old is None or a.out is None or not (a.old / "src" / "seamguard").is_dir():
            raise SystemExit("error: --old must be a checkout (with src/seamguard) and --out is needed")
        for i in range(a.pairs):
            for w in ("old", "new") if i % 2 == 0 else ("new", "old"):
                run(a.old if w == "old" else HERE.parent, a.out / str(i) / w, a.steps)
            print(f"pair {i}: new/old {steps_per_s(a.out / str(i) / 'new') / steps_per_s(a.out / str(i) / 'old'):.3f} "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    root = a.recompute or a.out
    res = summarize(root) | ({} if a.recompute else {"load_1m_end": round(os.getloadavg()[0], 2)})
    (root / "ab.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
