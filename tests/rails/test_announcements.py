"""A rank that gives a rail up tells its peers through numbered store keys that a follower
thread waits for inside the store: no polling while the job is healthy, no announcement lost
when two ranks announce at once, and the follower ends when the group is closed (it would
otherwise wait in the store for an hour).

Two ranks as threads over loopback (both rails on ``lo``, so no carrier ever drops: what a
rank learns, it learned from its peer), real gloo groups and a real TCPStore.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist

from seamguard.runtime.rails import RailGroup, RailSettings
from tests.rails.two_ranks import run_two_ranks


def _rank(port: int, rank: int, out: dict, both_announced: threading.Barrier) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    group = RailGroup(store, rank, 2, RailSettings(interfaces=("lo", "lo"), gloo_timeout_s=10.0,
                                                   op_deadline_max_s=5.0, start_timeout_s=30.0))
    try:
        x = torch.full((4096,), float(rank + 1))
        group.allreduce_(x, 0)  # the group is up and has been used
        if rank == 0:  # what no rank writes: read past, not fatal to the followers
            group._post_announcement("not an announcement", group.store)
        both_announced.wait(30)
        group._announce(rank, 0, group.store)  # rank r gives rail r up, both at once
        both_announced.wait(30)
        peer = 1 - rank
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and group._local_fail[peer] < 0:
            time.sleep(0.01)
        out[rank] = {"learned_peer_rail": group._local_fail[peer] >= 0,
                     "learned_s": round(10.0 - (deadline - time.monotonic()), 3),
                     "follower_alive": group._follower.is_alive()}
    finally:
        group.close()
        group._follower.join(5.0)
        out.setdefault("follower_alive_after_close", {})[rank] = group._follower.is_alive()


@pytest.mark.timeout(90)
def test_peers_learn_each_announcement_and_the_follower_ends_on_close():
    barrier = threading.Barrier(2)
    server, out = run_two_ranks(lambda port, rank, res: _rank(port, rank, res, barrier), join_s=60.0)
    assert {0, 1} <= set(out), out
    for rank in range(2):
        assert out[rank]["learned_peer_rail"], f"rank {rank} never learned its peer's announcement: {out}"
        assert out[rank]["follower_alive"], f"rank {rank}'s follower ended before close: {out}"
    # two announcements at once took two numbers after the unreadable one; both ranks' close
    # calls took the next two
    assert server.get("rails/announce/1").decode() == "not an announcement"
    texts = sorted(server.get(f"rails/announce/{n}").decode() for n in range(2, 6))
    assert texts == ["0 0 0", "1 0 1", "closed 0", "closed 1"], texts
    assert not server.check(["rails/announce/6"])
    assert out["follower_alive_after_close"] == {0: False, 1: False}, "a follower still waits in the store"
