"""benchmarks/membership_load.py's own parts, without the load: its one scheduling loop,
the probe that times a silent node's way through a real `LivenessHub`, and the split of
its detection time (the parts add up to the whole)."""

import asyncio
import sys
import time
from pathlib import Path

import pytest

from seamguard.runtime.liveness import LivenessHub, NodeReport

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import membership_load as bench  # noqa: E402


def test_schedule_acts_in_due_order_and_drops_an_ident_that_returns_none():
    now = time.monotonic()
    heap = [(now - 0.3, 3), (now - 0.1, 1), (now - 0.2, 2)]
    seen = []

    def act(ident, due_s, now_s):
        seen.append(ident)
        return None if ident == 2 else due_s + 1000.0   # 1 and 3 come due again far later
    bench.run_schedule(sorted(heap), act, until_s=now + 0.05)
    assert seen == [3, 2, 1]


def test_schedule_ends_when_stop_says_so_and_resumes_where_it_was():
    heap = [(time.monotonic(), 7)]
    calls = []

    def act(ident, due_s, now_s):
        calls.append(ident)
        return now_s   # due again at once
    bench.run_schedule(heap, act, float("inf"), stop=lambda: len(calls) >= 3)
    assert calls == [7, 7, 7] and len(heap) == 1
    bench.run_schedule(heap, act, float("inf"), stop=lambda: len(calls) >= 5)
    assert len(calls) == 5


def test_split_adds_up_and_counts_only_the_gaps_forgiven_after_the_last_line():
    passes = [(10.0, 0.5, 0.0),      # before the last line: not this node's
              (10.6, 0.3, 0.1), (11.2, 0.2, 0.0), (12.0, 0.0, 0.25)]
    split = bench.detection_split(kill_s=10.2, last_sent_s=10.1, last_read_s=10.15, passes=passes,
                                  verdict=(12.25, "no report for 1.2 s", 0.25), published_s=12.3, timeout_s=1.0)
    assert split["path"] == "timeout"   # the verdict pass: as of 12.0, after 0.25 s of reading
    assert split["forgiven"] == pytest.approx(0.5)
    assert split["read_through"] == pytest.approx(0.25)
    parts = ("last_sent", "read_lag", "timeout", "forgiven", "read_through", "pass_wait")
    assert sum(split[k] for k in parts) == pytest.approx(split["verdict_s"], abs=2e-3)
    assert split["verdict_s"] + split["publish"] == pytest.approx(split["published_s"], abs=2e-3)


def test_split_of_a_closed_link_has_no_timeout_and_of_no_verdict_is_empty():
    closed = bench.detection_split(5.0, 4.9, 4.9, [(5.1, 0.0, 0.0)],
                                   (5.1, "its launcher's link closed without a goodbye", 0.0), None, 1.0)
    assert closed["path"] == "link closed" and closed["timeout"] == 0.0 and closed["publish"] is None
    assert closed["verdict_s"] == pytest.approx(0.1)
    assert bench.detection_split(5.0, 4.9, 4.9, [], None, None, 1.0)["verdict_s"] is None


class _Book:
    def __init__(self):
        self.written = []

    async def write(self, new):
        self.written.append(dict(new))
        return 1


def test_probe_times_a_real_hub_verdict_and_the_write_that_publishes_it():
    hub = LivenessHub("run", 1.0, b"k" * 32)
    book = _Book()
    probe = bench._VerdictProbe(hub, book, victim=1)
    for node in (1, 2):
        hub.observe(NodeReport(node, 1, {node * 8: (1, 1)}), 100.0)
    hub.judge(100.1)
    hub.observe(NodeReport(2, 2, {16: (2, 2)}), 100.9)
    assert hub.judge(100.9) == []   # 0.8 s since the last pass: shorter than the timeout, not forgiven
    hub.observe(NodeReport(2, 3, {16: (3, 3)}), 102.3)
    assert hub.judge(102.3) == [] and probe.verdict is None   # 1.4 s: a frozen host, forgiven in full
    lost = hub.judge(102.45)   # node 1 silent 2.45 s, 1.05 s of it as judged
    assert [n for n, _, _ in lost] == [1]
    assert probe.last_line_s == 100.0 and probe.verdict[0] == 102.45 and "no report" in probe.verdict[1]
    assert [round(f, 3) for _, f, _ in probe.passes] == [0.0, 0.0, 1.4, 0.0]
    split = bench.detection_split(100.05, 99.95, probe.last_line_s, probe.passes, probe.verdict, None, 1.0)
    assert split["forgiven"] == pytest.approx(1.4) and split["verdict_s"] == pytest.approx(2.4)
    asyncio.run(book.write({2: frozenset({16})}))
    assert probe.published_s is not None


def test_simulated_links_send_lines_a_real_gate_admits_then_say_goodbye():
    import socket

    from seamguard.runtime.linkwire import BYE, LinkGate, decode_report, new_hub_id

    key, hub = b"s" * 32, new_hub_id()
    server = socket.create_server(("127.0.0.1", 0))
    links = bench._SimulatedLinks("127.0.0.1", server.getsockname()[1], hub, key)
    links.send(5)
    peer, _ = server.accept()
    links.send(5)
    links.goodbye()
    data = b""
    while chunk := peer.recv(65536):
        data += chunk
    gate = LinkGate(key, "bench", hub)
    got = [gate.admit(line + b"\n") for line in data.split(b"\n") if line]
    assert [(m.node, m.seq) for m in got] == [(5, 1), (5, 2), (5, 3)]
    assert decode_report(got[1]).beats == {40 + i: (2, 2) for i in range(8)}
    assert got[2].body == BYE and links.reconnects == 0
    peer.close()
    server.close()
