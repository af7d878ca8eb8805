"""The runtime on one GPU: snapshot stall, restore, failure-free overhead and recovery,
against what a user runs without seamguard.

    PYTHONPATH=src python benchmarks/gpu_runtime.py --quick          # the device run (one GPU)
    PYTHONPATH=src python benchmarks/gpu_runtime.py --device cpu --quick --hidden 256 --layers 2
        # checks the script's logic on a machine without a GPU; its figures are CPU figures

The model is a stack of ``--layers`` Linear(hidden, hidden) layers (GELU between), fp32
parameters, bf16 autocast on CUDA, fused AdamW: with the defaults 403M parameters, 6.0 GiB
of parameters and optimizer state (what a snapshot holds), about 8 GiB of GPU memory with
the gradients. Three parts, one model size:

1. In one process (``micro``): training steps alternate plain / with a snapshot kind
   (P K1 P K2 ... P, the order of the kinds rotating per repetition), CUDA synchronised
   at both ends of every step; a kind's stall is the larger of its paired slowdown (its
   step minus the mean of the plain steps just before and after it) and its step's
   median minus the plain step's, medians [min-max] over repetitions (the time the
   training thread blocked is reported apart: on a GPU it includes the queued compute). Kinds:
   seamguard overlapped (the runtime's default: side-stream copy into the page-locked
   slot during forward and backward, waited for before the optimizer step), seamguard
   blocking, ``torch.save`` + fsync of model and optimizer state dicts to local disk,
   DCP ``async_save`` (the standard async path; the time it blocks and the step's
   slowdown count; its background write is waited for before the next plain step, not
   counted). Then restore, interleaved: from seamguard's slot (the live process's
   own), ``torch.load`` (the file just written, so from the page cache: the baseline at
   its best) + ``load_state_dict``, and ``dcp.load`` + ``set_state_dict``; each restore
   is checked bit-identical (parameter checksum) to the state that was saved.
2. Failure-free (``overhead``): the same loop as a plain script and under ``seamguard
   launch`` (1 rank + 1 hot spare), alternated, per-step wall from the step log over the
   steps from ``--warm-s`` after the first (start-up, CUDA warm-up and the slots made on
   a thread stay out; snapshots skipped in the window are counted). Snapshot intervals:
   every step (the runtime's
   default, ``--snapshot-every 1``) and the interval Young's rule gives for the stall
   measured in part 1 and ``--mtbf-h`` (the launcher takes ``--snapshot-every`` from the
   user; seamguard's planner only moves the persist cadence), capped at a quarter of
   the run so snapshots are taken at all.
3. Recovery (``recovery``): ``seamguard launch`` (1 rank, a snapshot every step), the
   rank SIGKILLed at ``--kill-step``; warm: a hot spare (CUDA context and model already
   up) adopts the dead rank's shared-memory snapshot; cold: no spare, the launcher's
   replacement process starts after the loss. Kill to the first step committed after
   it, and the phases from the events file.

A part's results are written to ``--json`` as soon as it ends (the failure-free part after
every run), so a device run cut by its time limit keeps what it measured; part 1 of an
earlier run on the same device kind can be reused with ``--micro-json``. With the
defaults on an H100, part 1 takes about 4 minutes, part 3 about 2.5, part 2 about 3.

One GPU: NCCL across ranks is not exercised (world size 1; the gradient collective is a
gloo group of one). Last stdout line: one JSON object, also written to ``--json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}

#: A large job's mean time between interruptions: Llama 3, 16,384 H100s, 419 unexpected
#: interruptions in 54 days (docs/sources.md) -> 3.09 h.
LLAMA3_JOB_MTBF_H = 54 * 24 / 419


@dataclass(frozen=True)
class Config:
    device: str = "cuda"
    hidden: int = 8192
    layers: int = 6
    batch: int = 8192          # rows (tokens) per step
    dataset: int = 16384
    reps: int = 5              # micro repetitions (after one warm-up round)
    steps: int = 650           # per failure-free run (plain, planned interval)
    every_step_steps: int = 230  # the run with a snapshot every step (slower steps)
    warm_s: float = 15.0       # excluded from the failure-free window: start-up, slots made
    max_every: int = 50        # cap on the planned interval, so the window holds snapshots
    overhead_reps: int = 2
    kill_step: int = 100       # late enough that every slot exists (they are made on a thread)
    recovery_reps: int = 1
    mtbf_h: float = LLAMA3_JOB_MTBF_H


# ------------------------------------------------------------------ model and step
def build(cfg: Config, seed: int = 0):
    """Model, fused AdamW (on CUDA), the data rows on the device."""
    dev = torch.device(cfg.device)
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i in range(cfg.layers):   # initialised on the device: seconds less per process
        layers.append(torch.nn.Linear(cfg.hidden, cfg.hidden, device=dev))
        if i < cfg.layers - 1:
            layers.append(torch.nn.GELU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=dev.type == "cuda")
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    data = torch.randn(cfg.dataset, cfg.hidden, generator=g, device=dev)
    return model, opt, data


def forward_backward(model, x: torch.Tensor) -> None:
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
        loss = model(x).float().pow(2).mean()
    loss.backward()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ part 1: micro
def micro(cfg: Config, work: Path) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from seamguard.runtime.data import GlobalBatchSampler
    from seamguard.runtime.snapshot import (
        SlotStore,
        TrainingState,
        state_checksum,
        tensors_of,
    )

    dev = torch.device(cfg.device)
    if not dist.is_initialized():   # DCP's collectives, over a group of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model, opt, data = build(cfg)
    sampler = GlobalBatchSampler(cfg.dataset, cfg.batch)
    state = TrainingState(model, opt, sampler.state_dict)
    step = 0

    def batch() -> torch.Tensor:
        return data[torch.as_tensor(sampler.indices(step, 0, 1), device=dev)]

    for _ in range(3):   # optimizer state created, kernels warm
        forward_backward(model, batch())
        opt.step()
        opt.zero_grad()
        step += 1
    sync(dev)
    state_bytes = sum(t.numel() * t.element_size() for _, t in state.named_tensors())
    slots = SlotStore(f"sggpu-{os.getpid()}", 3)
    save_path = work / "save.pt"
    t0 = time.perf_counter()
    for i in range(3):   # every slot created and page-locked once, as in training
        slots.capture(state, -3 + i, timeout_s=60)
    setup_s = time.perf_counter() - t0
    registered = all(s.registered for s in slots.slots)

    def save_fsync() -> None:
        with open(save_path, "wb") as f:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    pending: list = []   # the DCP write in flight

    def dcp_dir() -> Path:
        return work / "dcp"

    def run_step(kind: str) -> tuple[float, float]:
        """One training step with ``kind``'s checkpoint; (step wall, time blocked)."""
        nonlocal step
        sync(dev)
        t0 = time.perf_counter()
        blocked = 0.0
        cap = staging = None
        t = time.perf_counter()
        if kind in ("sg_overlap", "sg_blocking"):
            cap = slots.begin(state, step, timeout_s=60, overlap=kind == "sg_overlap")
        elif kind == "torch_save":
            save_fsync()
        elif kind == "dcp_async":
            msd, osd = get_state_dict(model, opt)
            resp = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(dcp_dir()))
            staging = getattr(resp, "staging_completion", None)
            pending.append(getattr(resp, "upload_completion", resp))
        blocked += time.perf_counter() - t
        forward_backward(model, batch())
        t = time.perf_counter()
        if cap is not None:
            cap.wait()
        if staging is not None:   # async staging: the copy must be done before the update
            staging.result()
        blocked += time.perf_counter() - t
        opt.step()
        opt.zero_grad()
        sync(dev)
        step += 1
        wall = time.perf_counter() - t0
        while pending:   # the background write, before the next step (not counted)
            pending.pop().result()
        if cap is not None:
            slots.build_manifest(cap.slot, 0, 1)   # the runtime hashes off-thread; not counted
        return wall, blocked

    kinds = ["sg_overlap", "sg_blocking", "torch_save", "dcp_async"]
    walls: dict[str, list[float]] = {k: [] for k in ["plain", *kinds]}
    stalls: dict[str, list[float]] = {k: [] for k in kinds}
    blocked: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(cfg.reps + 1):   # round 0 warms every path up and is dropped
        order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
        before, _ = run_step("plain")
        for kind in order:
            wall, held = run_step(kind)
            after, _ = run_step("plain")
            if rep:
                walls["plain"].append(before)
                walls[kind].append(wall)
                stalls[kind].append(wall - (before + after) / 2)
                blocked[kind].append(held)
            before = after

    # restore, interleaved; each checked against the state it saved
    restores: dict[str, list[float]] = {"sg_restore": [], "torch_load": [], "dcp_load": []}
    identical: dict[str, bool] = {k: True for k in restores}
    for rep in range(cfg.reps + 1):
        slot = slots.capture(state, step, timeout_s=60)
        manifest = slots.build_manifest(slot, 0, 1)
        save_fsync()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(dcp_dir()))
        saved = state_checksum(model, params_only=True)
        order = list(restores)[rep % 3:] + list(restores)[:rep % 3]
        for kind in order:
            forward_backward(model, batch())   # move the live state away from the saved one
            opt.step()
            opt.zero_grad()
            sync(dev)
            t0 = time.perf_counter()
            if kind == "sg_restore":
                tensors, meta = tensors_of(manifest, slot.array)
                state.restore(tensors, meta)
            elif kind == "torch_load":
                sd = torch.load(save_path, map_location=dev, weights_only=True)
                model.load_state_dict(sd["model"])
                opt.load_state_dict(sd["optim"])
            else:
                msd, osd = get_state_dict(model, opt)
                dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(dcp_dir()))
                set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            sync(dev)
            if rep:
                restores[kind].append(time.perf_counter() - t0)
            identical[kind] &= state_checksum(model, params_only=True) == saved
    file_bytes = save_path.stat().st_size
    slots.close()
    shutil.rmtree(dcp_dir(), ignore_errors=True)
    save_path.unlink(missing_ok=True)
    med = statistics.median
    out = {
        "state_bytes": state_bytes, "params": sum(p.numel() for p in model.parameters()),
        "torch_save_file_bytes": file_bytes, "slots_page_locked": registered,
        "slot_setup_s": round(setup_s, 3),
        "plain_step_s": spread(walls["plain"]),
        "stall_s": {k: spread(v) for k, v in stalls.items()},
        "blocked_s": {k: spread(v) for k, v in blocked.items()},
        "step_s": {k: spread(v) for k, v in walls.items()},
        "restore_s": {k: spread(v) for k, v in restores.items()},
        "restore_bit_identical": identical,
    }
    out["d2h_gib_per_s"] = round(state_bytes / 2**30 / max(med(blocked["sg_blocking"]), 1e-9), 2)
    return {**out, **micro_ratios(out)}


def micro_ratios(m: dict) -> dict:
    """Stalls and the ratios, from part 1's medians.

    A kind's stall: the larger of its paired slowdown (median) and its step's median
    over the plain step's. Not the time the training thread blocked: on a GPU that
    includes waiting for the forward and backward queued ahead of it (reported apart)."""
    plain = m["step_s"]["plain"]["median"]
    stall = {k: round(max(v["median"], m["step_s"][k]["median"] - plain), 4)
             for k, v in m["stall_s"].items()}
    restore = {k: v["median"] for k, v in m["restore_s"].items()}
    return {"stall_used_s": stall,
            "stall_ratio_vs_save": ratio(stall["sg_overlap"], stall["torch_save"]),
            "stall_ratio_vs_dcp_async": ratio(stall["sg_overlap"], stall["dcp_async"]),
            "restore_speedup_vs_torch_load": ratio(restore["torch_load"], restore["sg_restore"]),
            "restore_speedup_vs_dcp_load": ratio(restore["dcp_load"], restore["sg_restore"])}


def spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
            "max": round(max(xs), 4), "n": len(xs)}


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


# ------------------------------------------------------------------ the training script
def train(args: argparse.Namespace) -> None:
    """The loop both runs execute: plain (``--plain``) or under ``seamguard launch``.
    One line per committed step: ``step wall_time gen``."""
    cfg = Config(device=args.device, hidden=args.hidden, layers=args.layers, batch=args.batch,
                 dataset=args.dataset)
    from seamguard.runtime.data import GlobalBatchSampler

    dev = torch.device(cfg.device)
    model, opt, data = build(cfg)
    sampler = GlobalBatchSampler(cfg.dataset, cfg.batch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plain:
        with open(out / "worker_plain.log", "a") as log:
            for step in range(args.steps):
                forward_backward(model, data[torch.as_tensor(sampler.indices(step, 0, 1), device=dev)])
                opt.step()
                opt.zero_grad()
                sync(dev)
                log.write(f"{step} {time.time():.6f} 0\n")
                log.flush()
        return
    import seamguard.runtime as sgr

    rt = sgr.init()
    rt.register(model, opt, sampler)
    with open(out / f"worker_{rt.wid}.log", "a") as log:
        for step, idx in rt.steps(args.steps):
            forward_backward(model, data[torch.as_tensor(idx, device=dev)])
            if rt.sync_gradients():
                opt.step()
                opt.zero_grad()
                sync(dev)
                log.write(f"{step} {time.time():.6f} {rt.gen}\n")
                log.flush()
            else:
                opt.zero_grad()
    rt.finish()
    os._exit(0)


def train_args(cfg: Config, steps: int, out: Path) -> list[str]:
    return [str(Path(__file__).resolve()), "--train", "--device", cfg.device, "--hidden", str(cfg.hidden),
            "--layers", str(cfg.layers), "--batch", str(cfg.batch), "--dataset", str(cfg.dataset),
            "--steps", str(steps), "--out", str(out)]


def step_rows(out: Path) -> list[tuple[int, float, int]]:
    rows = []
    for f in out.glob("worker_*.log"):
        for line in f.read_text().splitlines():
            s, t, g = line.split()
            rows.append((int(s), float(t), int(g)))
    return sorted(rows, key=lambda r: r[1])


def run(cmd: list[str], log: Path, timeout_s: float, env: dict | None = None) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env or ENV, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s,
                           check=False)
    if p.returncode != 0:
        text = log.read_text()
        said = [ln for ln in text.splitlines() if "seamguard launcher:" in ln or "seamguard worker" in ln]
        tail = "\n".join(said[-30:]) + "\n--- last lines ---\n" + text[-1500:]
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {p.returncode}; log {log}:\n{tail}")
    return time.perf_counter() - t0


def launch_cmd(cfg: Config, out: Path, steps: int, spares: int, every: int, chaos: str = "") -> list[str]:
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", "1", "--spares", str(spares),
           "--snapshot-every", str(every), "--events-file", str(out / "events.jsonl"),
           "--chaos-dir", str(out / "chaos")]
    if chaos:
        cmd += ["--chaos", chaos]
    return [*cmd, "--", *train_args(cfg, steps, out)]


# ------------------------------------------------------------------ part 2: failure-free
def window(rows: list[tuple[int, float, int]], warm_s: float) -> dict:
    """Per-step wall over the committed steps from ``warm_s`` after the first one (first
    commit of each step): start-up, CUDA warm-up and slot creation stay out."""
    first: dict[int, float] = {}
    for s, t, _ in rows:
        first.setdefault(s, t)
    t0 = min(first.values())
    steps = sorted(s for s, t in first.items() if t - t0 >= warm_s)
    if len(steps) < 10:
        raise RuntimeError(f"only {len(steps)} steps after the {warm_s} s warm-up: run more steps")
    span = first[steps[-1]] - first[steps[0]]
    return {"per_step_s": span / (len(steps) - 1), "steps": len(steps), "first_step": steps[0]}


def young_every(stall_s: float, step_s: float, mtbf_h: float, cap: int) -> tuple[int, int]:
    """(snapshot interval Young's rule gives, in steps; the one used: capped at ``cap``)."""
    from seamguard.decide.tiers import young_interval_s

    if stall_s <= 0:
        planned = cap
    else:
        planned = max(1, round(young_interval_s(stall_s, mtbf_h * 3600.0) / step_s))
    return planned, max(1, min(planned, cap))


def overhead(cfg: Config, work: Path, every_plan: int, progress=None) -> dict:
    """Plain loop, a snapshot every step and the planned interval, alternated; after
    every run ``progress`` gets the summary so far (a run cut short keeps it)."""
    systems = {"plain": None, "sg_every_step": 1, "sg_planned": every_plan}
    acc = _Overhead(systems)
    names = list(systems)
    env = {**ENV, "SEAMGUARD_PROFILE": "1"}
    for rep in range(cfg.overhead_reps):
        for name in names[rep % 3:] + names[:rep % 3]:
            out = work / f"ff_{name}_{rep}"
            # a snapshot every step is the slow case: fewer steps measure it as well
            steps = cfg.every_step_steps if systems[name] == 1 else cfg.steps
            if systems[name] is None:
                cmd = [sys.executable, *train_args(cfg, steps, out), "--plain"]
            else:
                cmd = launch_cmd(cfg, out, steps, 1, systems[name])
            try:
                wall = run(cmd, work / f"ff_{name}_{rep}.log", 600, env)
                acc.add(name, wall, window(step_rows(out), cfg.warm_s), read_events(out))
            except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
                acc.errors.append(f"{name} rep {rep}: {str(exc)[-1500:]}")
                log(f"failure-free run {name} failed: {str(exc)[-1500:]}")
            shutil.rmtree(out, ignore_errors=True)
            if progress is not None:
                progress(acc.summary())
    return acc.summary()


class _Overhead:
    """The failure-free runs measured so far, and their summary."""

    def __init__(self, systems: dict[str, int | None]) -> None:
        self.systems = systems
        self.per_step: dict[str, list[float]] = {k: [] for k in systems}
        self.walls: dict[str, list[float]] = {k: [] for k in systems}
        self.windows: dict[str, list[dict]] = {k: [] for k in systems}
        self.profiles: dict[str, list[dict]] = {k: [] for k in systems if systems[k] is not None}
        self.errors: list[str] = []

    def add(self, name: str, wall: float, win: dict, events: list[dict]) -> None:
        if self.systems[name] is not None:
            win["snapshots_skipped"] = sum(1 for e in events if e.get("kind") == "snapshot_skipped"
                                           and e.get("step", -1) >= win["first_step"])
            self.profiles[name] += [e for e in events if e.get("kind") == "profile"]
        self.walls[name].append(wall)
        self.per_step[name].append(win["per_step_s"])
        self.windows[name].append(win)

    def summary(self) -> dict:
        med = statistics.median
        plain = med(self.per_step["plain"]) if self.per_step["plain"] else 0.0
        plain_wall = med(self.walls["plain"]) if self.walls["plain"] else 0.0
        return {
            "errors": self.errors,
            "per_step_s": {k: spread(v) for k, v in self.per_step.items() if v},
            "process_wall_s": {k: spread(v) for k, v in self.walls.items() if v},
            "window_ratio": {k: ratio(med(v), plain) for k, v in self.per_step.items() if k != "plain" and v},
            "wall_ratio": {k: ratio(med(v), plain_wall) for k, v in self.walls.items() if k != "plain" and v},
            "snapshot_every": {k: v for k, v in self.systems.items() if v is not None},
            "windows": self.windows,
            # the training rank's (the spare's own profile has no steps)
            "profile_phases": {k: max(v, key=lambda e: e.get("steps", 0)).get("phases") if v else None
                               for k, v in self.profiles.items()},
        }


def read_events(out: Path) -> list[dict]:
    f = out / "events.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


# ------------------------------------------------------------------ part 3: recovery
def recovery(cfg: Config, work: Path) -> dict:
    out_all: dict[str, list[dict]] = {"warm_spare": [], "cold_replacement": []}
    env = {**ENV, "SEAMGUARD_PROFILE": "1"}
    plan = [("warm_spare", 1)] * (cfg.recovery_reps + 1) + [("cold_replacement", 0)] * cfg.recovery_reps
    for rep, (name, spares) in enumerate(plan):
        out = work / f"rec_{name}_{rep}"
        chaos = f"kill:rank=0,step={cfg.kill_step},phase=step"
        steps = cfg.kill_step + 15
        try:
            run(launch_cmd(cfg, out, steps, spares, 1, chaos), work / f"rec_{name}_{rep}.log", 600, env)
            out_all[name].append(one_recovery(out))
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
            out_all[name].append({"error": str(exc)[-6000:], "kill_to_step_s": None})
            log(f"recovery run {name} failed: {str(exc)[-6000:]}")
        shutil.rmtree(out, ignore_errors=True)
    res = {}
    for name, runs in out_all.items():
        ok = [r for r in runs if r["kill_to_step_s"] is not None]
        res[name] = {"runs": runs,
                     "kill_to_step_s": spread([r["kill_to_step_s"] for r in ok]) if ok else None}
    return res


def one_recovery(out: Path) -> dict:
    kills = [json.loads(x) for x in (out / "chaos" / "kills.jsonl").read_text().splitlines()]
    t_kill = kills[0]["time_s"]
    rows = step_rows(out)
    before = [r for r in rows if r[1] <= t_kill]
    after = [r for r in rows if r[1] > t_kill]
    events = read_events(out)
    detection = next((e for e in events if e.get("event") == "detected"), {})
    detected = detection.get("t")
    resumed = next((e for e in events if e.get("event") == "resumed" and e.get("gen", 0) > 0), None)
    worker = next((e for e in events if e.get("kind") == "recovered"), None)
    step_s = statistics.median(b[1] - a[1] for a, b in zip(before[-6:], before[-5:])) if len(before) > 5 else None
    last = max((r[0] for r in before), default=-1)
    return {
        "kill_to_step_s": round(after[0][1] - t_kill, 3) if after else None,
        "kill_to_detect_s": round(detected - t_kill, 3) if detected else None,
        "detected_by": detection.get("kind"),
        "detect_to_resumed_s": round(resumed["recovery_s"], 3) if resumed else None,
        "worker_recovery_s": round(worker["seconds"], 3) if worker else None,
        "phases_s": worker.get("phases_s") if worker else None,
        "steps_redone": (last + 1 - after[0][0]) if after else None,
        "step_s": round(step_s, 4) if step_s else None,
        # wall of the first steps after the resume (a new slot layout is made then)
        "after_resume_steps_s": [round(b[1] - a[1], 3) for a, b in itertools.pairwise(after[:6])],
        "snapshots_skipped": sum(1 for e in events if e.get("kind") == "snapshot_skipped"),
        "profiles": {str(e.get("wid")): e.get("phases") for e in events if e.get("kind") == "profile"},
    }


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (the device run)")
    ap.add_argument("--hidden", type=int, default=Config.hidden)
    ap.add_argument("--layers", type=int, default=Config.layers)
    ap.add_argument("--batch", type=int, default=Config.batch)
    ap.add_argument("--dataset", type=int, default=Config.dataset)
    ap.add_argument("--steps", type=int, default=Config.steps)
    ap.add_argument("--mtbf-h", type=float, default=Config.mtbf_h)
    ap.add_argument("--every-step-steps", type=int, default=Config.every_step_steps)
    ap.add_argument("--warm-s", type=float, default=Config.warm_s)
    ap.add_argument("--kill-step", type=int, default=Config.kill_step)
    ap.add_argument("--parts", default="micro,overhead,recovery")
    ap.add_argument("--micro-json", default=None,
                    help="take part 1 from this earlier result of the same device (with --parts "
                         "overhead,recovery): its stall and step time set the planned interval")
    ap.add_argument("--work", default=None, help="scratch directory on local disk (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the JSON here")
    ap.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train:
        return train(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch sees no GPU (use --device cpu to check the logic)")
    cfg = Config(device=args.device, hidden=args.hidden, layers=args.layers, batch=args.batch,
                 dataset=args.dataset, steps=args.steps, mtbf_h=args.mtbf_h,
                 every_step_steps=args.every_step_steps, warm_s=args.warm_s, kill_step=args.kill_step,
                 reps=3 if args.quick else 7, overhead_reps=1 if args.quick else 3,
                 recovery_reps=1 if args.quick else 3)
    if cfg.dataset < cfg.batch or cfg.kill_step < 2:
        sys.exit(f"error: need --dataset ({cfg.dataset}) >= --batch ({cfg.batch}) and --kill-step >= 2")
    parts = set(args.parts.split(","))
    work = Path(args.work or tempfile.mkdtemp(prefix="sg-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    dev_name = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else "cpu"
    result: dict = {"benchmark": "gpu_runtime", "device": dev_name, "torch": torch.__version__,
                    "gpu_figures": dev_name != "cpu", "config": asdict(cfg),
                    "nccl": "not exercised: one GPU, world size 1 (gloo group of one)"}
    t_start = time.perf_counter()
    if args.micro_json:
        earlier = json.loads(Path(args.micro_json).read_text())
        if earlier.get("device") != dev_name:
            sys.exit(f"error: --micro-json {args.micro_json} was measured on {earlier.get('device')!r}, "
                     f"this is {dev_name!r}")
        result["micro"] = {**earlier["micro"], **micro_ratios(earlier["micro"])}
        result["micro_from"] = {"file": args.micro_json, "note": "part 1 of an earlier run on the same kind of device"}
    try:
        if "micro" in parts:
            result["micro"] = micro(cfg, work)
            log(f"micro done at {time.perf_counter() - t_start:.0f} s: {json.dumps(result['micro'])}")
            save_json(args.json, result)
        if "recovery" in parts:
            result["recovery"] = recovery(cfg, work)
            log(f"recovery done at {time.perf_counter() - t_start:.0f} s: {json.dumps(result['recovery'])}")
            save_json(args.json, result)
        if "overhead" in parts:
            m = result.get("micro")
            step_s = m["plain_step_s"]["median"] if m else 1.0
            stall = m["stall_used_s"]["sg_overlap"] if m else 0.0
            planned, used = young_every(stall, step_s, cfg.mtbf_h, cfg.max_every)
            result["snapshot_every_planned"] = planned
            def progress(part: dict) -> None:
                result["overhead"] = part
                save_json(args.json, result)

            result["overhead"] = overhead(cfg, work, used, progress)
            log(f"overhead done at {time.perf_counter() - t_start:.0f} s: {json.dumps(result['overhead'])}")
            save_json(args.json, result)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    result.update(headline(result))
    save_json(args.json, result)
    print(json.dumps(result))


def save_json(path: str | None, result: dict) -> None:
    """Write (after every part, so a run cut short keeps what it measured)."""
    if path:
        Path(path).write_text(json.dumps(result, indent=1) + "\n")


def headline(r: dict) -> dict:
    """The issue's keys, each with what it means."""
    m, o, rec = r.get("micro", {}), r.get("overhead", {}), r.get("recovery", {})
    warm = (rec.get("warm_spare") or {}).get("kill_to_step_s") or {}
    return {
        "snapshot_stall_ratio_vs_save": m.get("stall_ratio_vs_save"),
        "snapshot_stall_ratio_vs_dcp_async": m.get("stall_ratio_vs_dcp_async"),
        "failure_free_wall_ratio": (o.get("window_ratio") or {}).get("sg_planned"),
        "failure_free_wall_ratio_every_step": (o.get("window_ratio") or {}).get("sg_every_step"),
        "restore_speedup_vs_torch_load": m.get("restore_speedup_vs_torch_load"),
        "recovery_s": warm.get("median"),
        "meaning": {
            "snapshot_stall_ratio_vs_save": "stall of a step (max of its paired slowdown and the time "
                                            "it blocked, medians) from seamguard's overlapped snapshot / "
                                            "from torch.save+fsync of the same state (goal <= 0.05)",
            "snapshot_stall_ratio_vs_dcp_async": "the same / DCP async_save's (blocked + slowdown)",
            "failure_free_wall_ratio": "per-step wall under seamguard launch (1 rank + hot spare, "
                                       "snapshot interval from Young's rule) / plain loop, after warm-up "
                                       "(goal <= 1.03)",
            "failure_free_wall_ratio_every_step": "the same with a snapshot every step (runtime default)",
            "restore_speedup_vs_torch_load": "torch.load(page cache)+load_state_dict / restore from "
                                             "seamguard's slot (goal >= 10)",
            "recovery_s": "SIGKILL of the rank to the first step committed after it, hot spare on the "
                          "same GPU (goal <= 2 s)",
        },
    }


def log(msg: str) -> None:
    print(f"[gpu_runtime] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
