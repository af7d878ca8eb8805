"""Design envelopes and NVLink domains in the topology (docs/topology.md): defaults, round trip, one-line errors."""

import numpy as np
import pytest

from seamguard.fleet import FleetShape, generate_fleet
from seamguard.fleet.model import DEFAULT_STORAGE_BUDGET_MS, DEFAULT_SUPPLY_TEMP_MAX_C
from seamguard.fleet.topology import TopologyError, fleet_to_topology, parse_topology

DOC = fleet_to_topology(generate_fleet(FleetShape(gpus=64, nodes_per_storage_path=2), seed=1))


def _with(**edits) -> dict:
    d = {k: (list(v) if isinstance(v, list) else v) for k, v in DOC.items()}
    for key, fn in edits.items():
        d[key] = fn(d[key])
    return d


def test_defaults_when_the_file_says_nothing():
    f = parse_topology(DOC)
    assert (f.supply_temp_max_c == DEFAULT_SUPPLY_TEMP_MAX_C).all()
    assert (f.storage_budget == DEFAULT_STORAGE_BUDGET_MS).all()
    assert (f.node_domain == np.arange(len(f.node_names))).all()  # each node its own NVLink domain
    assert "supply_temp_max_c" not in DOC["cooling_loops"][0] and isinstance(DOC["storage_paths"][0], str)


def test_per_loop_per_path_per_node_values_round_trip():
    d = _with(defaults=lambda x: {**x, "supply_temp_max_c": 40.0},
              cooling_loops=lambda ls: [{**ls[0], "supply_temp_max_c": 32.0}] + ls[1:],
              storage_paths=lambda ps: [{"name": ps[0], "budget_ms": 250.0}] + ps[1:],
              nodes=lambda ns: [{**n, "nvlink_domain": "nvl-a"} if i in (1, 2) else n for i, n in enumerate(ns)])
    f = parse_topology(d)
    assert f.supply_temp_max_c.tolist() == [32.0]
    assert f.storage_budget.tolist() == [250.0, 100.0, 100.0, 100.0]
    dom = f.node_domain
    assert dom[1] == dom[2] and len(set(dom.tolist())) == len(f.node_names) - 1
    g = parse_topology(fleet_to_topology(f))
    assert g.supply_temp_max_c.tolist() == [32.0] and g.storage_budget.tolist() == f.storage_budget.tolist()
    assert g.node_domain[1] == g.node_domain[2] and len(set(g.node_domain.tolist())) == len(g.node_names) - 1


@pytest.mark.parametrize("edit,where", [
    ({"cooling_loops": lambda ls: [{**ls[0], "supply_temp_max_c": -5}]}, "cooling_loops[0].supply_temp_max_c"),
    ({"cooling_loops": lambda ls: [{**ls[0], "supply_temp_max_c": "warm"}]}, "cooling_loops[0].supply_temp_max_c"),
    ({"storage_paths": lambda ps: [ps[0], {"name": ps[1], "budget_ms": 0}] + ps[2:]}, "storage_paths[1].budget_ms"),
    ({"storage_paths": lambda ps: [{"name": ps[0], "budget": 3}] + ps[1:]}, "storage_paths[0].budget"),
    ({"nodes": lambda ns: [{**ns[0], "nvlink_domain": ""}] + ns[1:]}, "nodes[0].nvlink_domain"),
    ({"defaults": lambda x: {**x, "storage_budget_ms": -1}}, "defaults.storage_budget_ms"),
])
def test_a_bad_value_names_its_field(edit, where):
    with pytest.raises(TopologyError) as e:
        parse_topology(_with(**edit), "topo.yaml")
    assert where in str(e.value) and str(e.value).startswith("topo.yaml:")
