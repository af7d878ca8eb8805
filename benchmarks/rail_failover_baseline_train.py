"""Baseline worker for benchmarks/rail_failover.py: plain DDP over gloo under torchrun.

What a user runs without seamguard: one process group on the interface GLOO_SOCKET_IFNAME
names (rail0, or a bond's bond0), `DistributedDataParallel`, torch's default collective
timeout unless --timeout-s bounds it, a checkpoint every --ckpt-every steps; a failed
collective raises, the process exits non-zero, and torchrun's elastic agent restarts the
whole worker group, which resumes from the last checkpoint. Same model, data and update
as seamguard/testbed/rails_job.py.
"""

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from seamguard.testbed.rails_job import batch, build_model  # the same job as seamguard's side

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--out", type=Path, required=True)
ap.add_argument("--timeout-s", type=float, default=None, help="default: torch's (30 min)")
ap.add_argument("--ckpt-every", type=int, default=20)
a = ap.parse_args()
torch.set_num_threads(1)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
timeout = None if a.timeout_s is None else datetime.timedelta(seconds=a.timeout_s)
dist.init_process_group("gloo", timeout=timeout)
model = build_model(1024, 0)
ckpt = a.out / "ckpt.pt"
start = 0
if ckpt.exists():
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    start = state["step"]
ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters, averages gradients
params = list(model.parameters())
log = (a.out / f"steps.{rank}.jsonl").open("a", buffering=1)
log.write(json.dumps({"event": "start", "restart": restart, "step": start, "t_wall": time.time()}) + "\n")
loss_fn = torch.nn.CrossEntropyLoss()
for step in range(start, a.steps):
    x, y = batch(0, rank, step)
    model.zero_grad(set_to_none=False)
    loss_fn(ddp(x), y).backward()
    with torch.no_grad():
        for p in params:
            p.sub_(0.01 * p.grad)
    log.write(json.dumps({"step": step, "t_wall": time.time(), "restart": restart}) + "\n")
    if rank == 0 and (step + 1) % a.ckpt_every == 0:
        tmp = a.out / "ckpt.tmp"
        torch.save({"model": model.state_dict(), "step": step + 1}, tmp)
        os.replace(tmp, ckpt)
log.close()
# Every rank is past its last collective once the barrier returns; leave without running
# the process group's destructors, which at interpreter exit sometimes abort ("terminate
# called without an active exception": torchrun then restarts a finished job). The
# seamguard job leaves the same way.
dist.barrier()
os._exit(0)
