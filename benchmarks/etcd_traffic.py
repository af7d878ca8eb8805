"""What one 2-host seamguard HSDP job asks of etcd, second by second (a diagnostic, no baseline).

`fsdp_overhead.py --hosts 2` counts etcd's requests per step over a whole run, startup
included. This runs the same job once (`_fsdp_hosts.run_seamguard_hosts`, failure-free,
``--snapshot-every auto``) and reads etcd's ``/metrics`` once a second from inside its
namespace (one long-lived helper process, so the sampling adds no process start-ups), with
etcd's user and system CPU from ``/proc``. Each line is one second: the requests served by
gRPC method (the JSON gateway's calls are counted there too), the watch events sent, and
etcd's CPU; TRAIN marks seconds inside the training window (first to last commit). The
last line is one JSON object: the medians of those rates over the training window.

    PYTHONPATH=src python benchmarks/etcd_traffic.py --steps 80            # the --quick model
    PYTHONPATH=src python benchmarks/etcd_traffic.py --steps 50 --full     # the 14.7M-parameter model
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _fsdp_hosts as fh
import failover_training as ft
from fsdp_overhead import _TICK_S, etcd_requests

SCRAPER = ("import sys, urllib.request\nfor _ in sys.stdin:\n"
           "    t = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()\n"
           "    sys.stdout.write(str(len(t)) + '\\n' + t); sys.stdout.flush()\n")


def etcd_cpu_ms(pid: int) -> dict[str, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick_ms = 1000.0 * _TICK_S
    return {"etcd user CPU ms": int(fields[11]) * tick_ms, "etcd system CPU ms": int(fields[12]) * tick_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--full", action="store_true", help="the full-size model (default: --quick's)")
    args = ap.parse_args()
    small = {} if args.full else {"hidden": 1024, "layers": 3}
    cfg = ft.Config(steps=args.steps, kills=(), ckpt_every=0, replicate=2, snapshot_every="auto", **small)
    work = Path(tempfile.mkdtemp(prefix="sg-etcd-traffic-"))
    samples: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()
    with fh.cluster(work, torchft=False) as c:
        helper = subprocess.Popen([*c.tb.exec_prefix(fh.SERVICE_HOST), sys.executable, "-c", SCRAPER,
                                   f"http://{c.etcd.address}/metrics"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

        def sample() -> None:
            while not stop.is_set():
                helper.stdin.write("\n")
                helper.stdin.flush()
                text = helper.stdout.read(int(helper.stdout.readline()))
                samples.append((time.time(), {**etcd_requests(text), **etcd_cpu_ms(c.etcd.pid)}))
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            fh.run_seamguard_hosts(c, cfg, work, "sg", False, None)
        finally:
            stop.set()
            sampler.join()
            helper.kill()
    rows = ft.read_logs(work / "sg")
    shutil.rmtree(work, ignore_errors=True)
    t0, t1 = rows[0][1], rows[-1][1]
    training: dict[str, list[float]] = {}
    for (ta, a), (tb, b) in zip(samples, samples[1:]):
        rate = {k: (v - a.get(k, 0.0)) / (tb - ta) for k, v in b.items()}
        inside = t0 <= ta and tb <= t1
        if inside:
            for k, v in rate.items():
                training.setdefault(k, []).append(v)
        print(f"{tb - t0:7.1f} s {'TRAIN' if inside else '     '} "
              + "  ".join(f"{k} {v:.1f}/s" for k, v in sorted(rate.items()) if v > 0), flush=True)
    steps_s = (rows[-1][0] - rows[0][0]) / (t1 - t0)
    print(json.dumps({"benchmark": "etcd_traffic", "model": "full" if args.full else "quick",
                      "steps_per_s": round(steps_s, 3),
                      "training_median_per_s": {k: round(statistics.median(v), 2) for k, v in sorted(training.items())
                                                if any(v)},
                      "training_seconds": len(next(iter(training.values()), []))}))


if __name__ == "__main__":
    main()
