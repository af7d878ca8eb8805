"""The control plane's avoid_rails and degraded hints acted on by a running `seamguard launch --rails` job.

2 hosts x 1 rank, 2 rails each, etcd on a third host (the fixtures of test_rails_in_runtime.py).
Mid-run the runtime actuator, as `seamguard run` would, is handed an avoid_link of h1's rail0
link and a checkpoint_interval for the job (which also holds it degraded); later both are
reverted. Observed from the job's own event log and checkpoint directory: the all-reduce
leaves rail0 from one step on both ranks and carries on over rail1 alone, then uses rail0
again; while degraded every persist point of the halved interval is persisted (snapshots
every step, not every 5th). No recovery, and the final weights equal an unhinted run's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from seamguard.act.runtime import RuntimeHintActuator
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.runtime.manifest import complete_steps
from seamguard.testbed.multinode import EtcdServer, MultiNodeJob
from seamguard.testbed.net import Testbed, TestbedSpec, list_namespaces

from .conftest import REPO

pytestmark = pytest.mark.timeout(400)

STEPS = 220
SCRIPT = ("--steps", str(STEPS), "--step-sleep-s", "0.03")
LINK = "h1/rail0~leaf-r0"  # h1's rail0 NIC's own link, as the fleet names it


def _until(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def _worker(events, kind, rail=None):
    return [e for e in events if e["event"] == "worker" and e["kind"] == kind
            and (rail is None or e.get("rail") == rail)]


def test_avoid_rails_and_degraded_hints_mid_run(tmp_path):
    clean = tmp_path / "clean"
    p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--",
                        str(REPO / "examples" / "train_ddp.py"), *SCRIPT, "--out", str(clean)],
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True, text=True,
                       timeout=150, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    hints, ckpt = tmp_path / "hints", tmp_path / "ckpt"
    hints.mkdir()
    act = RuntimeHintActuator({"train": hints})
    avoid = Action(key=action_key(Verb.AVOID_LINK, LINK), verb=Verb.AVOID_LINK, target=LINK, target_kind="link",
                   reason="seamguard: quarantine loss on h1/rail0")
    interval = Action(key=action_key(Verb.CHECKPOINT_INTERVAL, "train", value="0.5"), verb=Verb.CHECKPOINT_INTERVAL,
                      target="train", target_kind="job", params=(("interval_s", "0.5"),), reason="seamguard: exposed")
    tb = Testbed(TestbedSpec(hosts=3, rails=2))
    etcd = EtcdServer.in_host(tb, 2, tmp_path / "etcd")
    job = None
    try:
        tb.up()
        etcd.start()
        job = MultiNodeJob(tb, [0, 1], etcd.url, tmp_path / "rails", run_id=f"railhints-{os.getpid()}", nproc=1,
                           spares=0, script_args=SCRIPT,
                           launch_args=("--rails", "rail0,rail1", "--hint-dir", str(hints),
                                        "--checkpoint-dir", str(ckpt), "--snapshot-every", "5",
                                        "--persist-every", "20", "--keep-checkpoints", "1000")).start()
        assert job.wait_for_step(etcd, 30, 150) >= 30, job.log(0)[-3000:]
        assert (hints / ".placement.json").exists(), job.log(0)[-3000:]
        applied = act.apply(avoid)
        assert applied.ok and "train stay off rail rail0" in applied.detail, applied.detail
        assert act.apply(interval).ok
        # both ranks report the all-reduce off rail0, and degraded mode on
        assert _until(lambda: len(_worker(job.events(), "rail_avoided", 0)) >= 2, 90), job.log(0)[-3000:]
        assert _until(lambda: any(e.get("degraded") for e in _worker(job.events(), "step_mode")), 60)
        held_from = max(e["step"] for e in _worker(job.events(), "rail_avoided", 0))
        assert job.wait_for_step(etcd, held_from + 40, 120) >= held_from + 40, job.log(0)[-3000:]
        assert act.revert(avoid.key).ok and act.revert(interval.key).ok
        codes = job.wait(240)
        assert codes == {0: 0, 1: 0}, job.log(0)[-3000:] + job.log(1)[-3000:]
    finally:
        if job is not None:
            job.stop()
        etcd.stop()
        tb.down()
    assert not [ns for ns in list_namespaces() if ns.startswith(tb.prefix + "-")]
    events = job.events()
    assert [e["gen"] for e in events if e["event"] == "plan"] == [0]  # no recovery
    # the coordinator fixed each change from a step; both ranks switched exactly there
    modes = [e for e in events if e["event"] == "step_mode"]
    on_avoid = next(e for e in modes if e["avoid_rails"] == ["rail0"])
    off_avoid = next(e for e in modes if e["avoid_rails"] == [] and e["from_step"] > on_avoid["from_step"])
    avoided, restored = _worker(events, "rail_avoided", 0), _worker(events, "rail_restored", 0)
    assert sorted(e["rank"] for e in avoided) == [0, 1] and {e["step"] for e in avoided} == {on_avoid["from_step"]}
    assert all(e["rails_used"] == [1] for e in avoided), avoided  # rail1 alone carried the all-reduce
    assert sorted(e["rank"] for e in restored) == [0, 1] and {e["step"] for e in restored} == {off_avoid["from_step"]}
    assert all(0 in e["rails_used"] for e in restored), restored  # back on rail0
    assert not [e for e in _worker(events, "rail_out") if on_avoid["from_step"] <= e["step"]], \
        "a hint is not a failure: no rail was given up"
    # degraded: every step snapshotted, persists at the points of half the interval in force
    deg_on = next(e for e in modes if e["degraded"])
    deg_off = next(e for e in modes if not e["degraded"] and e["from_step"] > deg_on["from_step"])
    asked, back = [e for e in events if e["event"] == "checkpoint_interval"]
    half = max(1, asked["every_steps"] // 2)
    lo, hi = max(deg_on["from_step"], asked["from_step"]), min(deg_off["from_step"], back["from_step"])
    assert hi - lo > 2 * half, (deg_on, deg_off, asked, back)
    persisted = {s for s in complete_steps(ckpt) if lo <= s < hi}
    assert persisted == {s for s in range(lo, hi) if (s - asked["from_step"]) % half == 0}, (persisted, asked)
    if half % 5:
        assert any(s % 5 for s in persisted)  # steps the job's own --snapshot-every 5 never snapshots
    assert (job.out / "final_checksum.txt").read_text() == (clean / "final_checksum.txt").read_text()
