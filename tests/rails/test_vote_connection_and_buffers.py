"""The vote's own store connection and the reused private chunk buffers (runtime/rails.py).

A TCPStore's ``multi_get`` waits for its keys with the connection's timeout, so the votes
travel over a clone given the vote timeout and need no separate ``wait``; any other store
keeps the explicit wait. A chunk's private buffer is handed back only once its op finished,
so a buffer an abandoned op may still write into is never reused.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from seamguard.runtime.rails import _Buffers, vote_connection


@pytest.fixture
def tcp_store():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False)
    yield store


@pytest.mark.timeout(30)
def test_tcpstore_votes_use_a_clone_whose_multi_get_waits_with_the_vote_timeout(tcp_store):
    conn, get_waits = vote_connection(tcp_store, timeout_s=0.3)
    assert get_waits and conn is not tcp_store
    tcp_store.set("v/0", "a")
    assert conn.multi_get(["v/0"]) == [b"a"]
    # a vote that never comes ends the read with the vote timeout, not the store's 30 s
    with pytest.raises(RuntimeError, match="timeout"):
        conn.multi_get(["v/0", "v/1"])
    # the job's own connection keeps its timeout
    assert tcp_store.timeout == datetime.timedelta(seconds=30)


def test_a_store_that_is_not_a_tcpstore_keeps_the_explicit_wait(tcp_store):
    prefixed = dist.PrefixStore("job/", tcp_store)
    conn, get_waits = vote_connection(prefixed, timeout_s=0.3)
    assert conn is prefixed and not get_waits


def test_buffers_are_private_copies_and_reused_only_when_handed_back():
    bufs = _Buffers(keep=2)
    chunk = torch.arange(8, dtype=torch.float32)
    first = bufs.copy_of(chunk)
    assert torch.equal(first, chunk) and first.data_ptr() != chunk.data_ptr()
    # not handed back (its op was abandoned): the next copy gets fresh memory
    second = bufs.copy_of(chunk * 2)
    assert second.data_ptr() != first.data_ptr() and torch.equal(first, chunk)
    bufs.give_back([second])
    third = bufs.copy_of(chunk * 3)
    assert third.data_ptr() == second.data_ptr() and torch.equal(third, chunk * 3)
    # a buffer of another size or dtype is not taken for this one
    bufs.give_back([third])
    other = bufs.copy_of(torch.zeros(4, dtype=torch.float32))
    assert other.data_ptr() != third.data_ptr() and other.numel() == 4


def test_buffers_keep_at_most_their_bound():
    bufs = _Buffers(keep=1)
    a, b = torch.zeros(4), torch.zeros(4)
    bufs.give_back([a, b])
    got = [bufs.copy_of(torch.ones(4)).data_ptr() for _ in range(2)]
    assert got.count(a.data_ptr()) + got.count(b.data_ptr()) == 1
