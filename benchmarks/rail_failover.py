"""Rail failover: seamguard (multi-rail, agreed failover) vs plain gloo under torchrun elastic.

Both run the same model and data on the same namespaced testbed (4 hosts x 2 rails) with
the same flap schedule on the primary rail. seamguard: `examples/rails_job.py`
over `RailGroup`. Baseline: `torch.distributed.run --max-restarts` with one gloo group on
rail0, a bounded collective timeout and periodic checkpoints. Prints per-flap figures
and, as the last line, one JSON object.

    PYTHONPATH=src python benchmarks/rail_failover.py --quick
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

from seamguard.testbed.job import SRC, Fault, FaultPlayer, JobSpec, _env, run_rail_job
from seamguard.testbed.metrics import flap_figures
from seamguard.testbed.net import Testbed, TestbedSpec

HERE = Path(__file__).resolve().parent


def summarize(commits, rails_used, records, restarts, wall_s):
    figs = [flap_figures(commits, rails_used, 2, r.applied_t, r.reverted_t) for r in records if r.applied_t]
    nz = lambda xs: float(np.nanmax(xs)) if xs and not all(np.isnan(xs)) else float("nan")  # noqa: E731
    return {"restarts": restarts, "max_stall_s": round(nz([f.stall_s for f in figs]), 3),
            "regain_95_s": round(nz([f.regain_95_s for f in figs]), 3),
            "full_multirail_s": round(nz([f.full_multirail_s for f in figs]), 3), "wall_s": round(wall_s, 3),
            "per_flap": [{k: round(v, 3) for k, v in f.__dict__.items()} for f in figs]}


def run_seamguard(steps, faults, out):
    with Testbed(TestbedSpec(hosts=4, rails=2)) as tb:
        res = run_rail_job(tb, JobSpec(steps=steps, timeout_s=300), faults, out)
    if not res.ok:
        raise SystemExit(f"seamguard run failed: {res.returncodes}\n{res.stderr_tail}")
    return summarize([s["t_wall"] for s in res.steps], [s["rails"] for s in res.steps], res.faults, 0,
                     res.steps[-1]["t_wall"] - res.t_start)


def run_baseline(steps, faults, out, timeout_s, ckpt_every):
    out.mkdir(parents=True, exist_ok=True)
    env = {**_env(), "GLOO_SOCKET_IFNAME": "rail0", "PYTHONPATH": SRC}
    with Testbed(TestbedSpec(hosts=4, rails=2)) as tb:
        procs = []
        for h in range(4):
            cmd = [*tb.exec_prefix(h), sys.executable, "-m", "torch.distributed.run", "--nnodes", "4",
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "bench",
                   "--rdzv-endpoint", f"{tb.addr(0, None)}:29700", "--rdzv-conf", f"is_host={int(h == 0)}",
                   "--max-restarts", "30", "--monitor-interval", "0.1", "--local-addr", tb.addr(h, None),
                   str(HERE / "rail_failover_baseline_train.py"), "--steps", str(steps), "--out", str(out),
                   "--timeout-s", str(timeout_s), "--ckpt-every", str(ckpt_every)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=(out / f"agent.{h}.txt").open("w")))
        player = FaultPlayer(tb, faults)
        log = out / "steps.0.jsonl"
        deadline = time.time() + 400
        try:
            while time.time() < deadline and not (log.exists() and '"step": 0,' in log.read_text()):
                time.sleep(0.05)
            t0 = time.time()
            player.start(t0)
            while time.time() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.1)
        finally:
            player.stop()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(10)
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    starts = [r for r in rows if r.get("event") == "start"]
    done = {}
    for r in rows:  # a step re-done after a restart counts when it finally committed
        if "event" not in r:
            done[r["step"]] = r["t_wall"]
    commits = sorted(done.values())
    ok = len(done) == steps and all(p.returncode == 0 for p in procs)
    s = summarize(commits, None, player.records, max(r["restart"] for r in starts), commits[-1] - t0)
    s["completed"] = ok
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="about a minute")
    ap.add_argument("--baseline-timeout-s", type=float, default=5.0)
    a = ap.parse_args()
    steps = 700 if a.quick else 1200
    # a short flap (under the baseline's timeout: it stalls) and a long one (over it: it restarts)
    faults = [Fault(4.0, "flap", host=1, rail=0, duration_s=3.0),
              Fault(12.0, "flap", host=2, rail=0, duration_s=7.0)]
    if not a.quick:
        faults += [Fault(26.0, "flap", host=3, rail=0, duration_s=7.0)]
    with tempfile.TemporaryDirectory(prefix="rail_bench") as d:
        sg = run_seamguard(steps, faults, Path(d) / "sg")
        base = run_baseline(steps, faults, Path(d) / "base", a.baseline_timeout_s, ckpt_every=20)
    print(f"flaps: {[f.describe() for f in faults]}; steps: {steps}; baseline gloo timeout "
          f"{a.baseline_timeout_s}s, checkpoint every 20 steps")
    print(f"{'':10s} {'restarts':>9s} {'max_stall_s':>12s} {'regain_95_s':>12s} {'full_mr_s':>10s} {'wall_s':>8s}")
    for name, s in (("seamguard", sg), ("baseline", base)):
        print(f"{name:10s} {s['restarts']:>9d} {s['max_stall_s']:>12.3f} {s['regain_95_s']:>12.3f} "
              f"{s['full_multirail_s']:>10.3f} {s['wall_s']:>8.2f}")
    print(f"wall time ratio baseline/seamguard: {base['wall_s'] / sg['wall_s']:.2f}x")
    keys = ("restarts", "max_stall_s", "regain_95_s", "full_multirail_s", "wall_s")
    print(json.dumps({"seamguard": {k: sg[k] for k in keys}, "baseline": {k: base[k] for k in keys},
                      "wall_ratio": round(base["wall_s"] / sg["wall_s"], 3)}))


if __name__ == "__main__":
    main()
