"""Two ranks of a rail group as threads of the test, over one TCPStore on loopback."""

from __future__ import annotations

import datetime
import threading


def run_two_ranks(rank_fn, join_s: float) -> tuple:
    """Run ``rank_fn(store_port, rank, out)`` for ranks 0 and 1 on threads, each joined within
    ``join_s``; returns the store's server (to look into the store after) and ``out``, where
    each rank left its results."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    out: dict = {}
    threads = [threading.Thread(target=rank_fn, args=(server.port, r, out)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return server, out
