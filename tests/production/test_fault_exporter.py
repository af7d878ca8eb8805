"""testbed/fault_exporter.py's one fault, named on the command line: what it accepts and the
one-line error for what it does not."""

from __future__ import annotations

import pytest

from seamguard.fleet.model import Kind
from seamguard.fleet.topology import parse_topology
from seamguard.testbed.fault_exporter import fault_spec
from seamguard.twin.faults import FaultKind

TOPOLOGY = {
    "version": 1, "cooling_loops": [{"name": "cdu-a", "rated_flow_lpm": 480}],
    "racks": [{"name": "r0", "cooling_loop": "cdu-a"}],
    "switches": [{"name": "leaf0", "tier": "leaf"}, {"name": "spine0", "tier": "spine"}],
    "uplinks": [{"leaf": "leaf0", "spine": "spine0"}], "storage_paths": ["nfs"],
    "nodes": [{"name": f"gpu00{i}", "rack": "r0", "storage": "nfs", "gpus": 8,
               "nics": [{"rail": 0, "leaf": "leaf0"}]} for i in range(2)],
}


@pytest.fixture(scope="module")
def fleet():
    return parse_topology(TOPOLOGY, "test topology")


def test_a_fault_lands_on_the_named_entity(fleet) -> None:
    gpu = fleet.names(Kind.GPU)[11]
    spec = fault_spec(fleet, f"gpu_ecc_escalation:{gpu}", 7.0, 3.0, 30.0)
    assert (spec.kind, spec.index, spec.start_s, spec.magnitude, spec.ramp_s) == (
        FaultKind.GPU_ECC_ESCALATION, 11, 7.0, 3.0, 30.0)
    assert fault_spec(fleet, f"gpu_fail_slow:{gpu}", 0.0, None, 30.0).magnitude == 1.0  # the kind's default


@pytest.mark.parametrize("arg,says", [
    ("gpu_ecc_escalation", "expected KIND:ENTITY"),
    ("gpu_melted:gpu000/gpu0", "unknown kind 'gpu_melted'"),
    ("gpu_ecc_escalation:gpu999/gpu0", "no gpu 'gpu999/gpu0'"),
    ("cooling_flow_loss:gpu000/gpu0", "no cooling_loop"),
])
def test_a_bad_fault_is_one_line(fleet, arg: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as e:
        fault_spec(fleet, arg, 0.0, None, 30.0)
    assert "\n" not in str(e.value)
