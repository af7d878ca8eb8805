"""Baseline (b): torchrun elastic + DDP with DCP async checkpoints, as a careful user runs it.

Started by benchmarks/failover_training.py through `python -m torch.distributed.run
--max-restarts ...`, with the checkpoint interval that script derives from Young/Daly
(its measured save stall and its own failure rate). Any failure makes torchrun restart
every worker; they load the newest complete checkpoint with DCP `load`.

Checkpoints: `torch.distributed.checkpoint.async_save` (torch 2.13: stages the state in
CPU memory, then writes on a background thread; it needs a CPU backend, and gloo is one)
into one directory per step, on a gloo group of its own so the writer thread's
collectives never interleave with DDP's all-reduces on the default group. A directory
counts once DCP wrote its `.metadata` (the last file of a save, after every rank's data),
so a kill during a write falls back to the previous one. At most one save is in flight:
a new one first waits for the last (that wait counts as stall). Each rank appends
`step blocked_s write_s` per checkpoint to `ckpt_<rank>.log` for the probe that sizes
the interval. Faults come from the same product helper (seamguard.runtime.chaos) as the
seamguard run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _model import make_data, make_model  # noqa: E402

from seamguard.runtime import chaos  # noqa: E402
from seamguard.runtime.data import GlobalBatchSampler  # noqa: E402

KEEP = 2  # complete checkpoints kept on disk (the newest may still be in flight)


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every checkpoint whose save finished, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(d.name.split("_")[1]), d) for d in root.glob("step_*")
             if (d / ".metadata").exists()]
    return sorted(found)


class AsyncCheckpointer:
    """DCP async saves, one in flight at a time, with what each cost the training loop."""

    def __init__(self, root: Path, rank: int, log: Path) -> None:
        self.root, self.rank = root, rank
        self.pg = dist.new_group(backend="gloo")
        self.pending = None
        self.log = open(log, "a")

    def save(self, model, opt, step: int) -> None:
        t0 = time.perf_counter()
        self.wait()
        msd, osd = get_state_dict(model, opt)
        fut = dcp.async_save({"model": msd, "optim": osd, "step": step},
                             checkpoint_id=str(self.root / f"step_{step}"), process_group=self.pg)
        blocked = time.perf_counter() - t0
        done_at: list[float] = []
        fut.add_done_callback(lambda _: done_at.append(time.perf_counter()))
        self.pending = (fut, step, t0, blocked, done_at)

    def wait(self) -> None:
        if self.pending is None:
            return
        fut, step, t0, blocked, done_at = self.pending
        fut.result()
        end = done_at[0] if done_at else time.perf_counter()
        self.log.write(f"{step} {blocked:.6f} {end - t0:.6f}\n")
        self.log.flush()
        self.pending = None
        if self.rank == 0:
            for _, old in complete_checkpoints(self.root)[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--dataset", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt-every", type=int, default=10, help="0: no checkpoints")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torch 2.13 torchrun reuses the agent's store across restarts; with the default
    # prefix, re-formed gloo groups of 4 ranks read stale peer addresses from the
    # previous round and time out (seen here), so each round gets its own prefix
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round{restart}/", store),
                            rank=rank, world_size=world)
    x, y = make_data(args.dataset, args.dim, 10, args.seed)
    model = make_model(args.dim, args.hidden, args.layers, 0.0, args.seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = GlobalBatchSampler(args.dataset, args.global_batch, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.out / "ckpt"
    ckpt = AsyncCheckpointer(root, rank, args.out / f"ckpt_{rank}.log") if args.ckpt_every else None
    start = 0
    if ckpt is not None and (done := complete_checkpoints(root)):
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd, "step": 0}
        dcp.load(sd, checkpoint_id=str(done[-1][1]), process_group=ckpt.pg)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        start = sd["step"]
    injector = chaos.from_env_without_store()
    log = open(args.out / f"worker_{rank}.log", "a")
    for step in range(start, args.steps):
        injector.maybe_fire("step", rank, step)
        idx = torch.as_tensor(sampler.indices(step, rank, world))
        opt.zero_grad()
        F.cross_entropy(ddp(x[idx]), y[idx]).backward()
        opt.step()
        log.write(f"{step} {time.time():.6f} {rank} {world} {restart} {os.getpid()}\n")
        log.flush()
        if ckpt is not None and (step + 1) % args.ckpt_every == 0 and step + 1 < args.steps:
            ckpt.save(model, opt, step + 1)
    if ckpt is not None:
        ckpt.wait()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
