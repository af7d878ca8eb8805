"""The coordinator fails over to another node's launcher (etcd election), ranks untouched.

Unit: the election's term on a real etcd (loopback) — a holder whose renewals stop
reaching etcd stops acting before its lease can end, a second candidate gets the key only
after that, and the deposed holder's fenced writes are refused. End to end: a 3-node job
on localhost with its store in etcd; node 0's launcher and workers SIGKILLed mid-run;
another node's launcher takes over, the survivors keep their processes, and the job ends
with exit 0 on the surviving nodes at the script's last step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamguard.runtime import keys
from seamguard.runtime.election import ACT_SHARE, Deposed, Election, renewed
from seamguard.runtime.settings import LaunchSettings
from seamguard.runtime.store import StoreError

from .conftest import REPO, etcd_store

pytestmark = pytest.mark.timeout(240)


class _CutOff:
    """A launcher's view of the store that loses etcd for lease renewals once ``cut`` is set."""

    def __init__(self, store) -> None:
        self.store, self.cut = store, False

    def __getattr__(self, name):
        return getattr(self.store, name)

    def keep_alive(self, lease, timeout_s=None):
        if self.cut:
            raise StoreError("etcd lease_keepalive: no endpoint answered (cut off)")
        return self.store.keep_alive(lease, timeout_s)


def test_a_term_allows_acting_for_two_thirds_of_the_lease_after_the_renewal_was_sent():
    term = renewed(7, sent_s=100.0, lease_s=3)
    assert term.may_act(100.0) and term.may_act(101.9)
    assert not term.may_act(100.0 + 3 * ACT_SHARE)
    assert not renewed(0, 100.0, 3).may_act(100.0)   # no token: no term


def test_a_holder_cut_off_stops_acting_before_another_candidate_can_take_over(etcd):
    prefix = f"/elect-{os.getpid()}/"
    a_view, b_store = _CutOff(etcd_store(etcd, prefix)), etcd_store(etcd, prefix)
    a, b = Election(a_view, node=0, lease_s=2), Election(b_store, node=1, lease_s=2)
    try:
        assert a.campaign() and a.may_act()
        assert not b.campaign()   # the key is held: the second candidate loses
        assert b.holder() == 0
        fenced_a = a.fenced(a_view.store)
        fenced_a.set(keys.GENERATION, "3")   # the holder's fenced write goes through
        a_view.cut = True   # its renewals no longer reach etcd
        a_stopped = b_won = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and b_won is None:
            now = time.monotonic()
            if a_stopped is None and not a.may_act():
                a_stopped = now
            if b.campaign():
                b_won = time.monotonic()
            time.sleep(0.05)
        assert a_stopped is not None and b_won is not None
        assert a_stopped < b_won   # it stopped acting before the other could begin
        assert b.holder() == 1 and b.may_act()
        with pytest.raises(Deposed):   # the deposed holder cannot write after the new term began
            fenced_a.set(keys.GENERATION, "4")
        b.fenced(b_store).set(keys.GENERATION, "5")
        assert b_store.get(keys.GENERATION) == b"5"
        b.resign()
        assert b.holder() is None   # a clean stop gives the key up at once
    finally:
        a.resign()
        b.resign()
        a_view.store.close()
        b_store.close()


STEPS = 90
NODES, NPROC, SPARES = 3, 1, 1
LEASE_S = 3   # --coordinator-timeout-s: the coordinator's lease


def _launch_node(etcd, node: int, run_id: str, out: Path) -> subprocess.Popen:
    """One node's launcher on localhost, in a process group of its own (its zygote and
    workers with it), so that a node can be killed whole."""
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", str(NPROC), "--spares", str(SPARES),
           "--nnodes", str(NODES), "--node-rank", str(node), "--master-addr", "127.0.0.1",
           "--store", f"etcd://{etcd.address}", "--run-id", run_id, "--coordinator-timeout-s", str(LEASE_S),
           "--events-file", str(out / "events.jsonl"), "--chaos-dir", str(out / "chaos"),
           "--", str(REPO / "examples" / "train_ddp.py"), "--steps", str(STEPS), "--step-sleep-s", "0.05",
           "--out", str(out)]
    log = open(out / f"launcher{node}.log", "wb")
    return subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _steps(out: Path, wid: int) -> list[tuple[int, int]]:
    """(step, generation) of every step worker ``wid`` committed (the example's own log)."""
    f = out / f"worker_{wid}.log"
    rows = [line.split() for line in f.read_text().splitlines()] if f.exists() else []
    return [(int(r[0]), int(r[4])) for r in rows if len(r) == 5]


def _events(out: Path) -> list[dict]:
    f = out / "events.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


def _wait(pred, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    return pred()


def _process(pid: int) -> tuple[int, int] | None:
    """(pid, its start time in clock ticks since boot): the same pair later is the same
    process, not one the kernel gave a reused pid. None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return pid, int(stat.rpartition(")")[2].split()[19])


def test_node_0_killed_another_launcher_coordinates_and_the_ranks_train_on(etcd, tmp_path):
    run_id, out = f"failover-{os.getpid()}", tmp_path / "job"
    out.mkdir()
    per_node = NPROC + SPARES
    ranks = {n: [n * per_node + i for i in range(NPROC)] for n in range(NODES)}
    survivors = ranks[1] + ranks[2]
    procs = [_launch_node(etcd, n, run_id, out) for n in range(NODES)]
    store = etcd_store(etcd, f"/seamguard/{run_id}/")
    try:
        assert _wait(lambda: max([s for w in survivors for s, _ in _steps(out, w)] or [-1]) >= 15, 150), \
            (out / "launcher0.log").read_text()[-3000:]
        pids = {w: _process(int(store.get(keys.worker_pid(w)))) for w in survivors}
        killed_at = time.time()
        os.killpg(procs[0].pid, signal.SIGKILL)   # node 0's launcher, its zygote and its workers
        procs[0].wait(10)
        before = {w: max(s for s, _ in _steps(out, w)) for w in survivors}
        took = _wait(lambda: [e for e in _events(out) if e["event"] == "took_over"], 60)
        resumed = _wait(lambda: [e for e in _events(out) if e["event"] == "resumed" and e["gen"] > 0], 60)
        assert took and resumed, (out / "launcher1.log").read_text()[-3000:] + (out / "launcher2.log").read_text()[-3000:]
        assert {w: _process(pids[w][0]) for w in survivors} == pids   # the same processes, recovered in place
        codes = [p.wait(120) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        store.close()
    logs = "".join((out / f"launcher{n}.log").read_text()[-2000:] for n in (1, 2))
    assert codes == [0, 0], logs
    assert took[0]["from_node"] == 0 and took[0]["node"] in (1, 2), took
    lost = [e for e in _events(out) if e["event"] == "node_lost"]
    assert [(e["node"], e["wids"]) for e in lost] == [(0, [0, 1])], lost   # its rank and its spare, one verdict
    starts = [e["wid"] for e in _events(out) if e["event"] == "worker" and e["kind"] == "started"]
    assert sorted(starts) == [w for n in range(NODES) for w in ranks[n]]   # the first ranks only: nobody restarted
    for w in survivors:
        steps = _steps(out, w)
        assert steps[-1][0] == STEPS - 1   # every survivor reached the script's last step
        first_after = next(s for s, g in steps if g > 0)
        assert before[w] - 1 <= first_after - 1 <= before[w] + 1, (w, before[w], first_after)
    print(f"lease {LEASE_S} s: took over {took[0]['t'] - killed_at:.2f} s after the kill, generation "
          f"{resumed[0]['gen']} resumed at step {resumed[0]['step']} {resumed[0]['t'] - killed_at:.2f} s after it")
    assert (out / "final_checksum.txt").exists()


class _Exited:
    """A worker process that already exited with ``code``."""

    def __init__(self, code: int) -> None:
        self.code, self.pid = code, -1

    def poll(self) -> int:
        return self.code

    def kill(self) -> None:
        pass


def test_a_node_that_gives_up_waiting_for_the_jobs_end_exits_1_saying_the_outcome_is_unknown():
    """Node 1's workers all exited 0, but the job's end never reached it (the store holds no
    keys.JOB_DONE): it must not exit 0 as if it knew the job succeeded."""
    import torch.distributed as dist

    from seamguard.runtime.launcher import _Loop
    from seamguard.runtime.supervise import Child

    s = LaunchSettings(script=["x.py"], nproc=1, nnodes=2, node_rank=1, master_port=29500,
                       coordinator_timeout_s=0.2)
    events: list[dict] = []
    loop = _Loop(s, dist.HashStore(), 0, None, None, None, None, [Child(2, _Exited(0))], events.append)
    assert loop.run() == 1
    assert [e["event"] for e in events] == ["job_outcome_unknown"]


class _Running(_Exited):
    """A worker process still running; ``kill`` ends it."""

    def __init__(self) -> None:
        super().__init__(0)
        self.code = None

    def kill(self) -> None:
        self.code = -9


def test_a_coordinator_whose_write_is_refused_ends_its_node_and_writes_nothing_more():
    """Another launcher took over while this one still ran its coordinator: the fenced write
    raises Deposed, the launcher says so in one event, kills its workers and exits 1."""
    from seamguard.runtime.launcher import _Loop
    from seamguard.runtime.supervise import Child

    class Refused:
        phase = "running"

        def tick(self, exited, closed):
            raise Deposed("node 0 coordinates no more: its write of 'sg/gen' was refused")

        hints = None

    class Valid:
        def may_act(self):
            return True

    s = LaunchSettings(script=["x.py"], nproc=1, nnodes=2, node_rank=0, master_port=29500)
    events: list[dict] = []
    worker = _Running()
    loop = _Loop(s, None, 0, None, None, Refused(), None, [Child(0, worker)], events.append, election=Valid())
    assert loop._coordinate(exited=False, closed=(), due=True) == 1
    assert [e["event"] for e in events] == ["coordinator_deposed"] and "refused" in events[0]["reason"]
    assert worker.poll() == -9   # its workers go with it: the new coordinator judges the node lost
