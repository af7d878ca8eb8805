"""The node launchers' links to the coordinator (runtime/nodelink.py): a link that closes
without a goodbye is reported once, with its node; an orderly goodbye, another job's
launcher and a coordinator not listening yet are not losses."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from seamguard.runtime.liveness import link_key
from seamguard.runtime.nodelink import LinkClient, LinkServer

from .conftest import REPO

KEY = link_key(b"n" * 32)


def _poll_until(server: LinkServer, timeout_s: float = 5.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = server.poll()
        if got:
            return got
        time.sleep(0.01)
    return []


def _connected(run_id: str, node: int, server: LinkServer) -> LinkClient:
    client = LinkClient(run_id, node, KEY)
    client.ensure(server.address("127.0.0.1"), time.monotonic())
    assert client.connected
    return client


def test_a_link_closed_without_bye_is_that_nodes_loss_reported_once():
    server = LinkServer("job", KEY)
    try:
        a, b = _connected("job", 1, server), _connected("job", 2, server)
        time.sleep(0.05)
        assert server.poll() == []          # hellos read, nothing lost
        b.close(orderly=False)
        # the launcher sleeps on the server's one descriptor: a close wakes it
        assert select.select([server], [], [], 5.0)[0] == [server]
        lost = _poll_until(server)
        assert [n for n, _ in lost] == [2] and lost[0][1]
        time.sleep(0.05)
        assert server.poll() == []          # reported once; node 1 still linked
        a.close(orderly=True)               # a goodbye first: the node ended as planned
        time.sleep(0.1)
        assert server.poll() == []
    finally:
        server.close()


def test_another_jobs_launcher_is_not_a_node_of_this_job():
    server = LinkServer("job", KEY)
    try:
        stranger = _connected("other-job", 1, server)
        time.sleep(0.05)
        server.poll()
        stranger.close(orderly=False)
        time.sleep(0.1)
        assert server.poll() == []
    finally:
        server.close()


def test_no_coordinator_listening_yet_is_retried_later_without_blocking():
    server = LinkServer("job", KEY)
    address = server.address("127.0.0.1")
    server.close()                          # nobody listens on this port now
    client = LinkClient("job", 1, KEY)
    t0 = time.monotonic()
    client.ensure(address, t0)
    assert not client.connected
    client.ensure("", t0 + 5)               # no address published yet: nothing tried
    assert not client.connected
    client.ensure("not-an-address", t0 + 10)
    assert not client.connected


def test_a_sigkilled_node_launcher_is_seen_at_once():
    """The case the link is for: every process of a node killed, its kernel alive."""
    server = LinkServer("job", KEY)
    code = ("import sys, time\nfrom seamguard.runtime.nodelink import LinkClient\n"
            "c = LinkClient('job', 3, bytes.fromhex(sys.argv[2]))\nc.ensure(sys.argv[1], time.monotonic())\n"
            "print(c.connected, flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, server.address("127.0.0.1"), KEY.hex()], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    try:
        assert proc.stdout.readline().strip() == "True"
        _poll_until(server, 0.2)            # take its hello
        os.kill(proc.pid, signal.SIGKILL)
        assert [n for n, _ in _poll_until(server)] == [3]   # its kernel closed the link
    finally:
        proc.kill()
        proc.wait(10)
        server.close()


def test_open_links_counts_the_nodes_that_have_not_read_the_end_yet():
    """Node 0 keeps the job's store up while open_links() > 0 (bounded): a node says bye once
    it has read the job's end and drained, or its link closes."""
    server = LinkServer("job", KEY)
    try:
        a, b = _connected("job", 1, server), _connected("job", 2, server)
        deadline = time.monotonic() + 5
        while server.open_links() < 2 and time.monotonic() < deadline:
            server.poll()
            time.sleep(0.01)
        assert server.open_links() == 2
        a.close(orderly=True)
        b.close(orderly=False)
        deadline = time.monotonic() + 5
        while server.open_links() and time.monotonic() < deadline:
            server.poll()
            time.sleep(0.01)
        assert server.open_links() == 0
    finally:
        server.close()
