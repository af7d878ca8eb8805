"""Membership at scale on a real etcd: liveness over the launchers' links, etcd written only
on change, the coordinator elected and failed over (runtime/liveness.py, roster.py,
node_membership.py). No torch.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamguard import hintauth
from seamguard.runtime import roster as roster_mod
from seamguard.runtime.liveness import BeatRefused, LinkGate, decode_report, encode_report, link_key
from seamguard.runtime.node_membership import NodeMembership

pytestmark = pytest.mark.timeout(120)
HANG_TIMEOUT_S = 1.0
KEY = link_key(b"k" * 32)


def _endpoint(etcd) -> tuple[str, int]:
    host, port = etcd.address.rsplit(":", 1)
    return host, int(port)


def _beats(node: int):
    counter = [0]

    def beats() -> dict[int, tuple[int, int]]:
        counter[0] += 1
        return {node * 8 + i: (counter[0], counter[0]) for i in range(8)}
    return beats


async def _until(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


def test_report_wire_round_trip_and_refusals():
    gate = LinkGate(KEY, "job", "hub1")
    report = decode_report(gate.admit(encode_report(KEY, "job", "hub1", 3, 7, {24: (5, 100)})))
    assert (report.node, report.seq, report.beats) == (3, 7, {24: (5, 100)})
    for bad, why in ((b"nope\n", "malformed"), (encode_report(KEY, "other", "hub1", 1, 8, {}), "forged"),
                     (encode_report(KEY, "job", "hub0", 1, 9, {}), "misdirected")):
        with pytest.raises(BeatRefused, match=why):
            gate.admit(bad)


def test_roster_changes():
    a, b = frozenset({1}), frozenset({2})
    assert roster_mod.changes({0: a, 1: b}, {0: a, 1: b}) == ({}, [])
    assert roster_mod.changes({0: a, 1: b}, {0: a, 2: b}) == ({2: b}, [1])
    assert roster_mod.changes({0: a}, {0: b}) == ({0: b}, [])


async def _cluster(etcd, run_id: str, nodes: int):
    members, stops, tasks = [], [], []
    for n in range(nodes):
        nm = NodeMembership(roster_mod.Roster(roster_mod.connect(_endpoint(etcd)), run_id), run_id, n, _beats(n),
                            KEY, hang_timeout_s=HANG_TIMEOUT_S)
        stop = asyncio.Event()
        members.append(nm), stops.append(stop), tasks.append(asyncio.create_task(nm.run(stop)))
    await _until(lambda: sum(m.coordinates for m in members) == 1
                 and len(next(m for m in members if m.coordinates).roster.members) == nodes, 20, "all nodes joined")
    return members, stops, tasks


async def _stop(stops, tasks) -> None:
    for s in stops:
        s.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)


def test_a_silent_node_is_lost_with_its_ranks_and_no_other(etcd):
    async def scenario():
        members, stops, tasks = await _cluster(etcd, "silent", 5)
        leader = next(m for m in members if m.coordinates)
        victim = next(m for m in members if m is not leader)
        tasks[victim.node].cancel()   # its launcher stops beating; its link stays open (a hung host)
        await _until(lambda: leader.lost, 10, "the silent node judged lost")
        await asyncio.sleep(2 * HANG_TIMEOUT_S)   # room for any wrong verdict to show
        lost = list(leader.lost)
        fresh = roster_mod.Roster(roster_mod.connect(_endpoint(etcd)), "silent")
        gen, held = await fresh.load()
        await _stop([s for i, s in enumerate(stops) if i != victim.node],
                    [t for i, t in enumerate(tasks) if i != victim.node])
        return lost, victim.node, gen, held
    lost, victim, gen, held = asyncio.run(scenario())
    assert [(x.node, sorted(x.workers)) for x in lost] == [(victim, list(range(victim * 8, victim * 8 + 8)))]
    assert lost[0].why.startswith("no report for")
    assert float(lost[0].why.split()[3]) >= HANG_TIMEOUT_S  # silent past the timeout (printed to 0.01 s)
    assert sorted(held) == sorted(set(range(5)) - {victim}) and gen >= 2


def test_stable_membership_sends_etcd_no_writes(etcd):
    async def scenario():
        members, stops, tasks = await _cluster(etcd, "stable", 6)
        leader = next(m for m in members if m.coordinates)
        await asyncio.sleep(0.5)
        before = await leader.etcd.call(leader.roster.revision())
        reports = leader.hub.reports
        await asyncio.sleep(3.0)
        after = await leader.etcd.call(leader.roster.revision())
        reports = leader.hub.reports - reports
        await _stop(stops, tasks)
        return before, after, reports
    before, after, reports = asyncio.run(scenario())
    assert reports >= 6 * 4   # the beats did flow: six nodes over three seconds of 0.25 s beats
    assert after == before


def _status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _load(etcd, run_id: str) -> tuple[int, dict[int, frozenset[int]]]:
    async def load():
        client = roster_mod.connect(_endpoint(etcd))
        try:
            return await roster_mod.Roster(client, run_id).load()
        finally:
            await client.close()
    return asyncio.run(load())


def _wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what() if callable(what) else what}")
        time.sleep(0.1)


def test_the_coordinators_node_killed_another_launcher_takes_over(etcd, tmp_path):
    helper = Path(__file__).with_name("membership_node_proc.py")
    procs, files = [], []
    key_file = tmp_path / "hint-key"
    hintauth.create_key(key_file)
    try:
        for n in range(3):
            files.append(tmp_path / f"node{n}.json")
            procs.append(subprocess.Popen([sys.executable, str(helper), etcd.address, "failover", str(n),
                                           str(files[-1]), str(key_file)], start_new_session=True,
                                          stderr=open(tmp_path / f"node{n}.err", "wb")))
        _wait(lambda: len(_load(etcd, "failover")[1]) == 3 and all(_status(f).get("connects") for f in files)
              and sum(_status(f).get("coordinates", False) for f in files) == 1, 60, "three nodes, one coordinator")
        first = next(n for n, f in enumerate(files) if _status(f)["coordinates"])
        survivors = [n for n in range(3) if n != first]
        before = {n: _status(files[n]) for n in survivors}
        os.killpg(procs[first].pid, signal.SIGKILL)   # the coordinator's launcher and its ranks
        procs[first].wait(10)
        second = _wait(lambda: next((str(n) for n in survivors if _status(files[n]).get("coordinates")), None),
                       30, lambda: "another launcher elected: " + "; ".join(
                           f"node {n}: {_status(files[n])} {(tmp_path / f'node{n}.err').read_text()[-300:]}"
                           for n in survivors))
        second = int(second)
        _, held = _wait(lambda: (lambda g: g if sorted(g[1]) == survivors else None)(_load(etcd, "failover")),
                        30, "the dead node removed from the membership")
        _wait(lambda: _status(files[second])["lost"], 5, "the loss in the new coordinator's status")
        after = {n: _status(files[n]) for n in survivors}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    assert held == {n: frozenset(range(n * 8, n * 8 + 8)) for n in survivors}
    lost = after[second]["lost"]
    assert [x[:2] for x in lost] == [[first, list(range(first * 8, first * 8 + 8))]]
    for n in survivors:   # the launchers reconnected; their ranks are the same processes, alive
        assert after[n]["pid"] == before[n]["pid"] and after[n]["rank_pids"] == before[n]["rank_pids"]
        assert after[n]["connects"] == before[n]["connects"] + 1
        for pid in after[n]["rank_pids"]:
            os.kill(pid, 0)
