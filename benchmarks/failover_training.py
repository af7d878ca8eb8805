"""Failover benchmark: seamguard runtime vs torchrun elastic vs torchft, same model and data.

    PYTHONPATH=src python benchmarks/failover_training.py --quick   # about a minute, no torchft
    PYTHONPATH=src python benchmarks/failover_training.py           # a few minutes

4 ranks (+1 hot spare for seamguard) train the same ~15M-parameter MLP on CPU/gloo; a
rank is SIGKILLed on a fixed step schedule (full mode: about every 30 s of training).
Per failure it prints the time from the kill to the next completed step and the steps
lost (completed work that had to be redone); per run the wall time relative to a
failure-free run of plain DDP without checkpoints. It also measures the snapshot stall
against torch.save+fsync of the same state and restore-from-RAM against torch.load.
The last line is one JSON object, also written to benchmarks/results/failover_training.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 4  # training ranks of every system (seamguard adds one hot spare)
sys.path.insert(0, str(REPO / "benchmarks"))
from _model import make_model  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


@dataclass(frozen=True)
class Config:
    steps: int
    fail_steps: tuple[int, ...]
    ckpt_every: int
    snapshot_every: int = 10
    dim: int = 1024
    hidden: int = 2048
    layers: int = 4
    global_batch: int = 64
    dataset: int = 8192

    def model_args(self) -> list[str]:
        return ["--dim", str(self.dim), "--hidden", str(self.hidden), "--layers",
                str(self.layers), "--global-batch", str(self.global_batch), "--dataset",
                str(self.dataset)]

    def chaos(self, ranks: int = 4) -> str:
        # victims rotate over ranks 1..3 so rank 0 (torchrun's checkpoint writer) also lives
        return "; ".join(f"kill:rank={1 + i % (ranks - 1)},step={s},phase=step"
                         for i, s in enumerate(self.fail_steps))


# ---------------------------------------------------------------- log analysis
def read_logs(out: Path) -> list[tuple[int, float, int]]:
    """(step, time, generation) for every committed step line of every worker."""
    rows = []
    for f in out.glob("worker_*.log"):
        for line in f.read_text().splitlines():
            p = line.split()
            rows.append((int(p[0]), float(p[1]), int(p[4])))
    return sorted(rows, key=lambda r: r[1])


def read_kills(chaos_dir: Path) -> list[dict]:
    f = chaos_dir / "kills.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def window_s(out: Path) -> float:
    """Training time: first to last committed step (process start-up excluded)."""
    rows = read_logs(out)
    return rows[-1][1] - rows[0][1]


def per_failure(rows, kills, same_generation_ok: bool) -> list[dict]:
    """Time from each kill to the next completed step after recovery, and steps lost."""
    out = []
    for k in kills:
        t_kill = k["time_s"]
        before = [r for r in rows if r[1] <= t_kill]
        last_step = max((r[0] for r in before), default=-1)
        gen_at_kill = max((r[2] for r in before), default=0)
        after = [r for r in rows if r[1] > t_kill and (
            r[2] > gen_at_kill if not same_generation_ok else r[0] >= k["step"])]
        if not after:
            out.append({"step": k["step"], "resume_s": None, "steps_lost": None})
            continue
        first = after[0]
        resumed_at = min(r[0] for r in after if abs(r[1] - first[1]) < 1.0)
        out.append({"step": k["step"], "resume_s": round(first[1] - t_kill, 3),
                    "steps_lost": max(0, last_step + 1 - resumed_at)})
    return out


# ---------------------------------------------------------------- runs
def run(cmd: list[str], log: Path, env: dict, timeout_s: float) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[:6]}... exited {p.returncode}; see {log}")
    return wall


def run_plain(cfg: Config, work: Path) -> dict:
    """Failure-free reference: torchrun + DDP, no checkpoints, no fault tolerance."""
    out = work / "plain"
    wall = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(WORLD_SIZE), str(REPO / "benchmarks" / "torchrun_train.py"),
                "--steps", str(cfg.steps), "--ckpt-every", "0", "--out", str(out),
                *cfg.model_args()], work / "plain.log", ENV, 900)
    return {"wall_s": wall, "window_s": window_s(out)}


def run_seamguard(cfg: Config, work: Path, faults: bool, name: str, chaos: str | None = None) -> dict:
    out, chaos_dir = work / name, work / f"{name}_chaos"
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", str(WORLD_SIZE), "--spares", "1",
           "--snapshot-every", str(cfg.snapshot_every), "--events-file", str(out / "events.jsonl"),
           "--chaos-dir", str(chaos_dir)]
    if faults:
        cmd += ["--chaos", chaos or cfg.chaos()]
    cmd += ["--", str(REPO / "examples" / "train_ddp.py"), "--steps", str(cfg.steps),
            "--dropout", "0", "--out", str(out), *cfg.model_args()]
    wall = run(cmd, work / f"{name}.log", ENV, 900)
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "window_s": window_s(out),
            "failures": per_failure(read_logs(out), read_kills(chaos_dir), False),
            "recovery_s": [round(e["recovery_s"], 3) for e in events
                           if e["event"] == "resumed" and e["gen"] > 0]}


def run_torchrun(cfg: Config, work: Path, faults: bool, name: str) -> dict:
    out, chaos_dir = work / name, work / f"{name}_chaos"
    env = {**ENV, "SEAMGUARD_CHAOS_DIR": str(chaos_dir)}
    if faults:
        env["SEAMGUARD_CHAOS"] = cfg.chaos()
    wall = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(WORLD_SIZE), "--max-restarts", str(len(cfg.fail_steps) + 1),
                "--monitor-interval", "0.1", str(REPO / "benchmarks" / "torchrun_train.py"),
                "--steps", str(cfg.steps), "--ckpt-every", str(cfg.ckpt_every), "--out",
                str(out), *cfg.model_args()], work / f"{name}.log", env, 900)
    return {"wall_s": wall, "window_s": window_s(out),
            "failures": per_failure(read_logs(out), read_kills(chaos_dir), False)}


def run_torchft(cfg: Config, work: Path) -> dict:
    """4 replica groups of one rank + Lighthouse; a killed replica is restarted by us."""
    os.environ.setdefault("RUST_LOG", "error")
    from torchft._torchft import LighthouseServer

    out, chaos_dir = work / "torchft", work / "torchft_chaos"
    env = {**ENV, "SEAMGUARD_CHAOS_DIR": str(chaos_dir), "SEAMGUARD_CHAOS": cfg.chaos()}
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=3, join_timeout_ms=100)
    limit_s = 600.0
    logf = open(work / "torchft.log", "w")

    def start(i: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "torchft_train.py"),
                                 "--replica", str(i), "--lighthouse", lighthouse.address(),
                                 "--steps", str(cfg.steps), "--out", str(out), *cfg.model_args()],
                                env=env, stdout=logf, stderr=subprocess.STDOUT)

    t0 = time.perf_counter()
    procs = {i: start(i) for i in range(4)}
    deadline = time.monotonic() + limit_s
    try:
        finished_at = None
        while procs and time.monotonic() < deadline:
            for i, p in list(procs.items()):
                code = p.poll()
                if code is None:
                    continue
                if code == 0:
                    del procs[i]
                    finished_at = finished_at or time.monotonic()
                elif finished_at is None:
                    procs[i] = start(i)  # what a scheduler would do
                else:
                    del procs[i]  # the job is over; a late restart has nobody to heal from
            if finished_at is not None and time.monotonic() - finished_at > 20:
                for p in procs.values():
                    p.kill()
                procs = {}
            time.sleep(0.05)
        if procs:
            raise RuntimeError(f"torchft run did not finish within {limit_s:.0f}s")
    finally:
        for p in procs.values():
            p.kill()
        lighthouse.shutdown()
        logf.close()
    wall = time.perf_counter() - t0
    rows = read_logs(out)
    kills = read_kills(chaos_dir)
    failures = per_failure(rows, kills, True)
    # torchft keeps going without the dead replica: its shards of those steps are dropped
    full = {s for s in range(cfg.steps)}
    per_step = {}
    for s, _, _ in rows:
        per_step[s] = per_step.get(s, 0) + 1
    dropped = sum(4 - min(4, per_step.get(s, 0)) for s in full)
    return {"wall_s": wall, "window_s": window_s(out), "failures": failures,
            "samples_dropped": dropped * cfg.global_batch // 4}


# ---------------------------------------------------------------- snapshot / restore
def state_micro(cfg: Config, work: Path, repeats: int) -> dict:  # noqa: C901
    """Snapshot stall vs torch.save+fsync, restore from RAM vs torch.load, same state."""
    from seamguard.runtime.data import GlobalBatchSampler
    from seamguard.runtime.snapshot import SlotStore, TrainingState, tensors_of

    torch.set_num_threads(1)
    model = make_model(cfg.dim, cfg.hidden, cfg.layers, 0.0, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, cfg.dim)).sum().backward()
    opt.step()
    state = TrainingState(model, opt, GlobalBatchSampler(cfg.dataset, cfg.global_batch).state_dict)
    slots = SlotStore(f"sgbench-{os.getpid()}", 3)
    path = work / "save.pt"
    try:
        for i in range(3):  # allocate and touch the 3 slots once (excluded, as in training)
            slots.capture(state, -3 + i, timeout_s=30)
        snap, save, restore, load = [], [], [], []
        for i in range(repeats):
            t = time.perf_counter()
            slot = slots.capture(state, i + 1, timeout_s=30)
            snap.append(time.perf_counter() - t)
            t = time.perf_counter()
            with open(path, "wb") as f:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            save.append(time.perf_counter() - t)
            manifest = slots.build_manifest(slot, 0, 1)
            t = time.perf_counter()
            tensors, meta = tensors_of(manifest, slot.array)
            state.restore(tensors, meta)
            restore.append(time.perf_counter() - t)
            t = time.perf_counter()
            sd = torch.load(path, weights_only=False)
            model.load_state_dict(sd["model"])
            opt.load_state_dict(sd["optim"])
            load.append(time.perf_counter() - t)
        stalls = step_stalls(model, opt, state, slots, cycles=8 * repeats)
    finally:
        slots.close()
    med = statistics.median
    nbytes = sum(t.numel() * t.element_size() for _, t in state.named_tensors())
    return {"state_bytes": nbytes, "params": sum(p.numel() for p in model.parameters()),
            "snapshot_s": med(snap), "save_fsync_s": med(save),
            "restore_ram_s": med(restore), "torch_load_s": med(load), **stalls}


def step_stalls(model, opt, state, slots, cycles: int) -> dict:
    """What a snapshot costs a training step, blocking vs overlapped (the runtime's default).

    A cycle is two training steps (forward, backward, AdamW step); a snapshot cycle takes
    a snapshot at the start of its first step and hashes it on a second thread as the
    worker's pipeline does, both inside the timed cycle. Kinds alternate (plain, blocking,
    overlapped, plain, ...) and each snapshot cycle is compared with the mean of the plain
    cycles just before and after it, so drift of a shared machine cancels. The stall of
    a kind is the larger of the time the training thread was blocked (median) and the
    median of those paired slowdowns (contention for memory bandwidth and cores). The
    forward+backward window the overlapped copy hides behind is measured and printed
    beside the copy time it has to hide.
    """
    import threading

    x = torch.randn(16, model[0].in_features)
    times: dict[str, list[float]] = {"plain": [], "blocking": [], "overlap": []}
    blocked: dict[str, list[float]] = {"blocking": [], "overlap": []}
    window: list[float] = []
    step = 0
    for c in range(cycles + 1):   # the first round warms up and is dropped
        for kind in ("plain", "blocking", "overlap"):
            t0, held, hasher = time.perf_counter(), 0.0, None
            for i in range(2):
                step += 1
                cap = None
                if i == 0 and kind != "plain":
                    t = time.perf_counter()
                    cap = slots.begin(state, step, timeout_s=30, overlap=kind == "overlap")
                    held += time.perf_counter() - t
                tw = time.perf_counter()
                model.zero_grad()
                model(x).sum().backward()
                window.append(time.perf_counter() - tw)
                if cap is not None:
                    t = time.perf_counter()
                    slot = cap.wait()
                    held += time.perf_counter() - t
                    hasher = threading.Thread(target=slots.build_manifest, args=(slot, 0, 1))
                    hasher.start()
                opt.step()
            if hasher is not None:
                hasher.join()
            if c:
                times[kind].append(time.perf_counter() - t0)
                if kind != "plain":
                    blocked[kind].append(held)
    med = statistics.median
    plain = times["plain"]   # plain cycle i precedes snapshot cycles i and follows i-1
    out = {"train_cycle_s": med(plain), "train_window_s": med(window)}
    for kind in ("blocking", "overlap"):
        paired = [t - (plain[i] + plain[i + 1]) / 2 for i, t in enumerate(times[kind][:-1])]
        out[f"step_stall_{kind}_s"] = max(med(blocked[kind]), med(paired))
        out[f"step_blocked_{kind}_s"] = med(blocked[kind])
    return out


# ---------------------------------------------------------------- main
def summarize(r: dict | None, plain: dict) -> dict | None:
    if r is None:
        return None
    resumes = [f["resume_s"] for f in r["failures"] if f["resume_s"] is not None]
    lost = [f["steps_lost"] for f in r["failures"] if f["steps_lost"] is not None]
    return {"resume_s_max": max(resumes) if resumes else None,
            "steps_lost_max": max(lost) if lost else None,
            "wall_ratio": round(r["window_s"] / plain["window_s"], 3),
            "process_wall_ratio": round(r["wall_s"] / plain["wall_s"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-torchft", action="store_true",
                    help="leave torchft out (the default with --quick; --with-torchft adds it)")
    ap.add_argument("--with-torchft", action="store_true", help="run torchft in --quick too")
    ap.add_argument("--snapshot-every", type=int, default=10,
                    help="seamguard's full-snapshot cadence in steps (a loss redoes only the "
                         "step in flight whatever it is; it bounds the rollback when a live "
                         "replica is missing)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results file (default benchmarks/results/failover_training.json, "
                         "failover_training_quick.json with --quick)")
    args = ap.parse_args()
    if args.out is None:
        args.out = REPO / "benchmarks" / "results" / (
            "failover_training_quick.json" if args.quick else "failover_training.json")
    work = Path(tempfile.mkdtemp(prefix="sg-failover-"))
    try:
        micro = state_micro(Config(1, (), 1), work, repeats=3 if args.quick else 5)
        print(f"state {micro['state_bytes'] / 2**20:.0f} MiB ({micro['params'] / 1e6:.1f}M params): "
              f"snapshot {micro['snapshot_s'] * 1e3:.1f} ms vs torch.save+fsync "
              f"{micro['save_fsync_s'] * 1e3:.1f} ms; restore from RAM "
              f"{micro['restore_ram_s'] * 1e3:.1f} ms vs torch.load {micro['torch_load_s'] * 1e3:.1f} ms",
              flush=True)
        print(f"stall of a snapshot on a training step ({micro['train_cycle_s'] * 1e3:.0f} ms per 2 steps; "
              f"forward+backward {micro['train_window_s'] * 1e3:.1f} ms to hide a "
              f"{micro['snapshot_s'] * 1e3:.1f} ms copy): blocking "
              f"{micro['step_stall_blocking_s'] * 1e3:.1f} ms, overlapped "
              f"{micro['step_stall_overlap_s'] * 1e3:.1f} ms "
              f"(training thread blocked {micro['step_blocked_overlap_s'] * 1e3:.1f} ms)", flush=True)
        # quick mode: a smaller model (3.2M params) so the whole comparison takes minutes
        small = {"hidden": 1024, "layers": 3} if args.quick else {}
        if args.quick:   # fixed schedule: no probe run needed
            cfg = Config(steps=30, fail_steps=(10, 20), ckpt_every=8,
                         snapshot_every=args.snapshot_every, **small)
        else:
            probe = Config(steps=20, fail_steps=(), ckpt_every=0)
            step_s = run_plain(probe, work)["window_s"] / (probe.steps - 1)
            shutil.rmtree(work / "plain")
            every = max(5, round(30.0 / step_s))  # one failure per ~30 s of training
            cfg = Config(steps=3 * every, fail_steps=(every, 2 * every),
                         ckpt_every=max(5, every // 3), snapshot_every=args.snapshot_every)
        plain = run_plain(cfg, work)
        step_s = plain["window_s"] / (cfg.steps - 1)
        print(f"step ~{step_s:.3f}s; {cfg.steps} steps, kills at {list(cfg.fail_steps)}, "
              f"torchrun checkpoints every {cfg.ckpt_every} steps", flush=True)
        print(f"plain DDP, no failures: training {plain['window_s']:.1f}s "
              f"(process {plain['wall_s']:.1f}s)", flush=True)
        results: dict[str, dict | None] = {}
        results["seamguard"] = run_seamguard(cfg, work, True, "seamguard")
        results["torchrun"] = run_torchrun(cfg, work, True, "torchrun")
        torchft_note = None
        if args.skip_torchft or (args.quick and not args.with_torchft):
            torchft_note = "skipped (--skip-torchft, or --quick without --with-torchft)"
        else:
            try:
                import torchft  # noqa: F401

                results["torchft"] = run_torchft(cfg, work)
            except ImportError as exc:
                torchft_note = f"torchft not importable: {exc}"
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                torchft_note = f"torchft run failed: {exc}"
        extra = {}
        if not args.quick:
            # a crash every rank hits at once: replacements adopt the snapshots the dead
            # processes left in shared memory (one hot spare; the launcher starts the rest)
            s = cfg.fail_steps[0]
            every_rank = "; ".join(f"kill:rank={r},step={s},phase=step" for r in range(WORLD_SIZE))
            results["seamguard_job_wide"] = run_seamguard(cfg, work, True, "seamguard_job_wide",
                                                          every_rank)
            # the same crash by an uncaught exception: each process leaves the failed
            # step's start in shared memory on its way out (--crash-capture)
            every_raise = every_rank.replace("kill:", "raise:")
            results["seamguard_job_wide_exception"] = run_seamguard(
                cfg, work, True, "seamguard_job_wide_exception", every_raise)
            sg_clean = run_seamguard(cfg, work, False, "seamguard_clean")
            tr_clean = run_torchrun(cfg, work, False, "torchrun_clean")
            extra = {"seamguard_no_failure_wall_ratio": round(sg_clean["window_s"] / plain["window_s"], 3),
                     "torchrun_no_failure_wall_ratio": round(tr_clean["window_s"] / plain["window_s"], 3)}
        for name, r in results.items():
            if r is None:
                continue
            for f in r["failures"]:
                print(f"{name:9s} fault at step {f['step']:4d}: next step after "
                      f"{f['resume_s']}s, steps lost {f['steps_lost']}", flush=True)
            print(f"{name:9s} training {r['window_s']:.1f}s = {r['window_s'] / plain['window_s']:.3f}x "
                  f"failure-free plain DDP (process {r['wall_s']:.1f}s = "
                  f"{r['wall_s'] / plain['wall_s']:.3f}x)"
                  + (f", samples dropped {r['samples_dropped']}" if "samples_dropped" in r else ""),
                  flush=True)
        summary = {name: summarize(results.get(name), plain)
                   for name in ("seamguard", "torchrun", "torchft", "seamguard_job_wide",
                                "seamguard_job_wide_exception")}
        summary.update({
            # the runtime's default (overlapped) snapshot, as a training step sees it
            "snapshot_stall_ratio": round(micro["step_stall_overlap_s"] / micro["save_fsync_s"], 4),
            "snapshot_stall_ratio_blocking": round(micro["step_stall_blocking_s"] / micro["save_fsync_s"], 4),
            "restore_speedup": round(micro["torch_load_s"] / micro["restore_ram_s"], 2),
            "mode": "quick" if args.quick else "full",
            "config": {"world_size": WORLD_SIZE, "snapshot_every": cfg.snapshot_every,
                       "steps": cfg.steps, "fail_steps": list(cfg.fail_steps),
                       "torchrun_ckpt_every": cfg.ckpt_every, "step_s": round(step_s, 3),
                       "hidden": cfg.hidden, "layers": cfg.layers,
                       "micro_params": micro["params"], "micro_state_bytes": micro["state_bytes"]},
            "plain_window_s": round(plain["window_s"], 2), "plain_wall_s": round(plain["wall_s"], 2),
            "seamguard_recovery_s": results["seamguard"].get("recovery_s"),
            "torchft_note": torchft_note,
            "torchft_samples_dropped": (results.get("torchft") or {}).get("samples_dropped"),
            "micro_s": {k: round(v, 4) for k, v in micro.items() if k.endswith("_s")},
            **extra,
        })
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    except BaseException:
        print(f"run logs kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
