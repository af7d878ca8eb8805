"""What a rail group is built from: gloo groups on one interface, store connections,
private chunk buffers, the carrier file and a bounded wait inside gloo.

Why this exists: runtime/rails.py is the failover protocol (which chunk runs where, when a
rail is given up, the ranks' votes); these are the transport pieces it stands on, each
usable and testable alone (tests/rails/test_build.py builds and probes a group,
test_vote_connection_and_buffers.py the connections and buffers). Only the public
torch.distributed gloo and store API.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def own_connection(store: dist.Store) -> dist.Store:
    """The store over a connection of its own, for a thread that may block in it.

    A TCPStore client serves one request at a time: while one thread waits in it for a key,
    every other thread's request on that client waits too. A store implemented in Python
    (etcd) cannot be cloned and is shared.
    """
    try:
        return store.clone()
    except (AttributeError, RuntimeError):
        return store


def vote_connection(store: dist.Store, timeout_s: float) -> tuple[dist.Store, bool]:
    """The connection the votes travel over, and whether its ``multi_get`` waits for the keys
    within ``timeout_s`` by itself.

    A TCPStore's ``multi_get`` waits for its keys with the connection's timeout, so a clone
    given the vote timeout needs no separate ``wait`` (one round trip less per vote). Any
    other store (a prefix over one, etcd's) keeps its own timeout: the caller waits first.
    """
    conn = own_connection(store)
    if isinstance(conn, dist.TCPStore) and conn is not store:
        conn.set_timeout(datetime.timedelta(seconds=timeout_s))
        return conn, True
    return store, False


def build_gloo_group(store: dist.Store, key_prefix: str, rank: int, world: int, interface: str,
                     timeout_s: float) -> dist.ProcessGroup:
    """A gloo group bound to one interface; `timeout_s` bounds its connect and its ops.

    Connecting blocks in the store until every peer has published its address, so the group
    gets its own connection (`own_connection`): rails built at once on a rank would otherwise
    wait on each other, and when a peer's threads started them in the other order, each rank
    would wait on the other until the timeout fails the rail (seen at start-up on a loaded host).
    """
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(interface=interface)]
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(dist.PrefixStore(key_prefix, own_connection(store)), rank, world, opts)


def probe_bandwidth(pg: dist.ProcessGroup, nbytes: int, rounds: int,
                    clock: Callable[[], float] = time.perf_counter) -> float:
    """Bytes/s of the fastest of `rounds` allreduces of `nbytes` on a freshly built group.

    The fastest, not one round or the mean: a loaded host only ever slows a round down (a
    rank scheduled late, a starved thread), which made single probes of healthy rails fall
    below the bar on the loaded 2-core testbed, while a collapsed link caps every round at
    its rate, so the best round is the link's.
    """
    x = torch.ones(nbytes // 4)
    best_s = math.inf
    for _ in range(rounds):
        t = clock()
        pg.allreduce([x]).wait()
        best_s = min(best_s, clock() - t)
    return nbytes / max(best_s, 1e-9)


# how long the training thread waits inside one chunk's op before it looks at the others,
# the deadlines and the watcher's flags again; completion ends the wait at once
_NAP_TD = datetime.timedelta(seconds=0.005)


def nap(work: dist.Work) -> None:
    """Wait up to _NAP_TD for ``work`` in gloo's own wait (C++, no interpreter lock held).
    An expired wait raises, and so does a failed op: the caller reads the op's state next."""
    try:
        work.wait(_NAP_TD)
    except RuntimeError:
        pass


class ChunkBuffers:
    """Private chunk buffers, reused between collectives while no op on them was abandoned.

    A chunk runs on a private copy because an abandoned op may still write into it; a buffer
    whose op finished (or never ran) is handed back and reused, so a steady step allocates
    nothing; a buffer of an abandoned or failed op is never handed back.
    """

    def __init__(self, keep: int) -> None:
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        self._keep = keep

    def copy_of(self, chunk: torch.Tensor) -> torch.Tensor:
        free = self._free.get((chunk.numel(), chunk.dtype))
        buf = free.pop() if free else torch.empty_like(chunk, memory_format=torch.contiguous_format)
        return buf.copy_(chunk)

    def give_back(self, bufs: list[torch.Tensor]) -> None:
        for b in bufs:
            free = self._free.setdefault((b.numel(), b.dtype), [])
            if len(free) < self._keep:
                free.append(b)


def read_carrier(iface: str) -> bool:
    try:
        with open(f"/sys/class/net/{iface}/carrier") as f:
            return f.read().strip() == "1"
    except OSError:  # admin-down interfaces refuse the read
        return False
