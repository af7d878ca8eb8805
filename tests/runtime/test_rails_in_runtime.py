"""Rails inside the runtime: a job launched with `--rails` across two namespaced hosts gets
rail failover for its gradient all-reduce (runtime/rail_sync.py over runtime/rails.py).

2 hosts x 1 rank, 2 rails each, etcd on a third host. A rail's link goes down on one host
for two seconds mid-run: the all-reduce moves to the other rail and back, the job never
recovers (one generation), and the final weights equal a failure-free 2-rank run's (a sum
of two is exact in any order). Namespaces are deleted and checked gone, also on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from seamguard.testbed.multinode import EtcdServer, MultiNodeJob
from seamguard.testbed.net import Testbed, TestbedSpec, list_namespaces

from .conftest import REPO

pytestmark = pytest.mark.timeout(300)

STEPS = 300   # the flap (2 s down, at step 30 or a little later) and the rail's way back fit well inside
SCRIPT = ("--steps", str(STEPS), "--step-sleep-s", "0.03")


def test_a_rail_flap_moves_the_all_reduce_without_a_recovery(tmp_path):
    clean = tmp_path / "clean"
    p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--",
                        str(REPO / "examples" / "train_ddp.py"), *SCRIPT, "--out", str(clean)],
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    tb = Testbed(TestbedSpec(hosts=3, rails=2))
    etcd = EtcdServer.in_host(tb, 2, tmp_path / "etcd")
    job = None
    try:
        tb.up()
        etcd.start()
        job = MultiNodeJob(tb, [0, 1], etcd.url, tmp_path / "rails", run_id=f"rails-{os.getpid()}", nproc=1,
                           spares=0, launch_args=("--rails", "rail0,rail1"), script_args=SCRIPT).start()
        assert job.wait_for_step(etcd, 30, 120) >= 30, job.log(0)[-3000:]
        tb.flap(1, 0, down_s=2.0)
        codes = job.wait(180)
        assert codes == {0: 0, 1: 0}, job.log(0)[-3000:] + job.log(1)[-3000:]
    finally:
        if job is not None:
            job.stop()
        etcd.stop()
        tb.down()
    assert not [ns for ns in list_namespaces() if ns.startswith(tb.prefix + "-")]
    events = job.events()
    assert [e["gen"] for e in events if e["event"] == "plan"] == [0]  # no recovery
    # after the flap (from step 30 on): rail 0 out on both ranks, then back in; rail 1 carried on
    late = [(e["kind"], e["rail"], e["step"]) for e in events
            if e["event"] == "worker" and e["kind"].startswith("rail_") and e["step"] >= 30]
    outs = [(r, step) for kind, r, step in late if kind == "rail_out"]
    assert outs and {r for r, _ in outs} == {0}, late
    assert any(kind == "rail_in" and r == 0 and step >= max(s for _, s in outs) for kind, r, step in late), late
    assert (job.out / "final_checksum.txt").read_text() == (clean / "final_checksum.txt").read_text()
