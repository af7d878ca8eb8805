"""A collective that returned before its vote still serves a peer that missed a chunk.

`RailGroup.allreduce_` returns as soon as every chunk finished on this rank and settles the
vote on a helper thread. Here rank 1 counts one chunk of one step as lost (as when its link
dropped after its peer had the sum): rank 0 has already returned, so its settle must re-run
that chunk with rank 1 from the kept copy of its input, both ranks must end with the same
sums as a clean run, the lost chunk's rail must be given up, and rank 0's next report must
count the extra attempt. Two ranks as threads over loopback, real gloo and a real TCPStore.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from seamguard.runtime.rails import RailGroup, RailSettings
from tests.rails.two_ranks import run_two_ranks

STEPS, LOST_STEP = 6, 3


def _lose_chunk_once(group: RailGroup, step_of: dict) -> None:
    """Rank 1's attempts at LOST_STEP report chunk 0 as not finished (its buffer abandoned)."""
    run = group._run_chunks

    def run_chunks(kind, chunks, todo, usable, src):
        res = run(kind, chunks, todo, usable, src)
        if step_of["step"] == LOST_STEP and not step_of.get("lost") and 0 in todo:
            step_of["lost"] = True
            res.ok[0] = False
            res.failed.add(usable[0])
            res.settled.discard(0)
        return res

    group._run_chunks = run_chunks


def _rank(port: int, rank: int, out: dict) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    group = RailGroup(store, rank, 2, RailSettings(interfaces=("lo", "lo"), gloo_timeout_s=10.0,
                                                   op_deadline_max_s=5.0, start_timeout_s=30.0))
    step_of: dict = {}
    if rank == 1:
        _lose_chunk_once(group, step_of)
    try:
        sums, reports = [], []
        for step in range(STEPS):
            step_of["step"] = step
            x = torch.arange(4096, dtype=torch.float32) * (rank + 1) + step
            reports.append(group.allreduce_(x, step))
            sums.append(x.clone())
        out[rank] = (sums, reports, list(group.events))
    finally:
        group.close()


@pytest.mark.timeout(120)
def test_a_peer_that_missed_a_chunk_gets_it_from_an_early_returned_rank():
    _, out = run_two_ranks(_rank, join_s=90.0)
    assert set(out) == {0, 1}, out
    for step in range(STEPS):
        want = torch.arange(4096, dtype=torch.float32) * 3 + 2 * step
        assert torch.equal(out[0][0][step], want) and torch.equal(out[1][0][step], want), step
    reports0, reports1 = out[0][1], out[1][1]
    # rank 1 waited for the re-run inside its step; rank 0 had returned and learns it a step later
    assert reports1[LOST_STEP].attempts == 2 and reports1[LOST_STEP].failed_rails == [0]
    assert reports0[LOST_STEP].attempts == 1
    assert reports0[LOST_STEP + 1].attempts >= 2 and 0 in reports0[LOST_STEP + 1].failed_rails
    assert all(r.attempts == 1 for r in reports0[:LOST_STEP] + reports1[:LOST_STEP])
    for rank in range(2):
        assert any(e["event"] == "out" and e["rail"] == 0 and e["step"] == LOST_STEP for e in out[rank][2])
