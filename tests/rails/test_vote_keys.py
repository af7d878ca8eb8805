"""Spent votes are deleted off the collective's path, and still deleted.

Every attempt of a collective writes one vote key per rank; after voting in round k a
rank deletes its own vote of round k-2 (every rank read it before voting in round k-1).
The delete is a store round trip that answers only after rank 0's store served it, so it
is queued and done by the watcher thread over its own connection instead of inside the
step; the two newest rounds stay. Two ranks as threads over
loopback (both rails on ``lo``), real gloo groups and a real TCPStore.
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist

from seamguard.runtime.rails import RailGroup, RailSettings
from tests.rails.two_ranks import run_two_ranks

STEPS = 8


def _rank(port: int, rank: int, out: dict) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    group = RailGroup(store, rank, 2, RailSettings(interfaces=("lo", "lo"), gloo_timeout_s=10.0,
                                                   op_deadline_max_s=5.0, start_timeout_s=30.0))
    try:
        sums = []
        for step in range(STEPS):
            x = torch.full((4096,), float(rank + 1))
            group.allreduce_(x, step)
            sums.append(float(x[0]))
        out[rank] = (sums, group._round)
        deadline = time.monotonic() + 10.0  # bounded: the watcher polls every poll_s
        while time.monotonic() < deadline and group._stale_votes:
            time.sleep(0.02)
        time.sleep(4 * group.s.poll_s)  # the last batch taken from the queue is being deleted
    finally:
        group.close()


@pytest.mark.timeout(90)
def test_spent_votes_are_deleted_by_the_watcher_and_sums_hold():
    server, out = run_two_ranks(_rank, join_s=60.0)
    assert set(out) == {0, 1}, out
    for rank in range(2):
        sums, rounds = out[rank]
        assert sums == [3.0] * STEPS
        assert rounds >= STEPS + 1  # the start-up agreement, then at least one vote per step
    spent = [f"rails/vote/{n}/{r}" for n in range(rounds - 2) for r in range(2)]
    kept = [f"rails/vote/{n}/{r}" for n in range(rounds - 2, rounds) for r in range(2)]
    assert not any(server.check([k]) for k in spent), "a spent vote was left in the store"
    assert all(server.check([k]) for k in kept), "a vote still to be read was deleted"
