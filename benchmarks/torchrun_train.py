"""Baseline (b): what most users run: torchrun elastic + DDP + torch.save every N steps.

Started by benchmarks/failover_training.py through `python -m torch.distributed.run
--max-restarts ...`. Any failure makes torchrun restart every worker, which reload the
newest checkpoint. Faults come from the same product helper (seamguard.runtime.chaos)
so the schedule matches the seamguard run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _model import make_data, make_model  # noqa: E402

from seamguard.runtime import chaos  # noqa: E402
from seamguard.runtime.data import GlobalBatchSampler  # noqa: E402


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
    ckpt = args.out / "ckpt.pt"
    start = 0
    if args.ckpt_every and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
    injector = chaos.from_env_without_store()
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / f"worker_{rank}.log", "a")
    for step in range(start, args.steps):
        injector.maybe_fire("step", rank, step)
        idx = torch.as_tensor(sampler.indices(step, rank, world))
        opt.zero_grad()
        F.cross_entropy(ddp(x[idx]), y[idx]).backward()
        opt.step()
        log.write(f"{step} {time.time():.6f} {rank} {world} {restart}\n")
        log.flush()
        if args.ckpt_every and (step + 1) % args.ckpt_every == 0 and rank == 0:
            tmp = ckpt.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                            "step": step + 1}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, ckpt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
