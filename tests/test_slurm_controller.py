"""End to end on a real Slurm cluster: a cooling loop loses flow in the twin, the controller
(enforce mode, breaker, ledger) moves the critical job off it, sheds the low-criticality one
and keeps new work off the loop's nodes; slurmd really restarts the jobs elsewhere.

Telemetry comes from the twin (there is no real CDU); the topology's node and job names are
the Slurm cluster's, so every decision lands on real Slurm objects.
"""

from __future__ import annotations

import time

import pytest

from seamguard import hintauth
from seamguard.act.runtime import RuntimeHintActuator
from seamguard.act.slurm import SlurmActuator, SlurmConfig
from seamguard.control import Controller
from seamguard.decide.policy import default_policy
from seamguard.fleet.topology import parse_topology
from seamguard.ledger.sqlite import Ledger
from seamguard.observe.frame import make_frame
from seamguard.testbed.slurm import SlurmCluster
from seamguard.twin.faults import FaultKind, FaultSpec
from seamguard.twin.telemetry import Twin, TwinConfig

pytestmark = pytest.mark.slow


def _nodes(names: list[str], rack: str, leaf: str) -> list[dict]:
    return [{"name": n, "rack": rack, "storage": "nfs", "gpus": 8, "nics": [{"rail": 0, "leaf": leaf}]}
            for n in names]


TOPOLOGY = {
    "version": 1,
    "cooling_loops": [{"name": "cdu-a", "rated_flow_lpm": 480}, {"name": "cdu-b", "rated_flow_lpm": 480}],
    "racks": [{"name": "r1", "cooling_loop": "cdu-a"}, {"name": "r2", "cooling_loop": "cdu-b"}],
    "switches": [{"name": "leaf-a", "tier": "leaf"}, {"name": "leaf-b", "tier": "leaf"},
                 {"name": "spine", "tier": "spine"}],
    "uplinks": [{"leaf": "leaf-a", "spine": "spine"}, {"leaf": "leaf-b", "spine": "spine"}],
    "storage_paths": ["nfs"],
    "nodes": _nodes(["n1", "n2"], "r1", "leaf-a") + _nodes(["n3", "n4"], "r2", "leaf-b"),
    "jobs": [{"name": "pretrain", "class": "high_sync_training", "criticality": 3, "nodes": ["n1"]},
             {"name": "sweep", "class": "async_batch_inference", "criticality": 0.3, "nodes": ["n2"]}],
}
FLEET = parse_topology(TOPOLOGY, "test topology")
# the bounds under test elsewhere; here a two-node loop must be allowed to move as a whole
POLICY = default_policy(mode="enforce", breaker={
    "max_fleet_fraction": 1.0, "max_loop_fraction": 1.0, "max_in_effect_fleet_fraction": 1.0,
    "max_in_effect_loop_fraction": 1.0, "max_in_effect_rack_fraction": 1.0, "max_in_effect_leaf_fraction": 1.0,
    "max_domain_fraction": 1.0})


def wait_for(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_flow_loss_moves_sheds_and_keeps_new_work_off_through_the_controller(tmp_path) -> None:
    with SlurmCluster(tmp_path / "slurm", FLEET.node_names, slurmd=True) as sc:
        script = tmp_path / "job.sh"
        script.write_text(f"#!/bin/sh\necho $SLURMD_NODENAME >> {tmp_path}/starts.$SLURM_JOB_NAME\n"
                          "while true; do sleep 0.2; done\n")
        ids = {name: sc.sbatch(script, f"--job-name={name}", "-o", "/dev/null", f"--nodelist={node}")
               for name, node in (("pretrain", "n1"), ("sweep", "n2"))}
        deadline = time.monotonic() + 20
        while any(sc.job(i).get("JobState") != "RUNNING" for i in ids.values()):
            assert time.monotonic() < deadline, "jobs did not start"
            time.sleep(0.25)

        slurm = SlurmActuator(SlurmConfig(scontrol=sc.bin("scontrol"), sinfo=sc.bin("sinfo"),
                                          squeue=sc.bin("squeue"), scancel=sc.bin("scancel"), timeout_s=20,
                                          checkpoint_grace_s=0.0))
        (tmp_path / "hints").mkdir()
        hintauth.create_key(hintauth.key_file_for(tmp_path / "hints"))  # as the job's launcher does
        hints = RuntimeHintActuator({"pretrain": tmp_path / "hints"})
        ledger = Ledger(tmp_path / "ledger.db")
        try:
            ctl = Controller(FLEET, POLICY, [hints, slurm], ledger, tick_s=5.0, mode="enforce")
            twin = Twin(FLEET, [FaultSpec(FaultKind.COOLING_FLOW_LOSS, 0, 30.0, magnitude=0.1, ramp_s=120.0)],
                        TwinConfig(tick_s=5.0), 0)
            for _ in range(16):
                f = twin.step()
                rep = ctl.tick(make_frame(FLEET, f.t_s, f.values))
                assert not rep.error, rep.error
            held = slurm.observe()
            assert {"move_job:pretrain@cdu-a", "move_job:sweep@cdu-a"} <= held
            assert {"label_degraded:n1=none", "label_degraded:n2=none"} <= held, (held, sorted(rep.decisions.desired), [(c.key, c.status, c.detail) for c in rep.changes])
            rows = ledger.db.execute("SELECT key, status, detail FROM actions WHERE verb='move_job' AND op='apply' "
                                     "ORDER BY id").fetchall()
            assert [(k, s) for k, s, _ in rows] == [("move_job:pretrain@cdu-a", "done"),
                                                    ("move_job:sweep@cdu-a", "done")]
            assert all("requeued from n" in d for _, _, d in rows)
            first = ledger.db.execute("SELECT MIN(id) FROM actions WHERE verb='checkpoint_now'").fetchone()[0]
            assert first is not None and first < ledger.db.execute(
                "SELECT MIN(id) FROM actions WHERE verb='move_job'").fetchone()[0]  # protect, then disrupt
            assert (tmp_path / "hints" / "checkpoint_now").exists()
        finally:
            ledger.close()

        def where(name: str) -> str:
            j = sc.job(ids[name])
            return j.get("NodeList", "") if j.get("JobState") == "RUNNING" else ""

        deadline = time.monotonic() + 40
        while not (where("pretrain") and where("sweep")):
            assert time.monotonic() < deadline, f"jobs did not restart: {sc.job(ids['pretrain'])}"
            time.sleep(0.5)
        assert {where("pretrain"), where("sweep")} == {"n3", "n4"}  # off cdu-a, really running again
        starts = wait_for(lambda: len((tmp_path / "starts.pretrain").read_text().split()) == 2, 10)
        assert starts and (tmp_path / "starts.pretrain").read_text().split() == ["n1", where("pretrain")]
        out = sc.scontrol("show", "reservation", "-o").stdout
        assert "ReservationName=sg_nonew_n1" in out and "ReservationName=sg_nonew_n2" in out
