"""A topology imported from Slurm alone (`seamguard fleet import --slurm` with no base) names no
jobs; the controller must still start on it and act (docs/production.md, step 2)."""

from __future__ import annotations

from seamguard.act.log import LogActuator
from seamguard.assess.propagation import all_dependents
from seamguard.control import Controller
from seamguard.decide.policy import default_policy
from seamguard.fleet.model import Kind
from seamguard.fleet.topology import parse_topology
from seamguard.ledger.sqlite import Ledger
from seamguard.observe.frame import make_frame
from seamguard.testbed.fault_exporter import fault_spec
from seamguard.twin.telemetry import Twin, TwinConfig

TOPOLOGY = {
    "version": 1, "cooling_loops": [{"name": "cdu-a", "rated_flow_lpm": 480}],
    "racks": [{"name": "r0", "cooling_loop": "cdu-a"}],
    "switches": [{"name": "leaf0", "tier": "leaf"}, {"name": "spine0", "tier": "spine"}],
    "uplinks": [{"leaf": "leaf0", "spine": "spine0"}], "storage_paths": ["nfs"],
    "nodes": [{"name": f"gpu00{i}", "rack": "r0", "storage": "nfs", "gpus": 8,
               "nics": [{"rail": 0, "leaf": "leaf0"}]} for i in range(4)],
}


def test_with_no_jobs_every_gpu_waits_only_on_itself() -> None:
    fleet = parse_topology(TOPOLOGY, "jobless")
    dep = all_dependents(fleet)
    assert dep[Kind.NODE].tolist() == [8.0] * 4
    assert dep[Kind.COOLING_LOOP].tolist() == [32.0]


def test_the_controller_drains_a_failing_node_of_a_jobless_fleet(tmp_path) -> None:
    fleet = parse_topology(TOPOLOGY, "jobless")
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        ctl = Controller(fleet, default_policy(mode="enforce"), [LogActuator(tmp_path / "actions.jsonl")], ledger,
                         tick_s=1.0, mode="enforce")
        twin = Twin(fleet, [fault_spec(fleet, "gpu_ecc_escalation:gpu002/gpu2", 5.0, 2.0, 60.0)],
                    TwinConfig(tick_s=1.0), 0)
        applied = set()
        for _ in range(30):
            f = twin.step()
            rep = ctl.tick(make_frame(fleet, f.t_s, f.values))
            assert not rep.error, rep.error
            applied |= {c.key for c in rep.changes if c.status == "done"}
    finally:
        ledger.close()
    assert applied == {"drain:gpu002"}
