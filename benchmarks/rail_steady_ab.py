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

    PYTHONPATH=src python benchmarks/rail_steady_ab.py --profile DIR   # where a step goes

``--profile`` runs this tree's job once under cProfile (`_rails_job_profiled.py`) and
reports rank 0's heaviest functions in ms a step and every rank's CPU by thread (DIR/profile.json).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
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
spec = JobSpec(steps=int(sys.argv[2]), timeout_s=300)
if len(sys.argv) > 3:
    spec = JobSpec(script=Path(sys.argv[3]), steps=spec.steps, timeout_s=spec.timeout_s)
with Testbed(TestbedSpec(hosts=4, rails=2)) as tb:
    res = run_rail_job(tb, spec, [], Path(sys.argv[1]))
sys.exit(0 if res.ok else 1)
"""


def steps_per_s(run_dir: Path) -> float:
    t = [json.loads(line)["t_wall"] for line in (run_dir / "steps.0.jsonl").read_text().splitlines()]
    return (len(t) - 1) / (t[-1] - t[0])


def run(tree: Path, out: Path, steps: int, script: Path | None = None) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([sys.executable, "-c", _RUN, str(out), str(steps), *([str(script)] if script else [])],
                   env=env, check=True, timeout=600)


def profile(out: Path, steps: int, top: int = 15) -> dict:
    """One run of this tree's job under cProfile: rank 0's heaviest functions (own time, ms
    a step) and each rank's CPU seconds by thread."""
    run(HERE.parent, out, steps, HERE / "_rails_job_profiled.py")
    stats = pstats.Stats(str(out / "prof.0")).stats  # type: ignore[attr-defined]
    rows = sorted(((tt, calls, f"{Path(fn).name}:{line}({name})") for (fn, line, name), (_, calls, tt, _, _)
                   in stats.items()), reverse=True)[:top]
    return {"steps": steps, "steps_per_s": steps_per_s(out),
            "rank0_ms_per_step": [{"fn": fn, "own_ms": round(1e3 * tt / steps, 2), "calls_per_step": round(calls / steps, 1)}
                                  for tt, calls, fn in rows],
            "cpu_s_by_rank": [json.loads((out / f"cpu.{r}.json").read_text()) for r in range(4)],
            "load_1m_end": round(os.getloadavg()[0], 2)}


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
    ap.add_argument("--profile", type=Path, default=None, help="one profiled run of this tree's job into this folder")
    a = ap.parse_args()
    if a.profile is not None:
        res = profile(a.profile, a.steps)
        (a.profile / "profile.json").write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res))
        return
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
