"""Fleet model, generator and the YAML topology format (including its error messages)."""

from dataclasses import replace

import numpy as np
import pytest
import yaml

from seamguard.app.config import load_topology
from seamguard.fleet import FleetShape, Kind, TopologyError, fleet_to_topology, generate_fleet


def test_generator_shapes_and_containment():
    f = generate_fleet(FleetShape(gpus=1024), seed=3)
    s = f.summary()
    assert s["gpu"] == 1024 and s["node"] == 128 and s["nic"] == 128 * 8
    # containment: GPU -> node -> rack -> loop, every index in range
    assert f.gpu_node.max() < s["node"] and f.node_rack.max() < s["rack"] and f.rack_loop.max() < s["cooling_loop"]
    # fabric: each NIC has exactly one NIC-leaf link to a leaf switch; uplinks go leaf -> spine
    assert (np.bincount(f.link_nic[f.link_nic >= 0], minlength=s["nic"]) == 1).all()
    assert (f.switch_tier[f.nic_leaf] == 0).all()
    up = f.link_nic < 0
    assert (f.switch_tier[f.link_spine[up]] == 1).all()
    # spares hold no job; jobs are placed on whole nodes
    assert (f.node_job[f.node_spare] == -1).all()
    assert f.job_gpu_count.sum() == (f.gpu_job >= 0).sum()


def test_generator_scales_to_100k():
    f = generate_fleet(FleetShape(gpus=100_000))
    assert f.count(Kind.GPU) == 100_000 and f.count(Kind.NIC) == 100_000


def test_topology_round_trip(tmp_path):
    f = generate_fleet(FleetShape(gpus=256), seed=1)
    p = tmp_path / "topo.yaml"
    p.write_text(yaml.safe_dump(fleet_to_topology(f)))
    g = load_topology(p)
    assert g.summary() == f.summary()
    for a in ("gpu_node", "node_rack", "rack_loop", "gpu_job", "link_leaf", "link_spine", "nic_rail", "node_storage"):
        assert np.array_equal(getattr(g, a), getattr(f, a)), a
    assert g.node_names == f.node_names and g.link_names == f.link_names


def _doc():
    return {
        "version": 1,
        "cooling_loops": [{"name": "cdu-a", "rated_flow_lpm": 400}],
        "racks": [{"name": "r1", "cooling_loop": "cdu-a"}],
        "switches": [{"name": "leaf1", "tier": "leaf"}, {"name": "spine1", "tier": "spine"}],
        "uplinks": [{"leaf": "leaf1", "spine": "spine1"}],
        "storage_paths": ["nfs"],
        "nodes": [{"name": "n1", "rack": "r1", "storage": "nfs", "gpus": 8,
                   "nics": [{"rail": 0, "leaf": "leaf1"}]},
                  {"name": "n2", "rack": "r1", "storage": "nfs", "spare": True}],
        "jobs": [{"name": "train", "class": "high_sync_training", "criticality": 3, "nodes": ["n1"]}],
    }


def _err(tmp_path, doc) -> str:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    with pytest.raises(TopologyError) as e:
        load_topology(p)
    return str(e.value)


def test_valid_small_topology(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text(yaml.safe_dump(_doc()))
    f = load_topology(p)
    assert f.nic_names == ["n1/mlx5_0"] and f.job_gpu_count.tolist() == [8]


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d["racks"][0].update(cooling_loop="cdu-z"), "racks[0].cooling_loop: unknown cooling loop 'cdu-z'"),
    (lambda d: d["nodes"][0].update(gpus=-1), "nodes[0].gpus: Input should be greater than or equal to 0"),
    (lambda d: d["nodes"][1].update(name="n1"), "nodes[1].name: duplicate name 'n1'"),
    (lambda d: d["jobs"][0].update({"class": "training"}), "jobs[0].class: Input should be"),
    (lambda d: d["jobs"][0]["nodes"].append("n2"), "jobs[0].nodes[1]: node 'n2' is a spare"),
    (lambda d: d["nodes"][0]["nics"][0].update(leaf="spine1"), "is a spine; expected a leaf switch"),
    (lambda d: d.update(version=2), "version: unsupported topology version 2"),
    (lambda d: d.pop("version"), "version: missing"),
    (lambda d: d["nodes"][0].update(colour="red"), "nodes[0].colour: Extra inputs are not permitted"),
    (lambda d: d.pop("racks"), "racks: Field required"),
])
def test_validation_names_file_field_and_expectation(tmp_path, mutate, expect):
    d = _doc()
    mutate(d)
    msg = _err(tmp_path, d)
    assert "bad.yaml" in msg and expect in msg, msg


def test_yaml_syntax_error_has_line(tmp_path):
    msg = _err(tmp_path, "version: 1\nracks: [\n  - name: x\n")
    assert "bad.yaml: not valid YAML at line" in msg


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TopologyError, match="cannot read topology file"):
        load_topology(tmp_path / "nope.yaml")


def test_index_of_names_kind():
    f = generate_fleet(FleetShape(gpus=64))
    assert f.index_of(Kind.NODE, f.node_names[3]) == 3
    with pytest.raises(KeyError, match="no node named 'zzz'"):
        f.index_of(Kind.NODE, "zzz")


def test_index_table_is_every_name_read_only_and_per_fleet():
    f = generate_fleet(FleetShape(gpus=64))
    table = f.index_table(Kind.NODE)
    assert dict(table) == {n: i for i, n in enumerate(f.node_names)}
    assert f.index_table(Kind.NODE) is table  # built once per Fleet
    with pytest.raises(TypeError):
        table["zzz"] = 0  # type: ignore[index]
    moved = replace(f, node_names=[n + "-b" for n in f.node_names], _index={})
    assert moved.index_of(Kind.NODE, f.node_names[0] + "-b") == 0
