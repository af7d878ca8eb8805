"""A plain data-parallel training loop adopting seamguard.runtime (lines marked `# sg`).

Run:  python -m seamguard launch --nproc 4 --spares 1 -- examples/train_ddp.py --steps 200

Deterministic: the synthetic dataset, the model init and the sample order depend only on
--seed, so a run with injected failures ends with bit-identical weights to a clean run.
Writes, under --out, the final weights' checksum (rank 0) and one line per committed step
per worker (step, wall time), which the tests and the failover benchmark read.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import seamguard.runtime as sgr  # sg


def make_data(n: int, dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, classes, generator=g)
    return x, (x @ w).argmax(dim=1)


def gpu_clock_fraction(path: Path | None) -> float:
    """The emulated GPU's clock fraction: 1.0 without a file or with one that does not read as (0, 1]."""
    if path is None:
        return 1.0
    try:
        frac = float(path.read_text())
    except (OSError, ValueError):
        return 1.0
    return frac if 0.0 < frac <= 1.0 else 1.0


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
    ap.add_argument("--step-sleep-s", type=float, default=0.0,
                    help="emulated GPU time per step (a sleep), at full clock")
    ap.add_argument("--gpu-clock-file", default=None,
                    help="a file holding the emulated GPU's clock fraction (0-1], read every step; "
                         "{node} is replaced by $SEAMGUARD_NODE_NAME. The step's emulated GPU time is "
                         "--step-sleep-s / fraction (the seam drill's thermal slowdown)")
    ap.add_argument("--batchnorm", action="store_true",
                    help="add a BatchNorm layer (rank-private running statistics)")
    ap.add_argument("--out", type=Path, default=Path("runs/train_ddp"))
    args = ap.parse_args()
    clock_file = Path(args.gpu_clock_file.replace("{node}", os.environ.get("SEAMGUARD_NODE_NAME", ""))) \
        if args.gpu_clock_file else None
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # not its NaN fill of every torch.empty: a debugging aid, not needed for determinism
    # (collective buffers are written before they are read); 6 % of a rank's CPU here
    torch.utils.deterministic.fill_uninitialized_memory = False

    x, y = make_data(args.dataset, args.dim, 10, args.seed)
    torch.manual_seed(args.seed)
    blocks = [torch.nn.Linear(args.dim, args.hidden), torch.nn.ReLU(), torch.nn.Dropout(args.dropout)]
    if args.batchnorm:
        blocks.append(torch.nn.BatchNorm1d(args.hidden))
    for _ in range(args.layers - 1):
        blocks += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(args.hidden, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    rt = sgr.init()  # sg
    sampler = sgr.GlobalBatchSampler(args.dataset, args.global_batch, seed=args.seed)  # sg
    rt.register(model, opt, sampler)  # sg
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / f"worker_{rt.wid}.log", "a")
    for step, idx in rt.steps(args.steps):  # sg (was: for step, (xb, yb) in enumerate(loader))
        xb, yb = x[torch.as_tensor(idx)], y[torch.as_tensor(idx)]
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s / gpu_clock_fraction(clock_file))
        if rt.sync_gradients():  # sg (was: DDP's implicit all-reduce)
            opt.step()
            log.write(f"{step} {time.time():.6f} {rt.rank} {rt.world_size} {rt.gen}\n")
            log.flush()
    if rt.rank == 0 and rt.step >= args.steps:
        from seamguard.runtime.snapshot import state_checksum

        (args.out / "final_checksum.txt").write_text(state_checksum(model))
        torch.save(model.state_dict(), args.out / "final_model.pt")
    rt.finish()  # sg
    os._exit(0)


if __name__ == "__main__":
    main()
