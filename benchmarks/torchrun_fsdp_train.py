"""Baseline for `failover_training.py --fsdp`: torchrun elastic + FSDP2 with DCP async checkpoints.

The sharded counterpart of benchmarks/torchrun_train.py, as a careful user runs it: the
same model sharded with `fully_shard` over all ranks (gloo), `async_save` of the sharded
state every --ckpt-every steps on a gloo group of its own (torchrun_train.AsyncCheckpointer),
and after any failure torchrun restarts every worker, which load the newest complete
checkpoint with DCP `load`. --ckpt-every 0 is the reference: plain FSDP2, no checkpoints.
--replicate R: HSDP on the 2-D mesh ("replicate", "shard") of shape (R, world/R), each row
of consecutive ranks (torchrun numbers one agent's ranks consecutively: a row per host
when R is the node count) sharding the model, the R rows replicating it. An elastic
restart on fewer ranks keeps R rows while the world divides into them (2 ranks left of
(2, 2): (2, 1)); DCP reshards the checkpoint to the new layout.
Writes `step time rank world restart` per committed step to worker_<rank>.log.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _model import make_data, make_model  # noqa: E402
from torchrun_train import AsyncCheckpointer, complete_checkpoints  # noqa: E402

from seamguard.runtime import chaos  # noqa: E402
from seamguard.runtime.data import GlobalBatchSampler  # noqa: E402


def build_mesh(world: int, replicate: int) -> DeviceMesh:
    """FSDP2's mesh: 1-D over the world, or HSDP's (replicate, world / replicate)."""
    if replicate == 1:
        return init_device_mesh("cpu", (world,))
    return init_device_mesh("cpu", hsdp_shape(world, replicate), mesh_dim_names=("replicate", "shard"))


def hsdp_shape(world: int, replicate: int) -> tuple[int, int]:
    if replicate < 1 or world % replicate:
        raise ValueError(f"--replicate {replicate}: the world size {world} is not a multiple of it")
    return replicate, world // replicate


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
    ap.add_argument("--replicate", type=int, default=1,
                    help="HSDP: replica groups (mesh (R, world/R)); 1 = plain FSDP2")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False":
        # several hosts (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): every rendezvous round has
        # a fresh MASTER_PORT that rank 0 serves; restart counts differ between agents
        # (a membership restart does not count), so they cannot name the round
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0)
    else:
        # each restart round gets its own store prefix (see torchrun_train.py)
        store = dist.PrefixStore(f"round{restart}/", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    mesh = build_mesh(world, args.replicate)
    x, y = make_data(args.dataset, args.dim, 10, args.seed)
    model = make_model(args.dim, args.hidden, args.layers, 0.0, args.seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
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
    log = open(args.out / f"worker_{rank}.log", "a")  # noqa: SIM115 - open for the whole run
    for step in range(start, args.steps):
        injector.maybe_fire("step", rank, step)
        idx = torch.as_tensor(sampler.indices(step, rank, world))
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        log.write(f"{step} {time.time():.6f} {rank} {world} {restart}\n")
        log.flush()
        if ckpt is not None and (step + 1) % args.ckpt_every == 0 and step + 1 < args.steps:
            ckpt.save(model, opt, step + 1)
    if ckpt is not None:
        ckpt.wait()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
