"""Baseline for `failover_training.py --fsdp --hosts 2`: torchft 0.2.0 HSDP, one replica group per host.

As torchft 0.2.0 wires FSDP2 (its fsdp_test.py; torchtitan's integration does the same):
each replica group is an ordinary torchrun job on one host whose ranks shard the model
with `fully_shard` over the group's own mesh; the gradient shards are then averaged
across replica groups by the torchft Manager through FSDP2's all-reduce hook
(`FSDPModule.set_all_reduce_hook` -> `Manager.allreduce`), so a replica group that dies
leaves the others' collectives intact. (0.2.0 no longer ships `ft_init_device_mesh` /
`ManagedDeviceMesh`; torchft/device_mesh.py was dropped from the wheel.) A restarted group
heals its shards from the live group's rank of the same group rank over torchft's HTTP
checkpoint transport. The data position is ours to keep (torchft leaves it to the user):
rank r of group g reads piece g*R+r of the step's global batch, so a step taken without a
group drops that group's samples.

Run per host under torchrun (RANK/WORLD_SIZE/MASTER_* of the group) with --group, --groups
and --lighthouse. Writes `step time rank world restart` per committed step to
worker_<g*R+r>.log and, at the end, the checksum of its shard to final_shard_<g*R+r>.txt.
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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _model import make_data, make_model

from seamguard.runtime import chaos
from seamguard.runtime.data import GlobalBatchSampler


def main() -> None:
    from torchft import Manager, Optimizer
    from torchft.process_group import ProcessGroupGloo

    ap = argparse.ArgumentParser()
    ap.add_argument("--group", type=int, required=True, help="this host's replica group")
    ap.add_argument("--groups", type=int, default=2)
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
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gid = args.group * size + rank
    # run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: every torchrun restart gets a fresh
    # MASTER_PORT served by rank 0. On the agent's shared store the Manager's
    # `manager_addr` key outlives a restart, and a restarted rank 1 dialled the dead
    # ManagerServer of the previous attempt for 60 s (seen here)
    assert os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False", "set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    mesh = init_device_mesh("cpu", (size,))
    x, y = make_data(args.dataset, args.dim, 10, args.seed)
    model = make_model(args.dim, args.hidden, args.layers, 0.0, args.seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    timeout = datetime.timedelta(seconds=30)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"group_{args.group}", store_addr=os.environ["MASTER_ADDR"],
                      store_port=int(os.environ["MASTER_PORT"]), rank=rank, world_size=size,
                      hostname=os.environ.get("SEAMGUARD_ADVERTISE_HOST", "127.0.0.1"),
                      lighthouse_addr=args.lighthouse, timeout=timeout, quorum_timeout=timeout)

    def across_groups(grad_shard: torch.Tensor) -> None:
        manager.allreduce(grad_shard).wait()

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_all_reduce_hook(across_groups)
    opt = Optimizer(manager, inner)
    sampler = GlobalBatchSampler(args.dataset, args.global_batch, seed=args.seed)
    injector = chaos.from_env_without_store()
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / f"worker_{gid}.log", "a")  # noqa: SIM115 - open for the whole run
    pieces = args.groups * size
    seen = -1
    while manager.current_step() < args.steps:
        step = manager.current_step()
        # a group that heals jumps to the live group's step: fire the kills of the steps
        # it skipped, so a kill drawn at step s lands on the first step >= s it runs
        for s in range(seen + 1, step + 1):
            injector.maybe_fire("step", gid, s)
        seen = step
        idx = torch.as_tensor(sampler.indices(step, gid, pieces))
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        if manager.current_step() > step:
            log.write(f"{step} {time.time():.6f} {gid} {manager.num_participants()} {restart}\n")
            log.flush()
    from seamguard.runtime.snapshot import state_checksum

    (args.out / f"final_shard_{gid}.txt").write_text(state_checksum(model))
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
