"""A data-parallel training process whose gradient allreduce runs over `RailGroup`.

Why this exists: tests, the rail-failover benchmark and `seamguard testbed demo` need a
real job (model, data, optimizer) whose final weights can be compared with a flap-free
run. It is started once per host inside that host's namespace (`seamguard.testbed.job`
does that) and writes one JSON line per committed step plus a final checksum.

Determinism: parameters come from rank 0 by broadcast, batches from (seed, rank, step),
the update is plain SGD on the averaged gradient, and the rail layer's chunking never
depends on rail health, so the final checksum is a function of the seed only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from seamguard.runtime.rails import RailGroup, RailSettings


def build_model(hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden // 2), torch.nn.ReLU(),
                               torch.nn.Linear(hidden // 2, 10))


def batch(seed: int, rank: int, step: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    return torch.randn(size, 256, generator=g), torch.randint(0, 10, (size,), generator=g)


def checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--store", required=True, help="host:port of the rendezvous store (management net)")
    ap.add_argument("--rails", required=True, help="comma-separated rail interfaces")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--settings", default="{}", help="JSON overrides of RailSettings fields")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    a.out.mkdir(parents=True, exist_ok=True)
    host, port = a.store.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), a.world, a.rank == 0, timeout=datetime.timedelta(seconds=60))
    settings = RailSettings(interfaces=tuple(a.rails.split(",")), **json.loads(a.settings))
    rails = RailGroup(store, a.rank, a.world, settings)
    model = build_model(a.hidden, a.seed if a.rank == 0 else a.seed + 1 + a.rank)  # only rank 0's survives
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    rails.broadcast_(flat, step=-1, src=0)
    torch.nn.utils.vector_to_parameters(flat, params)
    log = (a.out / f"steps.{a.rank}.jsonl").open("w", buffering=1)
    (a.out / f"ready.{a.rank}").write_text(str(time.time()))
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(a.steps):
        t0 = time.time()
        x, y = batch(a.seed, a.rank, step)
        model.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in params])
        rep = rails.allreduce_(grads, step)
        grads.div_(a.world)
        with torch.no_grad():
            off = 0
            for p in params:
                n = p.numel()
                p.sub_(a.lr * grads[off:off + n].view_as(p))
                off += n
        log.write(json.dumps({"step": step, "t_wall": time.time(), "step_s": time.time() - t0,
                              "comm_s": rep.elapsed_s, "attempts": rep.attempts, "rails": rep.rails_used,
                              "failed": rep.failed_rails, "bytes_per_rail": rep.bytes_per_rail,
                              "deadline_s": {r: round(x, 4) for r, x in rep.deadline_s.items()},
                              "chunk_s": {r: round(x, 4) for r, x in rep.chunk_s.items()},
                              "loss": float(loss.detach())}) + "\n")
    log.close()
    (a.out / f"rail_events.{a.rank}.json").write_text(json.dumps({"events": rails.events,
                                                                  "causes": rails.causes}))
    (a.out / f"final.{a.rank}.json").write_text(json.dumps({"checksum": checksum(model), "steps": a.steps}))
    rails.close()
    # Rank 0 hosts the store, so it leaves last: after every rank's last vote was read.
    store.set(f"done/{a.rank}", "1")
    if a.rank == 0:
        store.wait([f"done/{r}" for r in range(a.world)], datetime.timedelta(seconds=30))
    sys.stdout.flush()
    # Parked groups may hold gloo threads in an op that only its timeout ends; their
    # destructors would wait for that, so leave without running them.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
