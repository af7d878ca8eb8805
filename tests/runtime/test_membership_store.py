"""The job-wide store on a real etcd (Debian's etcd-server on loopback ports) and the
per-node liveness verdicts, by table.

EtcdStore must behave as a c10d Store (gloo rendezvous through it), block instead of
polling while it waits, and give the range reads the coordinator's aggregated membership
relies on.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from seamguard.runtime import keys
from seamguard.runtime.detect import NodeTracker
from seamguard.runtime.settings import LaunchSettings, parse_store_url
from seamguard.runtime.store import EtcdStore
from tests.runtime.conftest import etcd_store

pytestmark = pytest.mark.timeout(120)


def test_parse_store_url():
    assert parse_store_url("tcp", "r").kind == "tcp"
    url = parse_store_url("etcd://10.0.0.1:2379,10.0.0.2:2379", "job7")
    assert url.endpoints == (("10.0.0.1", 2379), ("10.0.0.2", 2379))
    assert url.prefix == "/seamguard/job7/"
    for bad in ("redis://h:1", "etcd://", "etcd://host", "etcd://h:99999", "etcd://h:x"):
        with pytest.raises(ValueError, match="--store"):
            parse_store_url(bad, "r")


def test_settings_reject_a_node_beat_the_hang_timeout_cannot_see():
    with pytest.raises(ValueError, match="node_beat_s"):
        LaunchSettings(script=["t.py"], store="etcd://h:2379", node_beat_s=0.6, hang_timeout_s=1.0)
    assert LaunchSettings(script=["t.py"], store="etcd://h:2379").aggregate
    assert not LaunchSettings(script=["t.py"]).aggregate


def test_store_operations(etcd):
    s = etcd_store(etcd, "/ops/")
    s.set("a", "1")
    assert s.get("a") == b"1" and s.check(["a"]) and not s.check(["a", "b"])
    assert s.add("n", 2) == 2 and s.add("n", 3) == 5
    assert s.compare_set("c", "", "v1") == b"v1"
    assert s.compare_set("c", "wrong", "v2") == b"v1"
    assert s.compare_set("c", "v1", "v2") == b"v2"
    assert s.peek("missing") is None and s.peek("a") == b"1"
    assert s.get_prefix("") == {"a": b"1", "n": b"5", "c": b"v2"}
    assert etcd_store(etcd, "/other/").get_prefix("") == {}  # jobs are apart by prefix
    assert s.delete_key("a") and not s.check(["a"])


def test_concurrent_adds_never_lose_an_increment(etcd):
    def bump():
        s = etcd_store(etcd, "/adds/")
        for _ in range(25):
            s.add("n", 1)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert etcd_store(etcd, "/adds/").get("n") == b"100"


def test_wait_blocks_until_the_key_is_set_and_times_out_otherwise(etcd):
    s = etcd_store(etcd, "/wait/")
    threading.Timer(0.3, lambda: etcd_store(etcd, "/wait/").set("late", "x")).start()
    t0 = time.monotonic()
    s.wait(["late"], datetime.timedelta(seconds=5))
    assert 0.2 < time.monotonic() - t0 < 4.0
    assert s.get("late") == b"x"
    t0 = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="never"):
        s.wait(["never"], datetime.timedelta(seconds=0.4))
    assert time.monotonic() - t0 >= 0.4


def test_read_family_matches_on_etcd_and_on_a_tcpstore(etcd):
    tcp = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    e = etcd_store(etcd, "/family/")
    for store in (tcp, e):
        store.set(keys.exit_code(3), "0")
        store.set(keys.exit_code(12), "-9")
        store.set(keys.done(3), "20")
        assert keys.read_family(store, keys.EXIT_PREFIX, ["3", "4", "12"]) == {"3": b"0", "12": b"-9"}
        assert keys.read_family(store, keys.DONE_PREFIX, ["3"]) == {"3": b"20"}
        assert keys.peek(store, keys.JOB_DONE) is None


def test_gloo_rendezvous_through_the_etcd_store(etcd):
    """Two processes form a gloo group through a PrefixStore over EtcdStore, as every
    generation of a job on etcd does."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_allreduce, args=(etcd.address, r, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(out.get(timeout=5) for _ in procs) == [3.0, 3.0]


def _allreduce(address: str, rank: int, out) -> None:
    import torch

    host, port = address.rsplit(":", 1)
    store = EtcdStore(((host, int(port)),), "/gloo/", datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=dist.PrefixStore(keys.group_prefix(0), store), rank=rank, world_size=2)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    out.put(float(t.item()))
    dist.destroy_process_group()


@pytest.mark.parametrize("beats,now,lost", [
    # (node, counter, at) observations; judged at `now`; nodes judged lost
    ([(0, 1, 0.0), (1, 1, 0.0), (0, 2, 0.9), (1, 1, 0.9)], 1.05, [1]),  # node 1 stood still > 1 s
    ([(0, 1, 0.0), (0, 2, 0.5), (0, 3, 1.0)], 1.4, []),                  # moving: alive
    ([(0, 1, 0.0), (0, 1, 0.9)], 0.95, []),                               # silent, but < 1 s
])
def test_node_tracker(beats, now, lost):
    t = NodeTracker(hang_timeout_s=1.0)
    for node, counter, at in beats:
        t.observe(node, counter, {10 * node, 10 * node + 1}, at)
    verdicts = t.verdicts(now)
    assert [v[0] for v in verdicts] == lost
    for node, wids, silent in verdicts:
        assert wids == {10 * node, 10 * node + 1} and silent > 1.0
    again = [v[0] for v in t.verdicts(now + 5)]  # later, every silent node is lost...
    assert not set(again) & set(lost)  # ...but a lost node is reported once


def test_a_lost_node_stays_lost():
    t = NodeTracker(hang_timeout_s=1.0)
    t.observe(0, 1, {0}, 0.0)
    assert [v[0] for v in t.verdicts(2.0)] == [0]
    t.observe(0, 2, {0}, 2.1)  # a late record from a node already replaced changes nothing
    assert t.verdicts(5.0) == []


def test_prefix_mirror_follows_writes_in_order(etcd):
    s = etcd_store(etcd, "/mirror/")
    s.set("sg/node/0", "a")
    m = s.mirror("sg/")
    try:
        assert m.get_prefix("sg/node/") == {"sg/node/0": b"a"}  # what was there before
        s.set("sg/done/3", "20")
        s.set("sg/exit/3", "0")
        s.set("sg/node/0", "b")
        s.delete_key("sg/node/0")
        s.set("other/x", "1")  # outside the prefix
        deadline = time.monotonic() + 5
        while "sg/exit/3" not in m.get_prefix("sg/") and time.monotonic() < deadline:
            time.sleep(0.01)
        # the done mark was written first, so a copy that has the exit code has it too
        assert m.get_prefix("sg/done/") == {"sg/done/3": b"20"}
        while m.get_prefix("sg/node/") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert m.get_prefix("sg/") == {"sg/done/3": b"20", "sg/exit/3": b"0"}
    finally:
        m.close()


def test_put_and_read_is_one_transaction_of_a_node_beat(etcd):
    s = etcd_store(etcd, "/beat/")
    s.set(keys.GENERATION, "3")
    s.set(keys.kill_request(7), "1")
    got, fam = s.put_and_read(keys.node_beats(1), '{"n": 5}', [keys.GENERATION, keys.JOB_DONE], [keys.KILL_PREFIX])
    assert got == {keys.GENERATION: b"3", keys.JOB_DONE: None}
    assert fam == {keys.KILL_PREFIX: {keys.kill_request(7): b"1"}}
    assert s.get(keys.node_beats(1)) == b'{"n": 5}'
    got, _ = s.put_and_read(keys.node_beats(2), "x", [], [], versions=(keys.node_beats(1), "absent"))
    rev = int(got[keys.node_beats(1)])
    assert got["absent"] is None
    s.set(keys.node_beats(1), '{"n": 6}')
    got, _ = s.put_and_read(keys.node_beats(2), "x", [], [], versions=(keys.node_beats(1),))
    assert int(got[keys.node_beats(1)]) > rev  # a rewrite shows as a newer revision
