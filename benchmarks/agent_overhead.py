"""What `seamguard agent` costs a node: CPU per scrape, % of a core at a 15 s scrape, and RSS,
beside prometheus-node-exporter (default collectors) on the same host.

Both exporters run as their own processes; CPU time is read from /proc/<pid>/stat (user +
system), so the scraping client's own work is not counted. Two parts are measured, in
interleaved repetitions (agent, node_exporter, agent, ...):

- per scrape: ``--scrapes`` back-to-back GETs of /metrics; CPU-seconds / scrape;
- in the background: CPU-seconds per second over ``--idle-s`` seconds with no scrape (the
  agent's storage probe every 15 s and fabric probe rounds every 5 s run there).

% of a core at a 15 s scrape = (CPU per scrape / 15 s + background CPU per second) x 100.
Medians over repetitions, with the spread (min-max). The agent runs a realistic config:
kernel log (/dev/kmsg when readable), NICs and host pressure from the real /sys and /proc,
one storage path (a temp directory, 4 KiB write+fsync+read every 15 s), and a fabric probe
of 8 peers on one rail (every peer is this host's own echo responder on 127.0.0.1).

    PYTHONPATH=src python benchmarks/agent_overhead.py --quick   # about a minute
    PYTHONPATH=src python benchmarks/agent_overhead.py

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import yaml

from seamguard.ports import free_port

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
SCRAPE_INTERVAL_S = 15.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        return len(r.read())


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: exporter exited with {proc.returncode}")
        try:
            get(url)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url}: no answer after {timeout_s} s")


def agent_config(tmp: Path, port: int, echo: int) -> Path:
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    kmsg_ok = os.access("/dev/kmsg", os.R_OK)
    cfg = {
        "version": 1, "node": "bench-node",
        "listen": {"host": "127.0.0.1", "port": port},
        "kernel_log": {"enabled": True, "path": "/dev/kmsg"} if kmsg_ok else {"enabled": False},
        "storage": {"paths": [{"name": "ckpt", "path": str(ckpt)}], "interval_s": 15},
        "fabric": {"port": echo, "listen": "127.0.0.1", "interval_s": 5, "timeout_s": 1,
                   "rails": [{"nic": "bench-node/mlx5_0", "address": "127.0.0.1", "rail": 0,
                              "link": "bench-node/mlx5_0~leaf-0"}],
                   "peers": [{"nic": f"peer-{i}/mlx5_0", "address": "127.0.0.1", "rail": 0} for i in range(8)]},
    }
    path = tmp / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def measure(pid: int, url: str, scrapes: int, idle_s: float) -> dict[str, float]:
    c0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    size = 0
    for _ in range(scrapes):
        size = get(url)
    wall = time.perf_counter() - t0
    per_scrape = (cpu_seconds(pid) - c0) / scrapes
    c1 = cpu_seconds(pid)
    time.sleep(idle_s)
    background = (cpu_seconds(pid) - c1) / idle_s
    return {"cpu_s_per_scrape": per_scrape, "background_cpu_s_per_s": background,
            "pct_core_at_15s": 100.0 * (per_scrape / SCRAPE_INTERVAL_S + background),
            "scrape_wall_ms": 1e3 * wall / scrapes, "bytes": float(size)}


def summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {k: {"median": float(np.median([r[k] for r in rows])), "min": float(min(r[k] for r in rows)),
                "max": float(max(r[k] for r in rows))} for k in rows[0]}


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about a minute: 3 repetitions, 100 scrapes, 6 s idle")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--scrapes", type=int)
    ap.add_argument("--idle-s", type=float)
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 7)
    scrapes = args.scrapes or (100 if args.quick else 300)
    idle_s = args.idle_s or (6.0 if args.quick else 15.0)

    tmp = Path(tempfile.mkdtemp(prefix="sg-agent-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        a_port, echo = free_port(), free_port()
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[1] / "src")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        agent = subprocess.Popen([sys.executable, "-m", "seamguard", "agent", "--config",
                                  str(agent_config(tmp, a_port, echo))],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(agent)
        targets = {"agent": (agent.pid, f"http://127.0.0.1:{a_port}/metrics", agent)}
        if shutil.which(NODE_EXPORTER) or Path(NODE_EXPORTER).exists():
            n_port = free_port()
            ne = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{n_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(ne)
            targets["node_exporter"] = (ne.pid, f"http://127.0.0.1:{n_port}/metrics", ne)
        for _, url, p in targets.values():
            wait_up(url, p)
        time.sleep(2.0)  # first probe rounds, imports settled
        for _, url, _ in targets.values():  # warm: first scrapes build caches
            for _ in range(10):
                get(url)
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in targets}
        for rep in range(reps):
            order = list(targets) if rep % 2 == 0 else list(reversed(targets))
            for name in order:
                pid, url, _ = targets[name]
                rows[name].append(measure(pid, url, scrapes, idle_s))
                r = rows[name][-1]
                print(f"rep {rep} {name:13s} {1e3 * r['cpu_s_per_scrape']:7.2f} ms CPU/scrape  "
                      f"{1e3 * r['background_cpu_s_per_s']:6.2f} ms CPU/s idle  "
                      f"{r['pct_core_at_15s']:.3f} % of a core at 15 s", file=sys.stderr)
        out: dict[str, object] = {"benchmark": "agent_overhead", "reps": reps, "scrapes_per_rep": scrapes,
                                  "idle_s_per_rep": idle_s, "scrape_interval_s": SCRAPE_INTERVAL_S,
                                  "cpus": os.cpu_count()}
        for name, (pid, _, _) in targets.items():
            s = summary(rows[name])
            s["rss_mib"] = {"median": rss_mib(pid)}
            out[name] = s
        out["agent_within_2pct_core"] = out["agent"]["pct_core_at_15s"]["median"] <= 2.0
        for name in targets:
            s = out[name]
            print(f"{name:13s} CPU/scrape {1e3 * s['cpu_s_per_scrape']['median']:.2f} ms "
                  f"[{1e3 * s['cpu_s_per_scrape']['min']:.2f}-{1e3 * s['cpu_s_per_scrape']['max']:.2f}], "
                  f"background {1e3 * s['background_cpu_s_per_s']['median']:.2f} ms/s, "
                  f"{s['pct_core_at_15s']['median']:.3f} % of a core at 15 s "
                  f"[{s['pct_core_at_15s']['min']:.3f}-{s['pct_core_at_15s']['max']:.3f}], "
                  f"RSS {s['rss_mib']['median']:.1f} MiB, {s['bytes']['median'] / 1024:.1f} KiB/scrape")
        print(json.dumps(out))
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
