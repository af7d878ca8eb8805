"""ResilientGroup issues a reduce-scatter as an all-reduce of a copy plus this rank's chunk
copied out (runtime/fsdp.py): the result must be bit-identical to gloo's own
reduce-scatter, for each reduce op and both call forms, with the input left as it was."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seamguard.runtime.fsdp import _reduce_scatter_as_allreduce

WORLD = 3


def _run(rank: int, path: str, failures) -> None:
    store = dist.FileStore(path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    pg = dist.distributed_c10d._get_default_group()
    torch.manual_seed(rank)
    try:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            x = torch.randn(WORLD * 5, 7)
            before = x.clone()
            want = torch.empty(5, 7)
            dist.reduce_scatter_tensor(want, x, op=op)
            got = torch.empty(7, 5).t()          # a non-contiguous output
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = op
            work, finish = _reduce_scatter_as_allreduce(pg, rank, got, x, opts)
            assert work.wait(datetime.timedelta(seconds=30))
            finish()
            if not torch.equal(got, want):
                failures.put(f"rank {rank} {op}: differs from gloo's reduce-scatter")
            listed = torch.empty(5, 7)           # the list form: [output], [[each rank's chunk]]
            work, finish = _reduce_scatter_as_allreduce(pg, rank, [listed], [list(x.chunk(WORLD))], opts)
            assert work.wait(datetime.timedelta(seconds=30))
            finish()
            if not torch.equal(listed, want):
                failures.put(f"rank {rank} {op}: the list form differs from gloo's reduce-scatter")
            if not torch.equal(x, before):
                failures.put(f"rank {rank} {op}: the input was modified")
    finally:
        dist.destroy_process_group()


def test_reduce_scatter_as_allreduce_matches_gloo_bit_for_bit(tmp_path):
    ctx = mp.get_context("spawn")
    failures = ctx.Queue()
    mp.start_processes(_run, args=(str(tmp_path / "store"), failures), nprocs=WORLD, start_method="spawn")
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert not found, found
