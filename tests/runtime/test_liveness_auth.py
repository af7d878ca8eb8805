"""The liveness link is authenticated: only a holder of the job's key vouches for a node.

A host that can reach the coordinator's port must not keep a dead node alive (forged or
replayed beats) nor get a live node declared lost (a forged link that it then closes).
Every line is HMAC-signed with the key derived from the job's hint key, addressed to one
hub, numbered, and timed (runtime/liveness.py); the hub refuses the rest, counts them by
reason and keeps running. No torch, no etcd.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from seamguard.runtime.liveness import (
    MAX_LINE_BYTES,
    MAX_SKEW_S,
    BeatRefused,
    LinkGate,
    LivenessHub,
    NodeReport,
    NodeReporter,
    PendingLinks,
    decode_report,
    encode_report,
    link_key,
    parse_hub_address,
    seal,
)

pytestmark = pytest.mark.timeout(60)
KEY = link_key(b"j" * 32)
RUN = "job-7"


def test_the_link_key_is_derived_one_way_and_differs_per_job():
    assert KEY != b"j" * 32 and len(KEY) == 32
    assert link_key(b"k" * 32) != KEY


@pytest.mark.parametrize("line, reason", [
    (encode_report(link_key(b"x" * 32), RUN, "h1", 2, 1, {16: (1, 1)}), "forged"),   # another key
    (encode_report(KEY, "job-8", "h1", 2, 1, {16: (1, 1)}), "forged"),               # another run
    (encode_report(KEY, RUN, "h0", 2, 1, {16: (1, 1)}), "misdirected"),              # an earlier hub
    (encode_report(KEY, RUN, "h1", 2, 1, {16: (1, 1)}).replace(b'"16"', b'"17"'), "forged"),  # body changed
    (b'{"run":"job-7","node":2,"seq":1,"beats":{}}\n', "malformed"),              # the old wire
    (b"sg-live-v1 h1 2 1 1 " + b"0" * 64 + b" " + b"x" * MAX_LINE_BYTES + b"\n", "oversize"),
])
def test_the_gate_refuses_what_the_key_does_not_vouch_for(line, reason):
    gate = LinkGate(KEY, RUN, "h1")
    with pytest.raises(BeatRefused, match=reason):
        gate.admit(line)
    assert gate.refusals()[reason] == 1


def test_replayed_and_stale_lines_are_refused_and_counted():
    now_ns = [time.time_ns()]
    gate = LinkGate(KEY, RUN, "h1", wall_ns=lambda: now_ns[0])
    first = encode_report(KEY, RUN, "h1", 2, 5, {16: (1, 1)}, t_ns=now_ns[0])
    assert gate.admit(first).seq == 5
    with pytest.raises(BeatRefused, match="replayed"):
        gate.admit(first)
    with pytest.raises(BeatRefused, match="replayed"):   # an older line, never seen, is a replay too
        gate.admit(encode_report(KEY, RUN, "h1", 2, 4, {16: (1, 1)}, t_ns=now_ns[0]))
    old = encode_report(KEY, RUN, "h1", 2, 6, {16: (1, 1)}, t_ns=now_ns[0] - int((MAX_SKEW_S + 1) * 1e9))
    with pytest.raises(BeatRefused, match="stale"):
        gate.admit(old)
    assert gate.admit(encode_report(KEY, RUN, "h1", 2, 7, {16: (2, 2)}, t_ns=now_ns[0])).seq == 7
    assert gate.admit(encode_report(KEY, RUN, "h1", 3, 1, {24: (1, 1)}, t_ns=now_ns[0])).seq == 1   # per node
    assert {r: n for r, n in gate.refusals().items() if n} == {"replayed": 2, "stale": 1}


async def _send(address: str, *lines: bytes, close: bool = True):
    host, port, _ = parse_hub_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    for line in lines:
        writer.write(line)
    await writer.drain()
    await asyncio.sleep(0.2)
    if close:
        writer.close()
        await asyncio.sleep(0.1)
    return reader, writer


def test_a_forged_link_that_closes_loses_no_node_and_a_replay_keeps_no_dead_node_alive():
    async def scenario():
        hub = LivenessHub(RUN, hang_timeout_s=0.6, key=KEY)
        await hub.start()
        genuine = [encode_report(KEY, RUN, hub.hub, 1, seq, {8: (seq, seq)}) for seq in (1, 2, 3)]
        # node 1's launcher beats, then its host hangs (the link stays open)
        _, node1 = await _send(hub.address, *genuine, close=False)
        # an attacker: forged lines for node 2 (a live node it wants declared lost), closed at once
        await _send(hub.address, encode_report(link_key(b"x" * 32), RUN, hub.hub, 2, 1, {16: (1, 1)}))
        await _send(hub.address, b"node 2 is here\n")
        # ... and node 1's captured lines sent again, to keep the hung node looking alive
        for _ in range(4):
            await _send(hub.address, *genuine)
        verdicts = hub.judge(time.monotonic())
        await asyncio.sleep(0.7)
        verdicts += hub.judge(time.monotonic())
        node1.close()
        await hub.close()
        return hub, verdicts
    hub, verdicts = asyncio.run(scenario())
    assert hub.reports == 3   # only node 1's own three beats were taken
    assert [(n, sorted(w)) for n, w, _ in verdicts] == [(1, [8])]   # node 1 judged silent; node 2 never named
    assert verdicts[0][2].startswith("no report for")
    refused = hub.gate.refusals()
    assert refused["forged"] == 1 and refused["malformed"] == 1 and refused["replayed"] == 4


def test_a_bad_line_on_a_nodes_own_link_is_skipped_not_a_loss_and_the_hub_keeps_serving():
    async def scenario():
        hub = LivenessHub(RUN, hang_timeout_s=5.0, key=KEY)
        await hub.start()
        stale = encode_report(KEY, RUN, hub.hub, 3, 2, {24: (2, 2)}, t_ns=time.time_ns() - int(2 * MAX_SKEW_S * 1e9))
        _, link = await _send(hub.address, encode_report(KEY, RUN, hub.hub, 3, 1, {24: (1, 1)}), stale,
                              encode_report(KEY, RUN, hub.hub, 3, 3, {24: (3, 3)}), close=False)
        await _send(hub.address, b"x" * (MAX_LINE_BYTES + 10) + b"\n")   # oversize from a stranger
        mid = hub.judge(time.monotonic())
        link.write(seal(KEY, RUN, hub.hub, 3, 4, b"bye", time.time_ns()))
        await link.drain()
        await asyncio.sleep(0.2)
        link.close()
        await asyncio.sleep(0.1)
        end = hub.judge(time.monotonic())
        await hub.close()
        return hub, mid, end
    hub, mid, end = asyncio.run(scenario())
    assert hub.reports == 2 and mid == [] and end == []   # a goodbye after it: no loss at all
    assert hub.gate.refusals()["stale"] == 1 and hub.gate.refusals()["oversize"] == 1


# ---- the launcher's link (runtime/nodelink.py): what `seamguard launch` runs between nodes
def _poll(server, seconds: float = 0.3) -> list:
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        out += server.poll()
        time.sleep(0.01)
    return out


def _raw(server, *lines: bytes):
    import socket

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=1.0)
    for line in lines:
        sock.sendall(line)
    return sock


def test_launch_link_takes_records_only_from_key_holders_and_a_stranger_closing_loses_nobody():
    from seamguard.runtime.nodelink import LinkClient, LinkServer

    refusals = []
    server = LinkServer(RUN, KEY, "127.0.0.1", on_refused=refusals.append)
    try:
        node2 = LinkClient(RUN, 2, KEY)
        node2.ensure(server.address("127.0.0.1"), time.monotonic())
        assert node2.send(b'{"n":7,"beats":{"16":{"n":3,"step":40}}}')
        assert _poll(server) == [] and server.records[2]["n"] == 7
        # the old unauthenticated hello, a wrong key, and a genuine line replayed: each on its own link
        genuine = seal(KEY, RUN, server.hub, 2, node2.seq, b'{"n":7,"beats":{}}', time.time_ns())
        socks = [_raw(server, b"seamguard-link %s 2\n" % RUN.encode()),
                 _raw(server, seal(link_key(b"x" * 32), RUN, server.hub, 2, 99, b'{"n":99,"beats":{}}',
                                   time.time_ns())),
                 _raw(server, genuine)]
        assert _poll(server) == []
        for sock in socks:
            sock.close()
        assert _poll(server) == []              # their links closing is nobody's loss
        assert server.records[2]["n"] == 7 and server.open_links() == 1
        assert {r: n for r, n in server.gate.refusals().items() if n} == {"malformed": 1, "forged": 1,
                                                                           "replayed": 1}
        assert refusals and all(isinstance(r, BeatRefused) for r in refusals)   # reported, rate-limited
        node2.close(orderly=False)              # node 2's own link closing is its loss, at once
        assert [n for n, _ in _poll(server)] == [2]
    finally:
        server.close()


def test_launch_link_client_without_the_key_does_not_connect():
    from seamguard.runtime.nodelink import LinkClient, LinkServer

    server = LinkServer(RUN, KEY, "127.0.0.1")
    try:
        keyless = LinkClient(RUN, 1)            # the key not known yet (not published, no key file)
        keyless.ensure(server.address("127.0.0.1"), time.monotonic())
        assert not keyless.connected and not keyless.send(b"{}")
    finally:
        server.close()


async def _hub_with_queued_lines(nodes: int, clock, read_bytes: int):
    """A hub that read each node's first line (at its clock's 100.0) and had nothing more
    arrive until 100.9; then every node's second line arrives and waits in its socket (the
    hub's loop has not run since). Each line is longer than ``read_bytes``: it takes
    several reads, split across them."""
    hub = LivenessHub(RUN, hang_timeout_s=1.0, key=KEY, clock=clock, read_bytes=read_bytes)
    await hub.start()
    host, port, _ = parse_hub_address(hub.address)
    socks = [socket.create_connection((host, port), timeout=1.0) for _ in range(nodes)]
    for n, sock in enumerate(socks, 1):
        sock.sendall(encode_report(KEY, RUN, hub.hub, n, 1, {8 * n + w: (1, 1) for w in range(8)}))
    for _ in range(500):   # bounded: until the hub read them all
        if hub.reports == nodes:
            break
        await asyncio.sleep(0.01)
    return hub, socks


def test_a_line_that_arrived_before_the_pass_but_is_read_during_it_is_no_verdict():
    """The coordinator judges as of the moment its pass starts, once every line that had
    arrived by then is read, however many sockets, and however many reads a line takes: a
    hub short of CPU judges late, never on a line still queued in its sockets."""
    now = [100.0]

    async def scenario():
        hub, socks = await _hub_with_queued_lines(40, lambda: now[0], read_bytes=64)
        assert await hub.judge_now() == []
        now[0] = 100.9
        assert await hub.judge_now() == []   # 0.9 s silent: within the timeout
        for n, sock in enumerate(socks, 1):   # arrive now; read only in the next pass
            sock.sendall(encode_report(KEY, RUN, hub.hub, n, 2, {8 * n + w: (2, 2) for w in range(8)}))
        time.sleep(0.05)   # loopback: the bytes are in the hub's sockets
        now[0] = 101.2     # past every first line's deadline; 0.3 s since the last pass, not forgiven
        verdicts = await hub.judge_now()
        reports = hub.reports
        for sock in socks:
            sock.close()
        await hub.close()
        return verdicts, reports
    verdicts, reports = asyncio.run(scenario())
    assert verdicts == [] and reports == 80


def test_a_backlog_the_pass_cannot_read_within_its_cap_spares_its_nodes_that_pass():
    now = [100.0]

    async def scenario():
        hub, socks = await _hub_with_queued_lines(3, lambda: now[0], read_bytes=64)
        assert await hub.judge_now() == []
        for n, sock in enumerate(socks, 1):
            sock.sendall(encode_report(KEY, RUN, hub.hub, n, 2, {8 * n + w: (2, 2) for w in range(8)}))
        time.sleep(0.05)
        now[0] = 101.2   # the clock stands still: the cap (0 s) is reached after one more read
        spared = await hub.judge_now(cap_s=0.0)
        unread = hub.reports
        rest = await hub.judge_now()   # the next pass reads the rest first
        for sock in socks:
            sock.close()
        await hub.close()
        return spared, unread, rest, hub.reports
    spared, unread, rest, reports = asyncio.run(scenario())
    assert spared == [] and unread == 3          # the second lines not read yet, their nodes not judged
    assert rest == [] and reports == 6


def test_a_starved_pass_shorter_than_the_timeout_does_not_delay_the_verdict():
    """A pass that comes 0.9 s after the last (the coordinator had no CPU) forgives nothing:
    the silent node is judged at the first pass past its timeout, as on an idle host."""
    hub = LivenessHub(RUN, hang_timeout_s=1.0, key=KEY)
    passes_s = [0.0, 0.9] + [round(0.9 + 0.125 * i, 3) for i in range(1, 16)]
    verdicts = []
    for at_s in passes_s:
        hub.observe(NodeReport(2, int(at_s * 1000), {16: (1, 1)}), at_s)   # node 2 beats throughout
        if at_s == 0.0:
            hub.observe(NodeReport(1, 0, {8: (1, 1)}), at_s)   # node 1's last line
        verdicts += [(n, at_s) for n, _, _ in hub.judge(at_s)]
    assert [n for n, _ in verdicts] == [1]
    assert 1.0 < verdicts[0][1] <= 1.0 + 0.125   # the timeout plus at most one pass


def test_a_freeze_longer_than_the_timeout_is_forgiven_in_full():
    """The coordinator's whole host stopped for 1.5 s (its network stack too: lines sent
    meanwhile come after it resumes): nobody is judged for it; a node silent before it is
    judged a timeout of the coordinator's waking time after its last line."""
    hub = LivenessHub(RUN, hang_timeout_s=1.0, key=KEY)
    for n in (1, 2):
        hub.observe(NodeReport(n, 0, {8 * n: (1, 1)}), 0.0)
    assert hub.judge(0.1) == []
    assert hub.judge(1.6) == [] and hub.forgiven_s == pytest.approx(1.5)
    verdicts = []
    for i in range(1, 16):
        at_s = round(1.6 + 0.125 * i, 3)
        hub.observe(NodeReport(2, i, {16: (1, 1)}), at_s - 0.05)   # node 2's lines come again
        verdicts += [(n, at_s) for n, _, _ in hub.judge(at_s)]
    assert [n for n, _ in verdicts] == [1]
    assert 2.5 < verdicts[0][1] <= 2.5 + 0.125   # 0.0 + 1.5 forgiven + 1.0 timeout, then a pass


# ---- idle links: a flood of sockets that never say a line (nobody's loss, bounded, timed out)
def test_pending_links_keep_the_newest_within_the_limit_and_time_out_the_silent():
    pending = PendingLinks(limit=3, first_line_s=1.0)
    assert [pending.opened(name, t) for name, t in (("a", 0.0), ("b", 0.1), ("c", 0.2))] == [[], [], []]
    assert pending.opened("d", 0.3) == ["a"]          # full: the oldest makes room, the newest gets in
    pending.settled("c")                              # bound to its node: no longer pending
    assert len(pending) == 2 and pending.deadline_s("b") == pytest.approx(1.1)
    assert pending.expired(1.15) == ["b"] and pending.expired(1.2) == []   # d is 0.9 s old: kept
    assert pending.expired(1.31) == ["d"] and len(pending) == 0
    assert dict(pending.dropped) == {"crowded": 1, "silent": 2}
    with pytest.raises(ValueError, match="must be positive"):
        PendingLinks(limit=0)


def test_a_flood_of_idle_links_neither_locks_launchers_out_of_the_hub_nor_grows_it():
    limit, flood = 16, 400

    async def scenario():
        hub = LivenessHub(RUN, hang_timeout_s=1.0, key=KEY, pending=PendingLinks(limit, first_line_s=0.4))
        await hub.start()
        host, port, _ = parse_hub_address(hub.address)

        async def locate():
            return hub.address
        stop = asyncio.Event()
        node1 = NodeReporter(RUN, 1, 0.05, KEY, locate, lambda: {8: (1, 1)})
        node2 = NodeReporter(RUN, 2, 0.05, KEY, locate, lambda: {16: (1, 1)})
        tasks = [asyncio.create_task(node1.run(stop))]
        idle, most_pending, verdicts = [], 0, []
        for i in range(flood // 20):   # 20 idle sockets every 10 ms, never closed by their opener
            idle += [await asyncio.open_connection(host, port) for _ in range(20)]
            if i == flood // 40:
                tasks.append(asyncio.create_task(node2.run(stop)))   # a launcher connecting mid-flood
            await asyncio.sleep(0.01)
            most_pending = max(most_pending, len(hub.pending))
            verdicts += hub.judge(time.monotonic())
        reports_in_flood = hub.reports
        await asyncio.sleep(0.8)   # past the first-line timeout: every idle link is closed by the hub
        verdicts += hub.judge(time.monotonic())
        members = hub.members()
        stop.set()
        await asyncio.gather(*tasks)
        ended = sum([await asyncio.wait_for(r.read(1), 1) == b"" for r, _ in idle])   # the hub closed them
        open_links = hub.open_links()
        for _, w in idle:
            w.close()
        await hub.close()
        return hub, most_pending, verdicts, members, reports_in_flood, ended, open_links, node2
    hub, most_pending, verdicts, members, reports_in_flood, ended, open_links, node2 = asyncio.run(scenario())
    assert most_pending <= limit                       # never more than the limit held
    assert ended == flood and open_links == 0          # all closed; the genuine links said bye
    assert verdicts == [] and set(members) == {1, 2}   # nobody lost; the mid-flood launcher got in
    assert node2.connects == 1 and reports_in_flood > 0
    assert hub.pending.dropped["crowded"] + hub.pending.dropped["silent"] >= flood
    assert hub.reports > reports_in_flood and sum(hub.gate.refusals().values()) == 0


def test_launch_link_drops_idle_links_past_the_limit_and_the_timeout_and_still_takes_a_node():
    import socket

    from seamguard.runtime.nodelink import LinkClient, LinkServer

    limit = 8
    server = LinkServer(RUN, KEY, "127.0.0.1", pending=PendingLinks(limit, first_line_s=0.3))
    idle = []
    try:
        for _ in range(10):   # 100 idle sockets, read by the server between batches
            idle += [socket.create_connection(("127.0.0.1", server.port), timeout=1.0) for _ in range(10)]
            server.poll()
            assert len(server.pending) <= limit
        node2 = LinkClient(RUN, 2, KEY)
        node2.ensure(server.address("127.0.0.1"), time.monotonic())
        assert node2.send(b'{"n":1,"beats":{}}')
        assert _poll(server, 0.5) == [] and server.records[2]["n"] == 1
        assert node2.send(b'{"n":2,"beats":{}}')
        assert _poll(server, 0.1) == [] and server.records[2]["n"] == 2
        assert len(server._conns) == 1 and len(server.pending) == 0   # only node 2's link is left open
        for sock in idle:
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
        node2.close(orderly=True)
    finally:
        for sock in idle:
            sock.close()
        server.close()
