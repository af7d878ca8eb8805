"""Failover benchmark: seamguard runtime vs torchft vs torchrun elastic + DCP, same model and data.

    PYTHONPATH=src python benchmarks/failover_training.py --quick   # ~2 min: 2 kills per system, faulted runs only
    PYTHONPATH=src python benchmarks/failover_training.py           # 4 reps x 5 kills per system
    PYTHONPATH=src python benchmarks/failover_training.py --fsdp --quick   # sharded: FSDP2
    PYTHONPATH=src python benchmarks/failover_training.py --fsdp --hosts 2 --quick   # 2 hosts, host killed
    PYTHONPATH=src python benchmarks/failover_training.py --fsdp --hosts 2 --hsdp --quick   # the same in HSDP

4 ranks (+1 hot spare for seamguard) train the same MLP on CPU/gloo. A repetition runs
every system once failure-free and once with SIGKILLs of a non-zero rank (``--quick``:
the faulted run only, one repetition, the small model, no probe run — per-kill figures
and ratios, nothing that needs a failure-free run; see ``QUICK_SCOPE``). Kills are
planned from a seeded RNG as (step, rank, phase): the step uniform in its own segment of
the run, the phase uniform in [0, 1) of a step, so kills land anywhere in the step, the
boundary window (all-reduce, optimizer step, commit, the next step's snapshot) included;
every system of a repetition gets the same plan, carried out from outside the job by
benchmarks/_killer.py from the job's own step log and step time, and where each kill
really landed (step in flight, phase) is read back from the logs and reported. The
system order rotates from one repetition to the next (ABCD, BCDA, ...) so a noisy shared
machine's drift is spread over all systems. torchft 0.2.0 runs 4 replica groups of one
rank under its Lighthouse (min 3 replicas; a killed replica is restarted and heals from a
live peer); the torchrun job checkpoints with DCP `async_save` at the Young/Daly interval
derived from a probe run (its measured save stall and write time) and this benchmark's
own failure rate, and resumes with DCP `load`.

Reported per system, every kill and every repetition (median, p10-p90, min-max, n; no
pick): seconds of progress lost per kill (when the step in flight at the kill was
committed, minus when it would have been), kill-to-next-step time, steps redone, failure
cost per kill from whole runs (training time with kills minus the same system's
failure-free time), failure-free wall against plain DDP, and goodput per provisioned
rank-second: useful samples (torchft's steps taken without a replica drop its shard) over
every rank held for the run, a hot spare held idle included. seamguard's ratio to each
baseline (torchft the strongest peer) for each figure, whichever way it falls. It also
measures the snapshot stall against torch.save+fsync of the same state and
restore-from-RAM against torch.load. The last line is one JSON object, also written to
benchmarks/results/failover_training.json (failover_training_quick.json with --quick);
the event twin reads the full one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from seamguard.decide.tiers import daly_interval_s

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 4  # training ranks of every system (seamguard adds one hot spare)
sys.path.insert(0, str(REPO / "benchmarks"))
from _kill_points import (BOUNDARY_FRAC, KillPoint, Row, describe, draw_kill_points,  # noqa: E402
                          goodput_per_rank_s, landed, lost_s, phase_coverage, samples_dropped,
                          step_time_s)
from _killer import Killer, LogTail, pid_from_rows  # noqa: E402
from _model import make_model  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


@dataclass(frozen=True)
class Config:
    steps: int
    kills: tuple[tuple[int, int], ...]   # (step, rank) of every SIGKILL
    ckpt_every: int
    snapshot_every: int | str = 10   # steps, or "auto" (seamguard launch --snapshot-every auto)
    dim: int = 1024
    hidden: int = 2048
    layers: int = 4
    global_batch: int = 64
    dataset: int = 8192
    replicate: int = 1   # HSDP replica groups of the sharded workloads (1: FSDP2 / DDP)
    rank_mttf_h: float | None = None   # with snapshot_every "auto": one rank's failure rate
    kill_points: tuple[KillPoint, ...] = ()   # kills from outside at a phase of the step (DDP runs)
    step_s: float = 0.5   # the probed step time: the killer's aim until the job's own is measured

    def mttf_args(self) -> list[str]:
        return ["--rank-mttf-hours", f"{self.rank_mttf_h:.6f}"] if self.snapshot_every == "auto" and self.rank_mttf_h else []

    def mesh_args(self) -> list[str]:
        """The sharded workloads' (torchrun_fsdp_train.py, examples/train_fsdp.py) HSDP option."""
        return ["--replicate", str(self.replicate)] if self.replicate > 1 else []

    def model_args(self) -> list[str]:
        return ["--dim", str(self.dim), "--hidden", str(self.hidden), "--layers",
                str(self.layers), "--global-batch", str(self.global_batch), "--dataset",
                str(self.dataset)]

    def chaos(self) -> str:
        return "; ".join(f"kill:rank={r},step={s},phase=step" for s, r in self.kills)


def draw_kills(rng: random.Random, segment: int, count: int) -> tuple[tuple[int, int], ...]:
    """Kill i uniform in the segment centred on step (i + 1) * segment, an eighth of a
    segment kept clear at each end so one recovery ends before the next kill; victims
    are ranks 1..3 (rank 0 stays, as a job's coordinator usually does)."""
    margin = max(1, segment // 8)
    return tuple((rng.randrange(int((i + 0.5) * segment) + margin,
                                int((i + 1.5) * segment) - margin + 1),
                  rng.randrange(1, WORLD_SIZE)) for i in range(count))


# ---------------------------------------------------------------- log analysis
def read_logs(out: Path) -> list[tuple[int, float, int]]:
    """(step, time, generation) for every committed step line of every worker."""
    rows = []
    for f in out.glob("worker_*.log"):
        for line in f.read_text().splitlines():
            p = line.split()
            rows.append((int(p[0]), float(p[1]), int(p[4])))
    return sorted(rows, key=lambda r: r[1])


def read_rows(out: Path) -> list[Row]:
    """Every committed step line of every worker, with its rank."""
    tail = LogTail(out)
    tail.poll()
    return sorted(tail.rows, key=lambda r: r.time_s)


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
def run(cmd: list[str], log: Path, env: dict, timeout_s: float,
        killer: Killer | None = None) -> float:
    """Run a job to its end (``killer``, if any, running beside it); its wall time."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        if killer is not None:
            killer.start()
        try:
            code = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)
            raise
        finally:
            if killer is not None:
                killer.stop()
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{cmd[:6]}... exited {code}; see {log}")
    return wall


def killer_for(cfg: Config, out: Path, faults: bool, pid_of, deadline_s: float) -> Killer | None:
    """The outside killer of a faulted DDP run (None where the run has chaos kills or none)."""
    if not (faults and cfg.kill_points):
        return None
    return Killer(out, cfg.kill_points, pid_of, cfg.step_s, deadline_s)


def seamguard_pid(events_file: Path):
    """pid_of for seamguard: the rank's newest row names its worker (worker_<wid>.log); the
    launcher's events name that worker's pid."""
    def pid_of(tail: LogTail, rank: int, after_s: float) -> int | None:
        row = tail.newest_of(rank, after_s)
        if row is None or not events_file.exists():
            return None
        wid = int(tail.source_of_row[row].split("_")[1])
        pids = [e["pid"] for e in map(json.loads, events_file.read_text().splitlines())
                if e.get("event") == "worker" and e.get("wid") == wid and e.get("pid")]
        return pids[-1] if pids else None
    return pid_of


def outcomes(rows: list[Row], killed: list[dict], same_generation_ok: bool) -> list[dict]:
    """Per kill of an outside-killed run: where it landed (step in flight, phase), kill to
    next step and steps lost (per_failure), and the seconds of progress it cost (lost_s)."""
    out, prev_s = [], 0.0
    for k in killed:
        window = [r for r in rows if prev_s < r.time_s <= k["time_s"]]
        step_s = step_time_s(window, k["time_s"]) or k["aim_step_s"]
        where = landed(rows, k["time_s"], step_s)
        as_chaos = {"time_s": k["time_s"], "step": where["step"]}
        (pf,) = per_failure([(r.step, r.time_s, r.gen) for r in rows], [as_chaos], same_generation_ok)
        lost = lost_s(rows, k["time_s"], step_s, not same_generation_ok)
        out.append({**pf, "rank": k["rank"], "aim_step": k["step"], "aim_phase": k["aim_phase"],
                    "aim_step_s": k["aim_step_s"], "time_s": round(k["time_s"], 6),
                    "phase": where["phase"], "boundary": where["boundary"], "step_s": round(step_s, 4),
                    "lost_s": None if lost is None else round(lost, 3)})
        prev_s = k["time_s"]
    return out


def run_plain(cfg: Config, work: Path, faults: bool, name: str) -> dict:
    """The reference: torchrun + DDP, no checkpoints, no fault tolerance, no failures."""
    assert not faults, "plain DDP has no way to survive a kill"
    out = work / name
    wall = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(WORLD_SIZE), str(REPO / "benchmarks" / "torchrun_train.py"),
                "--steps", str(cfg.steps), "--ckpt-every", "0", "--out", str(out),
                *cfg.model_args()], work / f"{name}.log", ENV, 900)
    return {"wall_s": wall, "window_s": window_s(out), "failures": [],
            "ranks_provisioned": WORLD_SIZE, "samples": cfg.steps * cfg.global_batch}


def run_seamguard(cfg: Config, work: Path, faults: bool, name: str, chaos: str | None = None) -> dict:
    out, chaos_dir = work / name, work / f"{name}_chaos"
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", str(WORLD_SIZE), "--spares", "1",
           "--snapshot-every", str(cfg.snapshot_every), "--events-file", str(out / "events.jsonl"),
           "--chaos-dir", str(chaos_dir)]
    if faults and (chaos or cfg.kills):
        cmd += ["--chaos", chaos or cfg.chaos()]
    cmd += ["--", str(REPO / "examples" / "train_ddp.py"), "--steps", str(cfg.steps),
            "--dropout", "0", "--out", str(out), *cfg.model_args()]
    killer = None if chaos else killer_for(cfg, out, faults, seamguard_pid(out / "events.jsonl"), 900)
    wall = run(cmd, work / f"{name}.log", ENV, 900, killer)
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    failures = outcomes(read_rows(out), killer.records, False) if killer else \
        per_failure(read_logs(out), read_kills(chaos_dir), False)
    return {"wall_s": wall, "window_s": window_s(out), "failures": failures,
            "ranks_provisioned": WORLD_SIZE + 1, "samples": cfg.steps * cfg.global_batch,
            "recovery_s": [round(e["recovery_s"], 3) for e in events
                           if e["event"] == "resumed" and e["gen"] > 0]}


def run_torchrun(cfg: Config, work: Path, faults: bool, name: str, script: str = "torchrun_train.py") -> dict:
    out, chaos_dir = work / name, work / f"{name}_chaos"
    env = {**ENV, "SEAMGUARD_CHAOS_DIR": str(chaos_dir)}
    if faults and cfg.kills:
        env["SEAMGUARD_CHAOS"] = cfg.chaos()
    killer = killer_for(cfg, out, faults, pid_from_rows, 900)
    wall = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(WORLD_SIZE), "--max-restarts",
                str(len(cfg.kills) + len(cfg.kill_points) + 1),
                "--monitor-interval", "0.1", str(REPO / "benchmarks" / script),
                "--steps", str(cfg.steps), "--ckpt-every", str(cfg.ckpt_every), "--out",
                str(out), *cfg.model_args(), *cfg.mesh_args()], work / f"{name}.log", env, 900, killer)
    failures = outcomes(read_rows(out), killer.records, False) if killer else \
        per_failure(read_logs(out), read_kills(chaos_dir), False)
    return {"wall_s": wall, "window_s": window_s(out), "failures": failures,
            "ranks_provisioned": WORLD_SIZE, "samples": cfg.steps * cfg.global_batch}


def probe_checkpointing(cfg: Config, work: Path, runner=None) -> dict:
    """A failure-free torchrun run saving every 4th step: step time, save stall, write time.

    The stall is what saving costs the training loop per checkpoint: every step's excess
    over the median step, summed and divided by the checkpoints (this catches the writer
    thread competing for the cores, not only the time blocked in async_save), and at
    least the median time blocked in async_save itself.
    """
    every = 4
    (runner or run_torchrun)(replace(cfg, ckpt_every=every, kills=()), work, False, "probe")
    times = sorted(t for s, t, _ in read_logs(work / "probe") if True)
    rank0 = [float(x.split()[1]) for x in (work / "probe" / "worker_0.log").read_text().splitlines()]
    dts = [b - a for a, b in itertools.pairwise(rank0[1:])]   # the first step warms up
    step_s = statistics.median(dts)
    rows = [x.split() for x in (work / "probe" / "ckpt_0.log").read_text().splitlines()]
    blocked = statistics.median(float(r[1]) for r in rows)
    write = statistics.median(float(r[2]) for r in rows)
    excess = sum(max(0.0, d - step_s) for d in dts) / max(1, len(rows))
    shutil.rmtree(work / "probe", ignore_errors=True)
    del times
    return {"step_s": step_s, "save_stall_s": max(blocked, excess), "blocked_s": blocked,
            "write_s": write, "probe_every": every, "probe_steps": cfg.steps}


def run_torchft(cfg: Config, work: Path, faults: bool, name: str) -> dict:
    """4 replica groups of one rank + Lighthouse; a killed replica is restarted by us."""
    from seamguard.ports import free_port

    out, chaos_dir = work / name, work / f"{name}_chaos"
    env = {**ENV, "SEAMGUARD_CHAOS_DIR": str(chaos_dir)}
    if faults and cfg.kills:
        env["SEAMGUARD_CHAOS"] = cfg.chaos()
    limit_s = 600.0
    logf = open(work / f"{name}.log", "w")
    # torchft 0.2.0's own binary, its defaults but a 100 ms join timeout (heartbeat 5 s)
    port = free_port()
    exe = shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent / "torchft_lighthouse")
    lighthouse = subprocess.Popen([exe, "--bind", f"127.0.0.1:{port}", "--min_replicas", "3",
                                   "--join_timeout_ms", "100"], env={**os.environ, "RUST_LOG": "error"},
                                  stdout=logf, stderr=subprocess.STDOUT)

    def start(i: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "torchft_train.py"),
                                 "--replica", str(i), "--lighthouse", f"http://127.0.0.1:{port}",
                                 "--steps", str(cfg.steps), "--out", str(out), *cfg.model_args()],
                                env=env, stdout=logf, stderr=subprocess.STDOUT)

    t0 = time.perf_counter()
    procs = {i: start(i) for i in range(WORLD_SIZE)}
    killer = killer_for(cfg, out, faults, lambda _tail, rank, _after: procs[rank].pid
                        if rank in procs else None, limit_s)
    if killer is not None:
        killer.start()
    try:
        supervise_replicas(procs, start, limit_s)
    finally:
        if killer is not None:
            killer.stop()
        for p in procs.values():
            p.kill()
        lighthouse.kill()
        lighthouse.wait(timeout=10)
        logf.close()
    wall = time.perf_counter() - t0
    rows = read_rows(out)
    failures = outcomes(rows, killer.records, True) if killer else \
        per_failure(read_logs(out), read_kills(chaos_dir), True)
    # torchft keeps going without the dead replica: its shards of those steps are dropped
    dropped = samples_dropped(rows, cfg.steps, WORLD_SIZE, cfg.global_batch)
    return {"wall_s": wall, "window_s": window_s(out), "failures": failures,
            "samples_dropped": dropped, "ranks_provisioned": WORLD_SIZE,
            "samples": cfg.steps * cfg.global_batch - dropped}


def supervise_replicas(procs: dict[int, subprocess.Popen], start, limit_s: float) -> None:
    """Restart a replica that died (what a scheduler would do) until the first finishes;
    then give the rest 20 s to finish. ``procs`` is updated in place (the killer reads it)."""
    deadline = time.monotonic() + limit_s
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
                procs[i] = start(i)
            else:
                del procs[i]  # the job is over; a late restart has nobody to heal from
        if finished_at is not None and time.monotonic() - finished_at > 20:
            for p in procs.values():
                p.kill()
            procs.clear()
        time.sleep(0.05)
    if procs:
        raise RuntimeError(f"torchft run did not finish within {limit_s:.0f}s")


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
RUNNERS = {"plain": run_plain, "seamguard": run_seamguard, "torchrun": run_torchrun,
           "torchft": run_torchft}
BASELINES = ("torchrun", "torchft")


# ---------------------------------------------------------------- --fsdp: sharded state
def run_plain_fsdp(cfg: Config, work: Path, faults: bool, name: str) -> dict:
    """The sharded reference: torchrun + FSDP2, no checkpoints, no failures."""
    assert not faults, "plain FSDP2 has no way to survive a kill"
    out = work / name
    wall = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(WORLD_SIZE), str(REPO / "benchmarks" / "torchrun_fsdp_train.py"),
                "--steps", str(cfg.steps), "--ckpt-every", "0", "--out", str(out),
                *cfg.model_args(), *cfg.mesh_args()], work / f"{name}.log", ENV, 900)
    return {"wall_s": wall, "window_s": window_s(out), "failures": []}


def run_torchrun_fsdp(cfg: Config, work: Path, faults: bool, name: str) -> dict:
    return run_torchrun(cfg, work, faults, name, script="torchrun_fsdp_train.py")


def run_seamguard_fsdp(cfg: Config, work: Path, faults: bool, name: str,
                       chaos: str | None = None, every: str = "1") -> dict:
    """examples/train_fsdp.py under seamguard launch, by default a snapshot every step (a
    sharded step commits once its snapshot reached the holder: at most one step redone);
    ``every``: another cadence (fsdp_overhead.py's --snapshot-every)."""
    out, chaos_dir = work / name, work / f"{name}_chaos"
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", str(WORLD_SIZE), "--spares", "1",
           "--snapshot-every", every, "--persist-every", "0", "--events-file", str(out / "events.jsonl"),
           "--chaos-dir", str(chaos_dir)]
    if faults:
        cmd += ["--chaos", chaos or cfg.chaos()]
    cmd += ["--", str(REPO / "examples" / "train_fsdp.py"), "--steps", str(cfg.steps),
            "--dropout", "0", "--out", str(out), *cfg.model_args(), *cfg.mesh_args()]
    wall = run(cmd, work / f"{name}.log", ENV, 900)
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    shards = sorted(f.name + ":" + f.read_text() for f in out.glob("final_shard_*.txt"))
    return {"wall_s": wall, "window_s": window_s(out), "shards": shards,
            "failures": per_failure(read_logs(out), read_kills(chaos_dir), False),
            "recovery_s": [round(e["recovery_s"], 3) for e in events
                           if e["event"] == "resumed" and e["gen"] > 0],
            "phases_s": [e["phases_s"] for e in events if e.get("kind") == "recovered"]}


def main_fsdp(args) -> None:
    """`--fsdp`: the same comparison with sharded state (FSDP2 on 4 ranks + 1 spare):
    plain FSDP2, seamguard (examples/train_fsdp.py), torchrun + FSDP2 + DCP async_save at
    the Young/Daly interval; then a node loss (the victim's host memory gone with it: the
    spare takes its shard from the holder's replica). Bit-identity: every seamguard run's
    final shards must equal its failure-free run's."""
    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="sg-failover-fsdp-"))
    kills_per_run = args.kills if args.kills is not None else 1
    try:
        small = {"hidden": 1024, "layers": 3} if args.quick else {}
        base = Config(steps=16 if args.quick else 24, kills=(), ckpt_every=0, **small)
        probe = probe_checkpointing(base, work, run_torchrun_fsdp)
        step_s = probe["step_s"]
        segment = 12 if args.quick else max(10, round(args.segment_s / step_s))
        mttf_s = segment * step_s
        interval_s = max(daly_interval_s(probe["save_stall_s"], mttf_s), probe["write_s"])
        every = max(1, round(interval_s / step_s))
        steps = (kills_per_run + 1) * segment
        cfg = replace(base, steps=steps, ckpt_every=every)
        print(f"fsdp probe: step {step_s:.3f}s; DCP async_save stall {probe['save_stall_s']:.3f}s, "
              f"write {probe['write_s']:.3f}s; failure every {segment} steps -> checkpoint every "
              f"{every} steps", flush=True)
        systems = ["plain", "seamguard", "torchrun"]
        runners = {"plain": run_plain_fsdp, "seamguard": run_seamguard_fsdp,
                   "torchrun": run_torchrun_fsdp}
        rng = random.Random(args.seed)
        reps: list[dict] = []
        identical: list[bool] = []
        for rep in range(args.reps):
            kills = draw_kills(rng, segment, kills_per_run)
            rcfg = replace(cfg, kills=kills)
            order = rotated(systems, rep)
            print(f"rep {rep + 1}/{args.reps}: {steps} steps, kills (step, rank) {list(kills)}, "
                  f"order {' '.join(order)}", flush=True)
            runs: dict[str, dict] = {}
            for system in order:
                modes = [False] if system == "plain" else [False, True]
                if rep % 2:
                    modes.reverse()
                runs[system] = {}
                for faults in modes:
                    name = f"r{rep}_{system}_{'faults' if faults else 'clean'}"
                    r = runners[system](rcfg, work, faults, name)
                    runs[system]["faults" if faults else "clean"] = r
                    shutil.rmtree(work / name / "ckpt", ignore_errors=True)
                    fails = ", ".join(f"kill@{f['step']}: next step {f['resume_s']}s, lost "
                                      f"{f['steps_lost']}" for f in r["failures"])
                    print(f"  {system:9s} {'faults' if faults else 'clean ':6s} training "
                          f"{r['window_s']:6.1f}s (process {r['wall_s']:5.1f}s) {fails}", flush=True)
            sg = runs["seamguard"]
            identical.append(bool(sg["clean"]["shards"]) and sg["clean"]["shards"] == sg["faults"]["shards"])
            reps.append({"kills": [list(k) for k in kills], "order": order, "runs": runs})
        summary: dict = {s: summarize(s, reps) for s in systems if s != "plain"}
        plain_windows = [r["runs"]["plain"]["clean"]["window_s"] for r in reps]
        # a whole node's memory lost with the rank (chaos `nodeloss`: its snapshots deleted,
        # then killed): the spare must take the shard from the replica on the holder
        s0, victim = reps[0]["kills"][0]
        nl = run_seamguard_fsdp(cfg, work, True, "seamguard_nodeloss",
                                f"nodeloss:rank={victim},step={s0},phase=step")
        nl_clean = reps[0]["runs"]["seamguard"]["clean"]["shards"]
        summary["seamguard_nodeloss"] = {**single(nl, statistics.median(plain_windows)),
                                         "bit_identical": nl["shards"] == nl_clean,
                                         "recovery_s": nl["recovery_s"]}
        print(f"\nmedian [min-max] over {args.reps} interleaved reps, {kills_per_run} kill(s) each; "
              f"plain FSDP2 failure-free training {fmt(spread(plain_windows, 1), 's')}")
        print(f"{'system':10s} {'failure cost/kill':>22s} {'kill->next step':>22s} "
              f"{'steps lost':>14s} {'wall vs plain':>22s} {'failure-free vs plain':>22s}")
        for s in ("seamguard", "torchrun"):
            sp = summary[s]["spread"]
            print(f"{s:10s} {fmt(sp['failure_cost_per_failure_s'], 's'):>22s} "
                  f"{fmt(sp['resume_s'], 's'):>22s} {fmt(sp['steps_lost']):>14s} "
                  f"{fmt(sp['wall_ratio'], 'x'):>22s} {fmt(sp['failure_free_wall_ratio'], 'x'):>22s}")
        print(f"seamguard node loss at step {s0}: " + ", ".join(
            f"next step {f['resume_s']}s, lost {f['steps_lost']}" for f in nl["failures"])
            + f"; bit-identical {summary['seamguard_nodeloss']['bit_identical']}", flush=True)
        summary.update({
            "mode": "fsdp-quick" if args.quick else "fsdp",
            "seamguard_bit_identical": identical,
            "config": {"world_size": WORLD_SIZE, "spares": 1, "snapshot_every": 1,
                       "steps": cfg.steps, "reps": args.reps, "kills_per_run": kills_per_run,
                       "segment_steps": segment, "seed": args.seed, "step_s": round(step_s, 3),
                       "torchrun_ckpt_every": cfg.ckpt_every, "hidden": cfg.hidden,
                       "layers": cfg.layers, "dim": cfg.dim},
            "torchrun_checkpoint": {"save_stall_s": round(probe["save_stall_s"], 4),
                                    "write_s": round(probe["write_s"], 4),
                                    "interval_s": round(interval_s, 3), "every_steps": every},
            "plain_window_s": spread(plain_windows, 2),
            "seamguard_recovery_s": [x for r in reps
                                     for x in r["runs"]["seamguard"]["faults"]["recovery_s"]],
            "reps": [{"kills": r["kills"], "order": r["order"],
                      "failures": {s: ms["faults"]["failures"] for s, ms in r["runs"].items()
                                   if "faults" in ms},
                      "window_s": {f"{s}_{m}": round(v["window_s"], 2)
                                   for s, ms in r["runs"].items() for m, v in ms.items()}}
                     for r in reps],
            "benchmark_wall_s": round(time.perf_counter() - t_start, 1),
        })
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    except BaseException:
        print(f"run logs kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)


def spread(values: list[float], digits: int = 3) -> dict | None:
    """Median and range over repetitions (three runs make an IQR meaningless)."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": round(statistics.median(v), digits), "min": round(min(v), digits),
            "max": round(max(v), digits), "n": len(v)}


def fmt(s: dict | None, unit: str = "") -> str:
    if s is None:
        return "n/a"
    return f"{s['median']:g}{unit} [{s['min']:g}-{s['max']:g}]"


def summarize(system: str, reps: list[dict]) -> dict:
    """One system over all repetitions; keeps the keys the event twin reads
    (resume_s_max, steps_lost_max, wall_ratio) beside the spreads."""
    cost, cost_per, wall, free, resumes, lost = [], [], [], [], [], []
    for rep in reps:
        clean, fault, plain = rep["runs"][system]["clean"], rep["runs"][system]["faults"], \
            rep["runs"]["plain"]["clean"]
        kills = max(1, len(rep["kills"]))
        cost.append(fault["window_s"] - clean["window_s"])
        cost_per.append(cost[-1] / kills)
        wall.append(fault["window_s"] / plain["window_s"])
        free.append(clean["window_s"] / plain["window_s"])
        resumes += [f["resume_s"] for f in fault["failures"]]
        lost += [f["steps_lost"] for f in fault["failures"]]
    ok_resumes = [r for r in resumes if r is not None]
    ok_lost = [x for x in lost if x is not None]
    return {"resume_s_max": max(ok_resumes) if ok_resumes else None,
            "steps_lost_max": max(ok_lost) if ok_lost else None,
            "wall_ratio": round(statistics.median(wall), 3),
            "failure_free_wall_ratio": round(statistics.median(free), 3),
            "unrecovered_failures": len(resumes) - len(ok_resumes),
            "spread": {"failure_cost_s": spread(cost, 2), "failure_cost_per_failure_s": spread(cost_per, 2),
                       "resume_s": spread(resumes), "steps_lost": spread(lost, 1),
                       "wall_ratio": spread(wall), "failure_free_wall_ratio": spread(free)}}


def per_kill(system: str, reps: list[dict]) -> dict:
    """Every kill of every repetition: where it landed, seconds of progress lost, kill to
    next step, steps redone."""
    kills = [f for rep in reps for f in rep["runs"][system]["faults"]["failures"]]
    return {"lost_s": describe([k.get("lost_s") for k in kills]),
            "lost_s_boundary": describe([k.get("lost_s") for k in kills if k.get("boundary")]),
            "lost_s_inside": describe([k.get("lost_s") for k in kills if k.get("boundary") is False]),
            "resume_s": describe([k["resume_s"] for k in kills]),
            "steps_lost": describe([k["steps_lost"] for k in kills], 1),
            "phase_coverage": phase_coverage([k.get("phase") for k in kills]),
            "kills": len(kills)}


def per_kill_and_capacity(system: str, reps: list[dict]) -> dict:
    """:func:`per_kill`, and goodput with every provisioned rank charged (a hot spare held
    idle counts like a training rank), against plain DDP's in the same rep."""
    def goodput(run: dict) -> float:
        return goodput_per_rank_s(run["samples"], run["ranks_provisioned"], run["window_s"])

    plain = [goodput(rep["runs"]["plain"]["clean"]) for rep in reps]
    clean = [goodput(rep["runs"][system]["clean"]) for rep in reps]
    fault = [goodput(rep["runs"][system]["faults"]) for rep in reps]
    ranks = reps[0]["runs"][system]["clean"]["ranks_provisioned"]
    return {
        "per_kill": per_kill(system, reps),
        "capacity": {"ranks_provisioned": ranks, "spare_ranks": ranks - WORLD_SIZE,
                     "spare_idle_rank_s": describe([(ranks - WORLD_SIZE) * rep["runs"][system]["faults"]["window_s"]
                                                    for rep in reps], 1),
                     "goodput_samples_per_rank_s_clean": describe(clean),
                     "goodput_samples_per_rank_s_faults": describe(fault),
                     "goodput_vs_plain_clean": describe([c / p for c, p in zip(clean, plain)]),
                     "goodput_vs_plain_faults": describe([f / p for f, p in zip(fault, plain)])},
    }


def versus(reps: list[dict], summary: dict, opponent: str) -> dict:
    """seamguard over ``opponent`` for every figure: per kill (ratio of the medians over all
    kills), per repetition (paired ratios: failure-free wall, goodput charged for every
    provisioned rank). Reported whichever way it falls."""
    sg, op = summary["seamguard"], summary[opponent]

    def paired(fn) -> dict | None:
        return describe([fn(r, "seamguard") / fn(r, opponent) for r in reps if fn(r, opponent)])

    def good(rep, s, mode):
        run = rep["runs"][s][mode]
        return goodput_per_rank_s(run["samples"], run["ranks_provisioned"], run["window_s"])

    cost_sg, cost_op = sg["spread"]["failure_cost_per_failure_s"], op["spread"]["failure_cost_per_failure_s"]
    return {
        **versus_per_kill(sg["per_kill"], op["per_kill"]),
        "failure_cost_per_kill_ratio_of_medians": _of_medians(cost_sg, cost_op),
        "failure_cost_per_kill_median_difference_s": round(cost_sg["median"] - cost_op["median"], 3),
        "failure_free_wall_ratio": paired(lambda r, s: r["runs"][s]["clean"]["window_s"]),
        "goodput_clean_ratio": paired(lambda r, s: good(r, s, "clean")),
        "goodput_faults_ratio": paired(lambda r, s: good(r, s, "faults")),
    }


def _of_medians(a: dict | None, b: dict | None) -> float | None:
    return round(a["median"] / b["median"], 3) if a and b and b["median"] > 0 else None


def versus_per_kill(sg: dict, op: dict) -> dict:
    """seamguard's per-kill figures (:func:`per_kill`) over an opponent's: ratios of the
    medians over all kills, and differences where a median can be 0."""
    def difference(key: str, digits: int) -> float | None:
        return round(sg[key]["median"] - op[key]["median"], digits) if sg[key] and op[key] else None

    return {"lost_s_ratio_of_medians": _of_medians(sg["lost_s"], op["lost_s"]),
            "lost_s_median_difference_s": difference("lost_s", 3),
            "resume_s_ratio_of_medians": _of_medians(sg["resume_s"], op["resume_s"]),
            "steps_lost_median_difference": difference("steps_lost", 2)}


def print_per_kill(summary: dict, ran: list[str], versus_each: dict) -> None:
    print(f"\nper kill, median [p10-p90] (min-max), n; goodput = samples per provisioned rank-s "
          f"(spares charged), vs plain DDP in the same rep")
    for s in ran:
        k, c = summary[s]["per_kill"], summary[s].get("capacity")   # no capacity: --quick
        cov = k["phase_coverage"]
        cap = (f"; {c['ranks_provisioned']} ranks: goodput vs plain {dfmt(c['goodput_vs_plain_clean'], 'x')} "
               f"failure-free, {dfmt(c['goodput_vs_plain_faults'], 'x')} with kills") if c else ""
        print(f"{s:10s} lost {dfmt(k['lost_s'], 's')}; next step {dfmt(k['resume_s'], 's')}; redone "
              f"{dfmt(k['steps_lost'])}; phases by tenth {cov['bins']} ({cov['boundary']} of {cov['n']} "
              f"in the boundary window){cap}")
    for b, v in versus_each.items():
        whole = (f", failure cost per kill {v['failure_cost_per_kill_ratio_of_medians']} (difference "
                 f"{v['failure_cost_per_kill_median_difference_s']} s); paired per rep: failure-free wall "
                 f"{dfmt(v['failure_free_wall_ratio'], 'x')}, goodput {dfmt(v['goodput_clean_ratio'], 'x')} "
                 f"failure-free, {dfmt(v['goodput_faults_ratio'], 'x')} with kills") \
            if "failure_free_wall_ratio" in v else ""
        print(f"seamguard / {b}: lost per kill {v['lost_s_ratio_of_medians']} (ratio of medians; difference "
              f"{v['lost_s_median_difference_s']} s), next step {v['resume_s_ratio_of_medians']}{whole}")


def dfmt(d: dict | None, unit: str = "") -> str:
    if d is None:
        return "n/a"
    return f"{d['median']:g}{unit} [{d['p10']:g}-{d['p90']:g}] ({d['min']:g}-{d['max']:g}) n={d['n']}"


def versus_best_baseline(reps: list[dict], summary: dict) -> dict | None:
    """seamguard over the baseline with the lowest median failure cost, paired per rep."""
    ran = [b for b in BASELINES if b in summary]
    if "seamguard" not in summary or not ran:
        return None
    best = min(ran, key=lambda b: summary[b]["spread"]["failure_cost_s"]["median"])

    def paired(key) -> dict | None:
        return spread([key(r, "seamguard") / key(r, best) for r in reps if key(r, best)], 3)

    def cost(rep, s):
        return rep["runs"][s]["faults"]["window_s"] - rep["runs"][s]["clean"]["window_s"]

    def wall(rep, s):
        return rep["runs"][s]["faults"]["window_s"]

    def free(rep, s):
        return rep["runs"][s]["clean"]["window_s"]

    def of_medians(key: str) -> float | None:
        a, b = summary["seamguard"]["spread"][key], summary[best]["spread"][key]
        return round(a["median"] / b["median"], 3) if a and b and b["median"] else None

    # paired ratios of differences can turn negative when a failure costs less than the
    # run-to-run noise; the ratios of medians beside them cannot
    return {"baseline": best, "failure_cost_ratio": paired(cost), "wall_ratio_ratio": paired(wall),
            "failure_free_wall_ratio_ratio": paired(free),
            "failure_cost_ratio_of_medians": of_medians("failure_cost_s"),
            "resume_s_ratio_of_medians": of_medians("resume_s")}


def single(r: dict, plain_window_s: float) -> dict:
    """A one-off run (the job-wide crashes) in the layout the twin reads."""
    resumes = [f["resume_s"] for f in r["failures"] if f["resume_s"] is not None]
    lost = [f["steps_lost"] for f in r["failures"] if f["steps_lost"] is not None]
    return {"resume_s_max": max(resumes) if resumes else None,
            "steps_lost_max": max(lost) if lost else None,
            "wall_ratio": round(r["window_s"] / plain_window_s, 3), "runs": 1}


def rotated(systems: list[str], rep: int) -> list[str]:
    k = rep % len(systems)
    return systems[k:] + systems[:k]


def _every(text: str) -> int | str:
    """A snapshot cadence argument: steps, or auto."""
    return "auto" if text == "auto" else int(text)


def main() -> None:  # noqa: C901
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None,
                    help="interleaved repetitions (default 4: every system once in each slot of "
                         "the rotated order; 1 with --quick; with --fsdp 3)")
    ap.add_argument("--kills", type=int, default=None,
                    help="SIGKILLs per run (default 5, so 20 per system; 2 with --quick; with "
                         "--fsdp 1)")
    ap.add_argument("--segment-s", type=float, default=8.0,
                    help="mean training seconds between kills in full mode (the failure "
                         "rate every system sees, and the MTTF torchrun's interval assumes)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill steps and victims")
    ap.add_argument("--skip-torchft", action="store_true", help="leave torchft out")
    ap.add_argument("--keep-logs", action="store_true", help="keep every run's logs (path on stderr)")
    ap.add_argument("--rescore", type=Path, default=None, metavar="WORK",
                    help="recompute the per-kill figures of --out from a --keep-logs run's WORK "
                         "directory with this file's analysis (no runs)")
    ap.add_argument("--small", action="store_true",
                    help="full mode with --quick's 3.2M-parameter model (shorter steps: more kills "
                         "in the same time)")
    ap.add_argument("--no-job-wide", action="store_true",
                    help="full mode: skip the two one-off job-wide crash runs")
    ap.add_argument("--snapshot-every", type=int, default=10,
                    help="seamguard's full-snapshot cadence in steps (a loss redoes only the "
                         "step in flight whatever it is; it bounds the rollback when a live "
                         "replica is missing)")
    ap.add_argument("--sharded-snapshot-every", type=_every, default=1,
                    help="with --fsdp --hosts 2: seamguard's snapshot cadence in steps, or auto "
                         "(Daly's interval for the measured snapshot cost and the failure rate "
                         "torchrun's interval assumes) (default "
                         "1: FSDP2 has no other copy of a shard; in HSDP the replicate peer "
                         "holds it live, so a loss redoes only the step in flight whatever it is)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results file (default benchmarks/results/failover_training.json, "
                         "failover_training_quick.json with --quick; with --fsdp "
                         "failover_training_fsdp[_quick].json)")
    ap.add_argument("--fsdp", action="store_true",
                    help="sharded state: FSDP2 on 4 ranks (seamguard, torchrun + DCP async "
                         "checkpoints, plain FSDP2), then a node loss")
    ap.add_argument("--hosts", type=int, choices=(1, 2), default=1,
                    help="with --fsdp: 2 runs it over 2 namespaced hosts with a rank and a whole "
                         "host killed, torchft HSDP included (benchmarks/_fsdp_hosts.py; needs root)")
    ap.add_argument("--hsdp", action="store_true",
                    help="with --fsdp --hosts 2: every system in HSDP (replicate 2 across the hosts "
                         "x shard 2 within a host), plain HSDP the reference")
    ap.add_argument("--profile", action="store_true",
                    help="with --fsdp --hosts 2: seamguard's workers run with SEAMGUARD_PROFILE=1 and "
                         "its failure-free runs' per-phase ms per step are reported (adds timing calls)")
    args = ap.parse_args()
    if args.profile and not (args.fsdp and args.hosts == 2):
        ap.error("--profile needs --fsdp --hosts 2")
    if args.hsdp and not (args.fsdp and args.hosts == 2):
        ap.error("--hsdp needs --fsdp --hosts 2")
    if args.rescore:
        if args.out is None or not (args.rescore / "reps.json").exists():
            ap.error("--rescore WORK needs --out RESULT and WORK/reps.json (a --keep-logs run)")
        doc = rescore(args.out, args.rescore)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(json.dumps(doc))
        return
    if args.fsdp:
        args.reps = args.reps or 3
    if args.fsdp and args.hosts == 2:
        from _fsdp_hosts import main_hosts

        stem = "failover_training_fsdp_hosts" + ("_hsdp" if args.hsdp else "")
        args.out = args.out or REPO / "benchmarks" / "results" / (f"{stem}_quick.json" if args.quick else f"{stem}.json")
        main_hosts(args)
        return
    if args.fsdp:
        if args.out is None:
            args.out = REPO / "benchmarks" / "results" / (
                "failover_training_fsdp_quick.json" if args.quick else "failover_training_fsdp.json")
        main_fsdp(args)
        return
    if args.out is None:
        args.out = REPO / "benchmarks" / "results" / (
            "failover_training_quick.json" if args.quick else "failover_training.json")
    kills_per_run = args.kills if args.kills is not None else (2 if args.quick else 5)
    args.reps = args.reps or (1 if args.quick else 4)
    t_start = time.perf_counter()
    provenance = {"command": " ".join(["python", "benchmarks/failover_training.py", *sys.argv[1:]]),
                  "commit": git_commit(), "loadavg_start": [round(x, 1) for x in os.getloadavg()]}
    work = Path(tempfile.mkdtemp(prefix="sg-failover-"))
    try:
        # quick mode: a smaller model (3.2M params) for everything, the micro-benchmark too
        small = {"hidden": 1024, "layers": 3} if args.quick or args.small else {}
        micro = state_micro(Config(1, (), 1, **small), work, repeats=3 if args.quick else 5)
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

        base = Config(steps=24, kills=(), ckpt_every=0, snapshot_every=args.snapshot_every, **small)
        step_s, segment, every, ckpt_info = (quick_plan(micro) if args.quick
                                             else young_daly_plan(base, work, args.segment_s))
        steps = (kills_per_run + 1) * segment
        cfg = replace(base, steps=steps, ckpt_every=every)

        # --quick: every system's faulted run only (no plain DDP, no failure-free runs)
        systems = ["seamguard", "torchrun"] if args.quick else ["plain", "seamguard", "torchrun"]
        torchft_note = None
        if args.skip_torchft:
            torchft_note = "skipped (--skip-torchft)"
        else:
            try:
                import torchft  # noqa: F401

                systems.append("torchft")
            except ImportError as exc:
                torchft_note = f"skipped: torchft not installed ({exc})"
        if torchft_note:
            print(f"torchft {torchft_note}", flush=True)

        rng = random.Random(args.seed)
        reps: list[dict] = []
        for rep in range(args.reps):
            kills = draw_kill_points(rng, segment, kills_per_run, WORLD_SIZE)
            rcfg = replace(cfg, kill_points=kills, step_s=step_s)
            order = rotated(systems, rep)
            print(f"rep {rep + 1}/{args.reps}: {steps} steps, kills (step, rank, phase) "
                  f"{[(k.step, k.rank, round(k.phase, 2)) for k in kills]}, "
                  f"order {' '.join(order)}", flush=True)
            runs: dict[str, dict] = {}
            for system in order:
                modes = [False] if system == "plain" else [True] if args.quick else [False, True]
                if rep % 2:
                    modes.reverse()   # clean/faulted order alternates too
                runs[system] = {}
                for faults in modes:
                    name = f"r{rep}_{system}_{'faults' if faults else 'clean'}"
                    try:
                        r = RUNNERS[system](rcfg, work, faults, name)
                    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                        if system != "torchft":
                            raise
                        torchft_note = f"torchft run failed: {exc}"
                        systems.remove("torchft")
                        runs.pop("torchft", None)
                        break
                    runs[system]["faults" if faults else "clean"] = r
                    shutil.rmtree(work / name / "ckpt", ignore_errors=True)
                    fails = ", ".join(f"kill@{f['step']}+{f['phase']}: lost {f['lost_s']}s, next "
                                      f"step {f['resume_s']}s, redone {f['steps_lost']}"
                                      for f in r["failures"])
                    print(f"  {system:9s} {'faults' if faults else 'clean ':6s} training "
                          f"{r['window_s']:6.1f}s (process {r['wall_s']:5.1f}s) {fails}", flush=True)
            reps.append({"kills": [[k.step, k.rank, round(k.phase, 4)] for k in kills], "order": order,
                         "runs": {s: v for s, v in runs.items() if v}})
            (work / "reps.json").write_text(json.dumps(reps))   # kept with the logs if the summary fails

        ran = [s for s in systems if s != "plain"]
        summary: dict = quick_summary(reps, ran) if args.quick else systems_summary(reps, ran)
        plain_windows = [r["runs"]["plain"]["clean"]["window_s"] for r in reps if "plain" in r["runs"]]
        vs, versus_each = summary.get("seamguard_vs_best_baseline"), summary["seamguard_vs"]
        extra: dict = {}
        if not args.quick and not args.no_job_wide:
            # one-off, after the reps: a crash every rank hits at once (replacements adopt
            # the snapshots the dead processes left in shared memory), and the same crash
            # by an uncaught exception (each process leaves the failed step's start in
            # shared memory on its way out); the twin reads both
            s = reps[0]["kills"][0][0]
            every_rank = "; ".join(f"kill:rank={r},step={s},phase=step" for r in range(WORLD_SIZE))
            jw = run_seamguard(cfg, work, True, "seamguard_job_wide", every_rank)
            jx = run_seamguard(cfg, work, True, "seamguard_job_wide_exception",
                               every_rank.replace("kill:", "raise:"))
            plain_med = statistics.median(plain_windows)
            extra = {"seamguard_job_wide": single(jw, plain_med),
                     "seamguard_job_wide_exception": single(jx, plain_med)}
            for name, r in (("job-wide kill", jw), ("job-wide raise", jx)):
                print(f"seamguard {name} at step {s}: " + ", ".join(
                    f"next step {f['resume_s']}s, lost {f['steps_lost']}" for f in r["failures"])
                    + f"; training {r['window_s']:.1f}s", flush=True)

        if not args.quick:
            print_whole_runs(summary, ran, args.reps, kills_per_run, plain_windows)
        print_per_kill(summary, ran, versus_each)
        if vs:
            print(f"seamguard / {vs['baseline']} (paired per rep): failure cost "
                  f"{fmt(vs['failure_cost_ratio'])}, training time with failures "
                  f"{fmt(vs['wall_ratio_ratio'])}, failure-free {fmt(vs['failure_free_wall_ratio_ratio'])}; "
                  f"ratio of medians: failure cost {vs['failure_cost_ratio_of_medians']}, "
                  f"kill->next step {vs['resume_s_ratio_of_medians']}")

        summary.update(extra)
        summary.update({
            "kill_model": "SIGKILL from outside at (step, rank, phase): phase uniform in [0, 1) of the "
                          "job's own step time, aimed from the commit of step - 2 (benchmarks/_killer.py); "
                          f"boundary window: the first and last {BOUNDARY_FRAC:g} of a step",
            # the runtime's default (overlapped) snapshot, as a training step sees it
            "snapshot_stall_ratio": round(micro["step_stall_overlap_s"] / micro["save_fsync_s"], 4),
            "snapshot_stall_ratio_blocking": round(micro["step_stall_blocking_s"] / micro["save_fsync_s"], 4),
            "restore_speedup": round(micro["torch_load_s"] / micro["restore_ram_s"], 2),
            "mode": "quick" if args.quick else "full",
            "quick_scope": QUICK_SCOPE if args.quick else None,
            "config": {"world_size": WORLD_SIZE, "snapshot_every": cfg.snapshot_every,
                       "steps": cfg.steps, "reps": args.reps, "kills_per_run": kills_per_run,
                       "segment_steps": segment, "seed": args.seed,
                       "torchrun_ckpt_every": cfg.ckpt_every, "step_s": round(step_s, 3),
                       "hidden": cfg.hidden, "layers": cfg.layers,
                       "micro_params": micro["params"], "micro_state_bytes": micro["state_bytes"]},
            "torchrun_checkpoint": ckpt_info,
            "torchft_config": {"version": "0.2.0", "replica_groups": WORLD_SIZE, "min_replicas": 3,
                               "join_timeout_ms": 100, "heartbeat_timeout_ms": 5000,
                               "process_group": "ProcessGroupGloo, timeout 30 s",
                               "restart": "a dead replica restarted by the benchmark at once"},
            "plain_window_s": spread(plain_windows, 2),
            "seamguard_recovery_s": [x for r in reps
                                     for x in r["runs"]["seamguard"]["faults"].get("recovery_s", [])],
            "torchft_note": torchft_note,
            "micro_s": {k: round(v, 4) for k, v in micro.items() if k.endswith("_s")},
            "reps": reps_record(reps),
            "benchmark_wall_s": round(time.perf_counter() - t_start, 1),
            **provenance, "loadavg_end": [round(x, 1) for x in os.getloadavg()],
        })
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    except BaseException:
        print(f"run logs kept in {work}", file=sys.stderr)
        raise
    if args.keep_logs:
        print(f"run logs kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)


def young_daly_plan(base: Config, work: Path, segment_s: float) -> tuple[float, int, int, dict]:
    """The full run's plan from a probe run: step time, steps between kills (``segment_s``
    of training), and torchrun's DCP interval by Young/Daly for that failure rate."""
    probe = probe_checkpointing(base, work)
    step_s = probe["step_s"]
    segment = max(10, round(segment_s / step_s))
    mttf_s = segment * step_s
    # Young/Daly with the stall the loop pays per save; never more often than a save
    # takes to reach disk (one save in flight at a time)
    interval_s = max(daly_interval_s(probe["save_stall_s"], mttf_s), probe["write_s"])
    every = max(1, round(interval_s / step_s))
    info = {"saver": "torch.distributed.checkpoint.async_save (thread, own gloo group)",
            "loader": "torch.distributed.checkpoint.load",
            "interval_rule": "max(seamguard.decide.tiers.daly_interval_s(save_stall_s, "
                             "mttf_s), write_s), rounded to steps",
            "save_stall_s": round(probe["save_stall_s"], 4),
            "blocked_in_async_save_s": round(probe["blocked_s"], 4),
            "write_s": round(probe["write_s"], 4), "mttf_s": round(mttf_s, 2),
            "interval_s": round(interval_s, 3), "every_steps": every}
    print(f"probe: step {step_s:.3f}s; DCP async_save stall {probe['save_stall_s']:.3f}s "
          f"(blocked in the call {probe['blocked_s']:.3f}s), write {probe['write_s']:.3f}s; "
          f"failure every {segment} steps = {mttf_s:.1f}s of training -> Young/Daly "
          f"{interval_s:.2f}s = checkpoint every {every} steps", flush=True)
    return step_s, segment, every, info


#: What --quick leaves out to fit about two minutes: on 2 shared cores process start-up,
#: not training, is most of a run's time (its 8 launches took 8 min at load 17-23).
QUICK_SCOPE = ("faulted runs only, one of each system in the rotated order: per-kill figures (progress "
               "lost, kill to next step, steps redone, where each kill landed) and seamguard's ratios to "
               "each baseline per kill; no plain DDP or failure-free runs, so no failure cost over whole "
               "runs, failure-free wall or goodput; no probe run: torchrun saves every 4 steps (the probe's "
               "cadence), not at the Young/Daly interval")
QUICK_SEGMENT, QUICK_CKPT_EVERY = 10, 4


def quick_plan(micro: dict) -> tuple[float, int, int, dict]:
    """--quick's plan without a probe run: the killer's first aim from the in-process
    step time (it aims by the job's own step time once the job has logged 3 steps)."""
    info = {"saver": "torch.distributed.checkpoint.async_save (thread, own gloo group)",
            "loader": "torch.distributed.checkpoint.load",
            "interval_rule": f"--quick: every {QUICK_CKPT_EVERY} steps (no probe run)",
            "every_steps": QUICK_CKPT_EVERY}
    print(f"--quick: {QUICK_SCOPE}", flush=True)
    return micro["train_cycle_s"] / 2, QUICK_SEGMENT, QUICK_CKPT_EVERY, info


def print_whole_runs(summary: dict, ran: list[str], reps: int, kills: int, plain_windows: list[float]) -> None:
    print(f"\nmedian [min-max] over {reps} interleaved reps, {kills} kill(s) each; "
          f"plain DDP failure-free training {fmt(spread(plain_windows, 1), 's')}")
    print(f"{'system':10s} {'failure cost/kill':>22s} {'kill->next step':>22s} "
          f"{'steps lost':>14s} {'wall vs plain':>22s} {'failure-free vs plain':>22s}")
    for s in ran:
        sp = summary[s]["spread"]
        print(f"{s:10s} {fmt(sp['failure_cost_per_failure_s'], 's'):>22s} "
              f"{fmt(sp['resume_s'], 's'):>22s} {fmt(sp['steps_lost']):>14s} "
              f"{fmt(sp['wall_ratio'], 'x'):>22s} {fmt(sp['failure_free_wall_ratio'], 'x'):>22s}")


def systems_summary(reps: list[dict], ran: list[str]) -> dict:
    """Every system's figures over the repetitions, and seamguard's ratios to the baselines."""
    out: dict = {s: {**summarize(s, reps), **per_kill_and_capacity(s, reps)} for s in ran}
    out["seamguard_vs_best_baseline"] = versus_best_baseline(reps, out)
    # the headline opponents, each with every ratio (torchft the strongest peer)
    out["seamguard_vs"] = {b: versus(reps, out, b) for b in BASELINES if b in out and "seamguard" in out}
    out["seamguard_no_failure_wall_ratio"] = out.get("seamguard", {}).get("failure_free_wall_ratio")
    out["torchrun_no_failure_wall_ratio"] = out.get("torchrun", {}).get("failure_free_wall_ratio")
    return out


def quick_summary(reps: list[dict], ran: list[str]) -> dict:
    """--quick's figures: every system's faulted runs only, so per kill (:func:`per_kill`)
    and seamguard's ratios to each baseline per kill; no failure-free run, so no failure
    cost over whole runs, failure-free wall or goodput."""
    out: dict = {}
    for s in ran:
        k = per_kill(s, reps)
        ok_resumes = [f["resume_s"] for rep in reps for f in rep["runs"][s]["faults"]["failures"]
                      if f["resume_s"] is not None]
        out[s] = {"per_kill": k, "resume_s_max": max(ok_resumes) if ok_resumes else None,
                  "steps_lost_max": k["steps_lost"]["max"] if k["steps_lost"] else None,
                  "unrecovered_failures": k["kills"] - len(ok_resumes)}
    out["seamguard_vs"] = {b: versus_per_kill(out["seamguard"]["per_kill"], out[b]["per_kill"])
                           for b in BASELINES if b in out and "seamguard" in out}
    return out


def reps_record(reps: list[dict]) -> list[dict]:
    """The repetitions as the result file keeps them: every kill, every run's times."""
    def per_run(r: dict, fn) -> dict:
        return {f"{s}_{m}": fn(v) for s, ms in r["runs"].items() for m, v in ms.items()}

    return [{"kills": r["kills"], "order": r["order"],
             "failures": {s: ms["faults"]["failures"] for s, ms in r["runs"].items() if "faults" in ms},
             "window_s": per_run(r, lambda v: round(v["window_s"], 2)),
             "process_wall_s": per_run(r, lambda v: round(v["wall_s"], 2)),
             # useful samples per provisioned rank-second, hot spares charged
             "goodput_samples_per_rank_s": per_run(r, lambda v: round(goodput_per_rank_s(
                 v["samples"], v["ranks_provisioned"], v["window_s"]), 3))}
            for r in reps]


def rescore(result: Path, work: Path) -> dict:
    """`--rescore WORK`: every kill's figures recomputed from a kept run's logs
    (`--keep-logs`) with this file's analysis, and every summary built on them; the rest
    of the result file (configuration, micro-benchmark, one-off runs) stays as run."""
    doc = json.loads(result.read_text())
    reps = json.loads((work / "reps.json").read_text())
    for i, rep in enumerate(reps):
        for system, modes in rep["runs"].items():
            if "faults" not in modes:
                continue
            rows = read_rows(work / f"r{i}_{system}_faults")
            killed = [{"time_s": f.get("time_s") or kill_time_s(rows, f), "step": f["aim_step"],
                       "rank": f["rank"], "aim_phase": f["aim_phase"],
                       "aim_step_s": f.get("aim_step_s") or f["step_s"]}
                      for f in modes["faults"]["failures"]]
            modes["faults"]["failures"] = outcomes(rows, killed, system == "torchft")
    ran = [s for s in reps[0]["runs"] if s != "plain"]
    doc.update(systems_summary(reps, ran))
    doc["reps"] = reps_record(reps)
    doc["rescored"] = {"commit": git_commit(), "what": "per-kill figures recomputed from the run's "
                       "kept step logs (benchmarks/failover_training.py --rescore)"}
    return doc


def kill_time_s(rows: list[Row], f: dict) -> float:
    """A kill's time, for a run recorded before kills carried it: the first commit of the
    step before the one in flight, plus the recorded phase of a step (of the generations
    that committed that step, the one whose landing reproduces the record)."""
    for gen in sorted({r.gen for r in rows}):
        group = [r.time_s for r in rows if r.step == f["step"] - 1 and r.gen == gen]
        if group and f["phase"] is not None:
            t = min(group) + f["phase"] * f["step_s"]
            where = landed(rows, t, f["step_s"])
            if where["step"] == f["step"] and abs(where["phase"] - f["phase"]) < 1e-3:
                return t
    raise ValueError(f"rescore: no commit of step {f['step'] - 1} reproduces the kill recorded "
                     f"at step {f['step']}, phase {f['phase']}")


def git_commit() -> str:
    """The commit the benchmark ran at, with '+dirty' when the tree had changes."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain") else "")


if __name__ == "__main__":
    main()
