"""A plain torchrun + DCP training job that takes the seamguard controller's hints.

Nothing here is started by `seamguard launch`: torchrun starts the ranks, DDP averages the
gradients, torch.distributed.checkpoint saves. The lines marked ``# sg`` are what the job
adds (docs/runtime.md, "Jobs not started by seamguard launch"): a hook built once, each
step run inside ``hook.step``, and the job's own periodic saves made through the hook so
a directory move applies to them too. Run it with

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/torchrun_dcp/train.py \\
        --checkpoint-dir /ckpt/fast/job7 --hint-dir /run/seamguard/job7 --metrics-port 9400 --job job7

and point the controller's runtime actuator at the hint directory (``hint_dirs: {job7: ...}``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from seamguard.runtime.jobhook import HookSettings, JobHook, dcp_saver  # sg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--checkpoint-dir", type=Path, required=True)
    ap.add_argument("--hint-dir", type=Path)
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--job", default="job")
    ap.add_argument("--save-every", type=int, default=0, help="the job's own saves (0: only when asked)")
    ap.add_argument("--sync-every", type=int, default=10, help="steps between the ranks' agreements")
    ap.add_argument("--step-sleep-s", type=float, default=0.0, help="stand-in for a longer step's compute")
    ap.add_argument("--events-file", type=Path)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(dist.get_rank())
    step_t = torch.zeros((), dtype=torch.int64)   # saved with the weights: the step a checkpoint holds

    settings = HookSettings.from_env(job=args.job, checkpoint_dir=args.checkpoint_dir.absolute(),  # sg
                                     hint_dir=args.hint_dir, metrics_port=args.metrics_port,  # sg
                                     sync_every_steps=args.sync_every, events_file=args.events_file)  # sg
    hook = JobHook(settings, save=dcp_saver(lambda: {"model": model.state_dict(), "optim": opt.state_dict(),  # sg
                                                     "step": step_t}))  # sg
    for step in range(1, args.steps + 1):
        with hook.step(step):  # sg
            x = torch.randn(16, 32, generator=gen)
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            step_t.fill_(step)
            time.sleep(args.step_sleep_s)
        # sg: degraded halves the job's own save interval (a job without one leaves it to the hook's interval)
        every = max(args.save_every // 2, 1) if hook.degraded and args.save_every else args.save_every
        if every and step % every == 0 and not hook.controls.save:  # sg (the hook saved this step already)
            hook.save(step)  # sg
    hook.close()  # sg
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
