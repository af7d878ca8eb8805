"""Where seamguard's failure-free overhead over plain FSDP2 goes, phase by phase.

    PYTHONPATH=src python benchmarks/fsdp_overhead.py --quick   # 3 reps, the --fsdp --quick job
    PYTHONPATH=src python benchmarks/fsdp_overhead.py --quick --replicate 2   # the same job in HSDP
    PYTHONPATH=src python benchmarks/fsdp_overhead.py --hosts 2 --replicate 2   # across 2 namespaced hosts

The job of `failover_training.py --fsdp --quick` (FSDP2 on 4 ranks, 3.2M-parameter MLP,
24 steps), failure-free only: plain FSDP2 under torchrun and seamguard (1 hot spare, a
snapshot every step) alternated, repeated. seamguard's workers run with
``SEAMGUARD_PROFILE=1`` (runtime/profile.py) and report, per phase, wall and thread-CPU
milliseconds per step, which this script averages over the ranks and takes the median of
over the reps. Training-thread phases add to the step's wall time; background-thread
phases (``bg_*``) cost only CPU the 2 shared cores would otherwise give to the ranks.
It also samples /proc (every 50 ms) for the CPU time of every process each run starts,
and reports per system the job's CPU milliseconds per step over the training window
(first to last committed step), split by process role: training ranks (and their CPU by
thread: the training thread, seamguard's `sg-*` threads, the rest), and for
seamguard the launcher (coordinator and the job's TCPStore), the zygote and the idle
spare (the replica server, copier and heartbeat threads are inside the ranks).
``--replicate 2``: both systems in HSDP, mesh (2, 2) (torchrun_fsdp_train.py and
examples/train_fsdp.py ``--replicate 2``), seamguard's replica holder then being each rank's
replicate peer. ``--hosts 2``: the job of `failover_training.py --fsdp --hosts 2` (2 ranks on
each of 2 namespaced hosts, etcd on a third, 2 spares a host, 60 steps of the 14.7M-parameter
model; `--quick` keeps the small model, 36 steps), failure-free only, each process's CPU then
also split out for etcd and the torchrun agents, and etcd's served requests per step counted
by gRPC method (its ``/metrics``, read before and after each run: startup included).
``--snapshot-every K``: seamguard's snapshot
cadence (default 1), or ``auto`` (Daly's interval, `seamguard launch --snapshot-every auto`).
Last line of stdout: one JSON object (also written to
benchmarks/results/fsdp_overhead[_hsdp][_quick].json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import failover_training as ft

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _cpu_and_role(pid: int) -> tuple[float, str] | None:
    """(user + system CPU seconds of every thread so far, what the process is)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    # an agent's command line names the training script too: it is told apart first
    role = ("torchrun agent" if "torch.distributed.run" in cmd else
            "rank" if "seamguard: rank" in cmd or "torchrun_fsdp_train" in cmd else
            "launcher" if "seamguard launch" in cmd else "zygote" if "fork server" in cmd else
            "spare" if "spare" in cmd else "etcd" if "etcd" in cmd.split(" ", 1)[0] else "other")
    return (int(fields[11]) + int(fields[12])) * _TICK_S, role


def _rank_threads(pid: int) -> dict[str, float]:
    """A training rank's CPU seconds so far by thread: the training thread, seamguard's
    own threads (named ``sg-*``/``snapshot-*`` in the OS by the runtime), and the rest
    (gloo's and torch's threads, and threads that have exited)."""
    parts = {"training thread": 0.0, "seamguard threads": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue
        part = ("training thread" if task.name == str(pid) else
                "seamguard threads" if comm.startswith(("sg-", "snapshot-")) else None)
        if part:
            parts[part] += (int(fields[11]) + int(fields[12])) * _TICK_S
    return parts


class CpuSampler:
    """Samples the CPU time of every process started under this one, every 50 ms."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[int, tuple[float, str]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            now = time.time()
            got = {}
            for pid in _descendants(me):
                if (v := _cpu_and_role(pid)) is None:
                    continue
                got[pid] = v
                if v[1] == "rank":
                    try:
                        for part, cpu in _rank_threads(pid).items():
                            got[(pid, part)] = (cpu, f"rank: {part}")
                    except OSError:
                        pass
            self.samples.append((now, got))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def per_role_ms(self, t0: float, t1: float, steps: int) -> dict[str, float]:
        """CPU milliseconds per step between wall times t0 and t1, per process role (a
        process's CPU at its last sample before t1, less its CPU at t0 or 0 if it started later)."""
        if not self.samples or steps < 1:
            return {}
        start = min(self.samples, key=lambda s: abs(s[0] - t0))[1]
        end = min(self.samples, key=lambda s: abs(s[0] - t1))[1]
        # a process's role as any sample saw it (an exiting rank's cmdline reads empty)
        roles: dict[int, str] = {}
        for _, got in self.samples:
            for pid, (_, role) in got.items():
                if roles.get(pid, "other") == "other":
                    roles[pid] = role
        out: dict[str, float] = {}
        for pid, (cpu, _) in end.items():
            role = roles[pid]
            out[role] = out.get(role, 0.0) + cpu - start.get(pid, (0.0, role))[0]
        out["job"] = sum(v for k, v in out.items() if ": " not in k)
        if "rank" in out:
            out["rank: gloo, torch, exited threads"] = (
                out["rank"] - sum(v for k, v in out.items() if k.startswith("rank: ")))
        return {k: round(1e3 * v / steps, 1) for k, v in sorted(out.items())}


def cpu_per_step(sampler: CpuSampler, out: Path) -> dict[str, float]:
    rows = ft.read_logs(out)
    return sampler.per_role_ms(rows[0][1], rows[-1][1], rows[-1][0] - rows[0][0])


def rank_phases(events_file: Path) -> list[dict]:
    """The `profile` event of every training rank of one run."""
    events = [json.loads(x) for x in events_file.read_text().splitlines()]
    return [e for e in events if e.get("kind") == "profile" and e.get("rank", -1) >= 0]


def mean_over_ranks(profiles: list[dict]) -> dict[str, dict[str, float]]:
    names = sorted({k for p in profiles for k in p["phases"]})
    out = {}
    for k in names:
        rows = [p["phases"].get(k, {}) for p in profiles]
        out[k] = {m: statistics.fmean(r.get(m, 0.0) for r in rows)
                  for m in ("wall_ms_per_step", "cpu_ms_per_step", "count")}
    return out


@contextmanager
def runner(hosts: int, cfg: ft.Config, work: Path):
    """``run(system, name) -> (result, seamguard's mean-over-ranks profile or None)``, on
    one host or across the namespaced cluster of `failover_training.py --fsdp --hosts 2`
    (set up once, torn down at the end)."""
    if hosts == 1:
        def run(system: str, name: str):
            if system == "plain":
                return ft.run_plain_fsdp(cfg, work, False, name), None
            r = ft.run_seamguard_fsdp(replace(cfg), work, False, name, every=str(cfg.snapshot_every))
            return r, mean_over_ranks(rank_phases(work / name / "events.jsonl"))
        yield run
        return
    import _fsdp_hosts as fh

    with fh.cluster(work, torchft=False) as c:
        def run_hosts(system: str, name: str):
            before = etcd_requests(c.etcd.metrics_text())
            if system == "plain":
                r, profile = fh.run_plain_hosts(c, cfg, work, name), None
            else:
                r = fh.run_seamguard_hosts(c, cfg, work, name, False, None)
                profile = r["profile"] and r["profile"]["phases"]
            after = etcd_requests(c.etcd.metrics_text())
            r["etcd_requests_per_step"] = {k: round((after[k] - before.get(k, 0.0)) / cfg.steps, 2)
                                           for k in sorted(after) if after[k] > before.get(k, 0.0)}
            return r, profile
        yield run_hosts


def etcd_requests(metrics: str) -> dict[str, float]:
    """etcd's served requests so far by gRPC method (its JSON gateway's calls included:
    the gateway forwards each one over gRPC), and the watch events it sent."""
    out: dict[str, float] = {}
    for m in re.finditer(r'^grpc_server_(handled|msg_sent)_total\{([^}]*)\} (\S+)$', metrics, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if m.group(1) == "handled" or labels.get("grpc_type") == "bidi_stream":
            key = labels.get("grpc_method", "?") + (" (stream messages)" if m.group(1) == "msg_sent" else "")
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None, help="default 3 (--quick) or 5")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replicate", type=int, default=1, help="HSDP replica groups of both systems (1: FSDP2)")
    ap.add_argument("--hosts", type=int, choices=(1, 2), default=1,
                    help="2: across 2 namespaced hosts, etcd the job-wide store (the --fsdp --hosts 2 job)")
    ap.add_argument("--snapshot-every", type=ft._every, default=1,
                    help="seamguard's snapshot cadence in steps, or auto (Daly's interval for the "
                         "measured cost and --rank-mttf-hours' default failure rate)")
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 5)
    small = {"hidden": 1024, "layers": 3} if args.quick else {}
    steps = (36 if args.quick else 60) if args.hosts == 2 else (24 if args.quick else 48)
    cfg = ft.Config(steps=steps, kills=(), ckpt_every=0, replicate=args.replicate,
                    snapshot_every=args.snapshot_every, **small)
    stem = ("fsdp_overhead" + ("_hosts" if args.hosts == 2 else "") + ("_hsdp" if args.replicate > 1 else "")
            + (f"_every{args.snapshot_every}" if args.snapshot_every != 1 else ""))
    out = args.out or ft.REPO / "benchmarks" / "results" / (f"{stem}_quick.json" if args.quick else f"{stem}.json")
    ft.ENV["SEAMGUARD_PROFILE"] = "1"
    os.environ["SEAMGUARD_PROFILE"] = "1"   # the namespaced hosts' launchers inherit this environment
    work = Path(tempfile.mkdtemp(prefix="sg-fsdp-overhead-"))
    windows: dict[str, list[float]] = {"plain": [], "seamguard": []}
    cpu: dict[str, list[dict[str, float]]] = {"plain": [], "seamguard": []}
    etcd: dict[str, list[dict[str, float]]] = {"plain": [], "seamguard": []}   # --hosts 2
    phases: list[dict] = []
    loads = [round(os.getloadavg()[0], 2)]
    try:
        with runner(args.hosts, cfg, work) as run:
            for rep in range(reps):
                for system in ft.rotated(["plain", "seamguard"], rep):
                    name = f"r{rep}_{system}"
                    sampler = CpuSampler()
                    try:
                        r, profile = run(system, name)
                    finally:
                        sampler.stop()
                    if profile is not None:
                        phases.append(profile)
                    cpu[system].append(cpu_per_step(sampler, work / name))
                    if "etcd_requests_per_step" in r:
                        etcd[system].append(r["etcd_requests_per_step"])
                    windows[system].append(r["window_s"])
                    loads.append(round(os.getloadavg()[0], 2))
                    print(f"rep {rep + 1}/{reps} {system:9s} training {r['window_s']:.2f}s "
                          f"(load {loads[-1]})", flush=True)
    except BaseException:
        print(f"run logs kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    ratios = [s / p for s, p in zip(windows["seamguard"], windows["plain"])]
    step_ms = {s: 1e3 * statistics.median(v) / (cfg.steps - 1) for s, v in windows.items()}
    table = {k: {m: round(statistics.median(ph[k][m] for ph in phases if k in ph), 3)
                 for m in ("wall_ms_per_step", "cpu_ms_per_step", "count")}
             for k in sorted({k for ph in phases for k in ph})}
    print(f"\nmedian over {reps} interleaved reps; plain {'HSDP' if args.replicate > 1 else 'FSDP2'} step {step_ms['plain']:.1f} ms, "
          f"seamguard {step_ms['seamguard']:.1f} ms; failure-free ratio "
          f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]; "
          f"load {min(loads)}-{max(loads)}")
    print(f"{'phase':24s} {'wall ms/step':>13s} {'cpu ms/step':>12s} {'count/run':>10s}")
    for k, v in table.items():
        print(f"{k:24s} {v['wall_ms_per_step']:13.2f} {v['cpu_ms_per_step']:12.2f} {v['count']:10.0f}")
    cpu_table = {system: {role: round(statistics.median(r[role] for r in runs if role in r), 1)
                          for role in sorted({k for r in runs for k in r})}
                 for system, runs in cpu.items()}
    print("\nCPU ms per step (all threads, median over reps), by process:")
    for system, roles in cpu_table.items():
        print(f"  {system:9s} " + "  ".join(f"{role} {ms}" for role, ms in roles.items()))
    etcd_table = {system: {k: round(statistics.median(r.get(k, 0.0) for r in runs), 2)
                           for k in sorted({k for r in runs for k in r})}
                  for system, runs in etcd.items() if runs}
    if etcd_table:
        print("\netcd requests per step (median over reps), by gRPC method:")
        for system, methods in etcd_table.items():
            print(f"  {system:9s} " + "  ".join(f"{k} {v}" for k, v in methods.items()))
    summary = {"mode": "quick" if args.quick else "full", "reps": reps, "steps": cfg.steps,
               "replicate": args.replicate, "hosts": args.hosts, "snapshot_every": args.snapshot_every,
               "window_s": {s: [round(x, 3) for x in v] for s, v in windows.items()},
               "step_ms": {s: round(v, 1) for s, v in step_ms.items()},
               "failure_free_ratio": ft.spread(ratios), "load": [min(loads), max(loads)],
               "phases_per_step": table, "cpu_ms_per_step": cpu_table,
               "cpu_ms_per_step_runs": cpu, "etcd_requests_per_step": etcd_table}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
