"""The seam drill's job under Slurm, moved off a cooling loop the way the controller does it.

The drill (benchmarks/seam_drill.py) moves its job only when the planner decides to, which
depends on what the earlier faults left behind; this runs the move itself, deterministically,
on the same pieces: the drill's batch and per-node scripts (`job_scripts`), a real Slurm
cluster with a slurmd in each of three host namespaces, a real two-node `seamguard launch`
job, and the Slurm actuator applying `move_job:drill@cdu-a` (h0's loop). Slurm must requeue
the job, keep it off h0 and start it on h1 and h2, and the new run must resume from the
checkpoint the first one persisted.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from seamguard.act.slurm import SlurmActuator, SlurmConfig
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.runtime.manifest import complete_steps
from seamguard.testbed.drill import Layout, job_scripts, kill_namespace
from seamguard.testbed.net import SRC, Testbed, TestbedSpec
from seamguard.testbed.slurm import SlurmCluster

ROOT = Path(__file__).resolve().parents[1]
LAY = Layout()

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ip netns)")]


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _wait(what: str, cond, timeout_s: float, why=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout_s:.0f} s; {why()}")


def test_a_moved_drill_job_restarts_off_the_loop_and_resumes_from_its_checkpoint(tmp_path):
    work = tmp_path / "job"
    work.mkdir()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tb = Testbed(TestbedSpec(hosts=LAY.hosts, rails=LAY.rails)).up()
    try:
        with SlurmCluster(tmp_path / "slurm", [LAY.node(h) for h in range(LAY.hosts)], slurmd=True, testbed=tb,
                          controller_host=LAY.control_host, node_hosts=list(range(LAY.hosts)),
                          controller_is_node=True, cred_expire_s=5, kill_wait_s=5) as sc:
            launch = ["--nproc", "1", "--spares", "1", "--run-id", LAY.job, "--events-file", str(work / "events.jsonl"),
                      "--checkpoint-dir", str(ckpt), "--persist-every", "20", "--hang-timeout-s", "5"]
            train = [str(ROOT / "examples" / "train_ddp.py"), "--out", str(work), "--steps", "1000000", "--hidden",
                     "32", "--layers", "2", "--dataset", "512", "--step-sleep-s", "0.05"]
            batch, node = job_scripts(tb, LAY, sys.executable, launch, train, SRC, tmp_path / "node.sh")
            for name, text in (("job.sbatch", batch), ("node.sh", node)):
                (tmp_path / name).write_text(text)
                (tmp_path / name).chmod(0o755)
            out = tmp_path / "slurm-job.out"
            jid = sc.sbatch(tmp_path / "job.sbatch", f"--job-name={LAY.job}", "--nodes=2", "--nodelist=h0,h1",
                            "--requeue", f"--output={out}", "--open-mode=append")

            def persisted() -> int:
                return max(complete_steps(ckpt), default=-1)

            def log_tail() -> str:
                return (out.read_text()[-1500:] if out.exists() else "") + str(sc.job(jid))

            _wait("a first checkpoint persisted", lambda: persisted() >= 20, 180, log_tail)
            first = _events(work / "events.jsonl")
            assert sc.job(jid).get("NodeList") == "h[0-1]"

            act = SlurmActuator(SlurmConfig(scontrol=sc.bin("scontrol"), sinfo=sc.bin("sinfo"), squeue=sc.bin("squeue"),
                                            scancel=sc.bin("scancel"), timeout_s=20, checkpoint_grace_s=0))
            key = action_key(Verb.MOVE_JOB, LAY.job, "cdu-a")
            res = act.apply(Action(key=key, verb=Verb.MOVE_JOB, target=LAY.job, target_kind="job",
                                   params=(("domain", "cdu-a"), ("domain_kind", "cooling_loop"), ("nodes", "h0")),
                                   reason="seamguard: cdu-a quarantine", cause="cdu-a"))
            assert res.ok, res.detail
            at_move = persisted()

            def restarted() -> bool:
                j = sc.job(jid)
                return j.get("JobState") == "RUNNING" and j.get("Restarts") == "1" and j.get("NodeList") == "h[1-2]"

            _wait("the job running again on h1 and h2", restarted, 120, log_tail)
            n_first = len(first)

            def resumed_from_storage() -> list[dict]:
                later = _events(work / "events.jsonl")[n_first:]
                return [e for e in later if e.get("event") == "resumed" and int(e.get("step") or 0) > 0]

            _wait("the new run resumed from a persisted step", lambda: bool(resumed_from_storage()), 180, log_tail)
            step = int(resumed_from_storage()[0]["step"])
            assert 20 <= step and step % 20 == 0 and step >= at_move - 20, (step, at_move)
            assert key in act.observe()  # in effect: the job carries the token and runs off h0
            j = sc.job(jid)
            assert j["ExcNodeList"] == "h0" and "h0" not in j["NodeList"]
            assert [line for line in out.read_text().splitlines() if line.startswith("drill job ")] == [
                f"drill job {jid} start 0 on h[0-1]", f"drill job {jid} start 1 on h[1-2]"]
    finally:
        for h in range(LAY.hosts):
            kill_namespace(tb, h)
        tb.down()
