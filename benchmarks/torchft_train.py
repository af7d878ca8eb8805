"""Baseline (c): torchft 0.2.0 (PyPI): one replica group per process, Lighthouse quorum.

Started by benchmarks/failover_training.py, which starts the Lighthouse (torchft's
`torchft_lighthouse`) and restarts a killed replica (as a scheduler would); survivors
skip the failed step and go on without it, and the restarted replica heals from a live
peer. Gradients are averaged by one `Manager.allreduce` per step (see
`average_gradients`), the optimizer is torchft's `Optimizer` (quorum at `zero_grad`,
`should_commit` before the step). The data
position is ours to keep (torchft leaves it to the user): replica i reads shard i of the
step's global batch, so a step taken without a replica drops that replica's samples.
"""

from __future__ import annotations

import argparse
import datetime
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
    from torchft import Manager, Optimizer
    from torchft.process_group import ProcessGroupGloo

    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--dataset", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x, y = make_data(args.dataset, args.dim, 10, args.seed)
    model = make_model(args.dim, args.hidden, args.layers, 0.0, args.seed)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    timeout = datetime.timedelta(seconds=30)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=args.replicas - 1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica_{args.replica}", store_addr="127.0.0.1",
                      store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, timeout=timeout, quorum_timeout=timeout)
    opt = Optimizer(manager, inner)
    params = list(model.parameters())
    sampler = GlobalBatchSampler(args.dataset, args.global_batch, seed=args.seed)
    injector = chaos.from_env_without_store()
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / f"worker_{args.replica}.log", "a")
    while manager.current_step() < args.steps:
        step = manager.current_step()
        injector.maybe_fire("step", args.replica, step)
        idx = torch.as_tensor(sampler.indices(step, args.replica, args.replicas))
        opt.zero_grad()   # starts the step's quorum
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        average_gradients(manager, params)
        opt.step()        # applied only if every participant's step went through (should_commit)
        if manager.current_step() > step:
            log.write(f"{step} {time.time():.6f} {args.replica} {manager.num_participants()} 0 "
                      f"{os.getpid()}\n")
            log.flush()
    manager.shutdown(wait=False)


def average_gradients(manager, params: list) -> None:
    """One all-reduce of every gradient, flattened (what DDP does with one bucket), through
    ``Manager.allreduce``: after a failure it returns a no-op and the step is not committed.
    torchft 0.2.0's DistributedDataParallel comm hook instead asserts (``assert fut._fut``)
    when the manager has already errored in the step; in this benchmark that crashed the
    survivors of a kill landing mid-step, so the baseline does not use it."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    manager.allreduce(flat).wait()
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


if __name__ == "__main__":
    main()
