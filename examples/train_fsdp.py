"""An FSDP2 training loop adopting seamguard.runtime (lines marked `# sg`).

Run:  python -m seamguard launch --nproc 4 --spares 1 -- examples/train_fsdp.py --steps 200

The model is sharded with `fully_shard` over the runtime's mesh: each rank holds its shard
of the parameters and of the AdamW state. Deterministic: the synthetic dataset, the model
init and the sample order depend only on --seed, so a run with injected failures ends with
bit-identical shards to a clean run. Writes, under --out, each rank's checksum of its
final shard (`final_shard_<rank>.txt`) and one line per committed step per worker (step,
wall time), which the tests and the failover benchmark read; with --full-out, rank 0 also
saves the full (unsharded) weights.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

import seamguard.runtime as sgr  # sg


def make_data(n: int, dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, classes, generator=g)
    return x, (x @ w).argmax(dim=1)


def build_model(dim: int, hidden: int, layers: int, dropout: float, seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)   # every rank initialises the same full model, then shards it
    blocks = [torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout)]
    for _ in range(layers - 1):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, 10))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--dataset", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--replicate", type=int, default=1,
                    help="HSDP: replica groups (mesh (R, world/R)); 1 = plain FSDP2")
    ap.add_argument("--step-sleep-s", type=float, default=0.0)
    ap.add_argument("--full-out", action="store_true", help="rank 0 saves the full final weights")
    ap.add_argument("--out", type=Path, default=Path("runs/train_fsdp"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # not its NaN fill of every torch.empty: a debugging aid, not needed for determinism
    # (collective buffers are written before they are read); 6 % of a rank's CPU here
    torch.utils.deterministic.fill_uninitialized_memory = False

    x, y = make_data(args.dataset, args.dim, 10, args.seed)
    rt = sgr.init()  # sg
    # built before the mesh: a hot spare builds it while it waits for a rank, not after
    model = build_model(args.dim, args.hidden, args.layers, args.dropout, args.seed)
    mesh = rt.device_mesh(replicate=args.replicate)  # sg (was: init_device_mesh("cpu", shape):
    # shape (world_size,), or HSDP's (R, world_size // R) with mesh_dim_names ("replicate", "shard"))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(args.seed + 1 + dist.get_rank())   # per-rank dropout stream
    sampler = sgr.GlobalBatchSampler(args.dataset, args.global_batch, seed=args.seed)  # sg
    rt.register(model, opt, sampler)  # sg
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / f"worker_{rt.wid}.log", "a")
    for step, idx in rt.steps(args.steps):  # sg (was: for step, (xb, yb) in enumerate(loader))
        xb, yb = x[torch.as_tensor(idx)], y[torch.as_tensor(idx)]
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
        if rt.sync_gradients():  # sg (FSDP2 reduce-scattered; False: the step is cancelled)
            opt.step()
            log.write(f"{step} {time.time():.6f} {rt.rank} {rt.world_size} {rt.gen}\n")
            log.flush()
    if rt.step >= args.steps:
        from seamguard.runtime.snapshot import state_checksum

        (args.out / f"final_shard_{rt.rank}.txt").write_text(state_checksum(model))
        if args.full_out:
            full = {k: v.full_tensor() for k, v in model.state_dict().items()}
            if rt.rank == 0:
                torch.save(full, args.out / "final_model.pt")
    rt.finish()  # sg
    os._exit(0)


if __name__ == "__main__":
    main()
