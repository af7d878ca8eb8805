"""`seamguard fleet import` and `seamguard agent config`: parsers on documented formats, the merge's
decision table, and the whole path from a running slurmctld to a validated topology and agent configs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from seamguard.agent.config import parse_agent_config
from seamguard.agent.plan import agent_config_for, ring_strides
from seamguard.fleet import discover as d
from seamguard.fleet.topology import parse_topology

from conftest import subprocess_env

FIX = Path(__file__).parent / "fixtures"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seamguard", *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120, check=False)


@pytest.mark.parametrize("expr,names", [
    ("gpu[001-003,007],login1", ["gpu001", "gpu002", "gpu003", "gpu007", "login1"]),
    ("r[1-2]n[09-10]", ["r1n09", "r1n10", "r2n09", "r2n10"]),
    ("node7", ["node7"]),
    ("a[8-11]", ["a8", "a9", "a10", "a11"]),
])
def test_hostlists_expand_as_slurm_does(expr: str, names: list[str]) -> None:
    assert d.expand_hostlist(expr) == names


@pytest.mark.parametrize("bad", ["gpu[001-003", "gpu[a-b]", "n[0-9999999]"])
def test_a_bad_hostlist_is_one_error(bad: str) -> None:
    with pytest.raises(d.DiscoveryError, match="hostlist"):
        d.expand_hostlist(bad)


@pytest.mark.parametrize("gres,gpus", [("gpu:8", 8), ("gpu:h100:8(S:0-1)", 8), ("gpu:a100:4,gpu:h100:4", 8),
                                       ("gpu:8,mps:100", 8), ("mps:100", None), ("(null)", None), ("", None)])
def test_gres_gpu_count(gres: str, gpus: int | None) -> None:
    assert d.gres_gpus(gres) == gpus


def test_scontrol_multi_line_and_spaces_in_values() -> None:
    text = ("NodeName=gpu001 Arch=x86_64 CoresPerSocket=48\n   Gres=gpu:h100:8\n   OS=Linux 6.1.0-18-amd64 #1 SMP\n"
            "   AvailableFeatures=rack_r1,cdu_a\n   Reason=Not responding [slurm@2026-12-01T10:00:00]\n\n"
            "NodeName=gpu002 Gres=gpu:4 AvailableFeatures=(null)\n")
    recs = d.scontrol_records(text, "NodeName")
    assert [r["NodeName"] for r in recs] == ["gpu001", "gpu002"]
    assert recs[0]["OS"] == "Linux 6.1.0-18-amd64 #1 SMP" and recs[0]["Gres"] == "gpu:h100:8"
    s = d.parse_slurm_nodes(text)
    assert (s.nodes["gpu001"].gpus, s.nodes["gpu001"].rack, s.nodes["gpu001"].cooling_loop) == (8, "r1", "a")
    assert s.nodes["gpu002"].rack is None


def test_ibnetdiscover_leaves_spines_rails_and_unnamed_hcas() -> None:
    s = d.parse_ibnetdiscover((FIX / "ibnetdiscover.txt").read_text())
    assert s.switches == {"spine-0": "spine", "leaf-r0": "leaf", "leaf-r1": "leaf"}
    assert s.uplinks == {("leaf-r0", "spine-0"), ("leaf-r1", "spine-0")}
    assert s.nodes["gpu002"].nics == {"gpu002/mlx5_0": (0, "leaf-r0"), "gpu002/mlx5_1": (1, "leaf-r1")}
    assert len(s.problems) == 1 and "describes no host" not in s.problems[0] and "MT4123" in s.problems[0]


def test_topology_conf_three_tiers_reports_the_core() -> None:
    s = d.parse_slurm_topology("# tree\nSwitchName=l0 Nodes=n[0-1]\nSwitchName=l1 Nodes=n[2-3]\n"
                               "SwitchName=s0 Switches=l[0-1]\nSwitchName=core Switches=s0\n")
    assert s.switches == {"l0": "leaf", "l1": "leaf", "s0": "spine"}
    assert s.nodes["n3"].nics == {"n3/mlx5_0": (0, "l1")}
    assert [p for p in s.problems if "core" in p and "left out" in p]


# merge decision table: (base facts, source facts) -> placed?, the line it prints
@pytest.mark.parametrize("base,facts,opts,placed,line", [
    ({}, d.NodeFacts(gpus=8, rack="r0", cooling_loop="c", storage="s"), {"rated_flow_lpm": 100}, True, None),
    ({}, d.NodeFacts(gpus=8, cooling_loop="c", storage="s"), {"rated_flow_lpm": 100}, False, "no rack"),
    ({}, d.NodeFacts(gpus=8, rack="r0", storage="s"), {"rated_flow_lpm": 100}, False, "rack r0: no cooling loop"),
    ({}, d.NodeFacts(gpus=8, rack="r0", cooling_loop="c", storage="s"), {}, False, "cooling loop c: no rated flow"),
    ({}, d.NodeFacts(gpus=8, rack="r0", cooling_loop="c"), {"rated_flow_lpm": 100}, False, "no storage path"),
    ({}, d.NodeFacts(gpus=8, rack="r0", cooling_loop="c"), {"rated_flow_lpm": 100, "storage": "nfs"}, True, None),
    ({"cooling_loops": [{"name": "c", "rated_flow_lpm": 50}], "racks": [{"name": "r0", "cooling_loop": "c"}]},
     d.NodeFacts(gpus=8, rack="r0", storage="s"), {}, True, None),
    ({"nodes": [{"name": "n", "rack": "r1"}], "cooling_loops": [{"name": "c", "rated_flow_lpm": 50}],
      "racks": [{"name": "r1", "cooling_loop": "c"}]},
     d.NodeFacts(gpus=8, rack="r0", storage="s"), {}, True, None),
])
def test_merge_places_or_says_why(base, facts, opts, placed, line) -> None:
    s = d.Sighting("src", nodes={"n": facts})
    doc, lines = d.merge([s], base, d.MergeOptions(**opts))
    assert bool(doc["nodes"]) == placed
    if line:
        assert any(line in x for x in lines), lines
    else:
        assert lines == []
        parse_topology(doc, "merged")


def test_merge_reports_conflicts_and_keeps_the_first_source() -> None:
    a = d.Sighting("slurm", nodes={"n": d.NodeFacts(gpus=8, rack="r0", cooling_loop="c", storage="s")})
    b = d.Sighting("kubernetes", nodes={"n": d.NodeFacts(gpus=4, rack="r0", storage="s")})
    doc, lines = d.merge([a, b], None, d.MergeOptions(rated_flow_lpm=10))
    assert doc["nodes"][0]["gpus"] == 8
    assert lines == ["node n: gpus 8 (slurm) vs 4 (kubernetes); kept 8"]


def test_kubectl_nodes_fixture() -> None:
    s = d.parse_kubectl_nodes((FIX / "kubectl_nodes.json").read_text())
    assert s.nodes["gpu001"].gpus == 8 and s.nodes["gpu001"].rack == "r0"
    assert s.nodes["gpu003"].spare is True and s.nodes["cpu001"].gpus is None
    with pytest.raises(d.DiscoveryError, match="not JSON at line 1"):
        d.parse_kubectl_nodes("{nope")


def test_ring_peers_are_symmetric_and_bounded() -> None:
    for n in (2, 3, 7, 16, 33, 200):
        for deg in (1, 2, 8, 64):
            strides = ring_strides(n, deg)
            peers = {i: {(i + sg * s) % n for s in strides for sg in (1, -1)} - {i} for i in range(n)}
            assert all(len(p) <= deg for p in peers.values())
            assert all(i in peers[j] for i in peers for j in peers[i])
            if deg >= 2 or n % 2 == 0:
                assert all(peers.values())


def _fleet_with_two_rails(nodes: int):
    doc = {"version": 1, "cooling_loops": [{"name": "c", "rated_flow_lpm": 10}], "racks": [{"name": "r", "cooling_loop": "c"}],
           "switches": [{"name": f"leaf{r}{k}", "tier": "leaf"} for r in range(2) for k in range(2)]
           + [{"name": "spine", "tier": "spine"}],
           "uplinks": [{"leaf": f"leaf{r}{k}", "spine": "spine"} for r in range(2) for k in range(2)],
           "storage_paths": ["nfs"],
           "nodes": [{"name": f"n{i:02d}", "rack": "r", "storage": "nfs",
                      "nics": [{"rail": r, "leaf": f"leaf{r}{i % 2}"} for r in range(2)]} for i in range(nodes)]}
    return parse_topology(doc, "t")


def test_agent_configs_validate_and_probe_across_leaves() -> None:
    fleet = _fleet_with_two_rails(12)
    addr = {nic: f"10.{r}.0.{i}" for i, nic in enumerate(fleet.nic_names) for r in [int(fleet.nic_rail[i])]}
    probed = Counter()
    for node in fleet.node_names:
        cfg, notes = agent_config_for(fleet, node, addr, {"nfs": "/mnt/nfs"}, peers_per_rail=4)
        parse_agent_config(yaml.safe_dump(cfg), node)
        assert notes == []
        for p in cfg["fabric"]["peers"]:
            probed[p["nic"]] += 1
            assert not p["nic"].startswith(node + "/")
        me = fleet.node_names.index(node)
        assert any(int(p["nic"][1:3]) % 2 != me % 2 for p in cfg["fabric"]["peers"])  # a peer under another leaf
    assert set(probed) == set(fleet.nic_names)  # every NIC is someone's peer


def test_agent_config_notes_missing_addresses() -> None:
    fleet = _fleet_with_two_rails(4)
    cfg, notes = agent_config_for(fleet, "n00", {}, {}, 8)
    assert cfg["fabric"]["rails"] == [] and len(notes) == 3  # two rails, one storage
    with pytest.raises(KeyError, match="not in the topology"):
        agent_config_for(fleet, "nope", {}, {}, 8)


def test_cli_import_from_fixtures_then_agent_config(tmp_path: Path) -> None:
    out = tmp_path / "topo.yaml"
    r = run("fleet", "import", "--ibnetdiscover", str(FIX / "ibnetdiscover.txt"),
            "--kubectl-nodes", str(FIX / "kubectl_nodes.json"), "--rated-flow-lpm", "480", "--storage", "nfs",
            "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["node"] == 2  # gpu001, gpu002
    assert "node cpu001: no rack" in r.stderr and "rack r9: no cooling loop" in r.stderr
    strict = run("fleet", "import", "--kubectl-nodes", str(FIX / "kubectl_nodes.json"), "--storage", "nfs",
                 "--out", str(tmp_path / "strict.yaml"), "--strict")
    assert strict.returncode == 2 and not (tmp_path / "strict.yaml").exists()
    assert strict.stderr.strip().splitlines()[-1].startswith("error: --strict")
    addr = tmp_path / "addr.yaml"
    addr.write_text("gpu001/mlx5_0: 10.0.0.1\ngpu002/mlx5_0: 10.0.0.2\ngpu001/mlx5_1: 10.1.0.1\ngpu002/mlx5_1: 10.1.0.2\n")
    r = run("agent", "config", "--topology", str(out), "--node", "gpu001", "--addresses", str(addr),
            "--storage-mount", "nfs=/mnt/nfs")
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert {p["nic"] for p in cfg["fabric"]["peers"]} == {"gpu002/mlx5_0", "gpu002/mlx5_1"}
    bad = run("agent", "config", "--topology", str(out), "--node", "gpu009")
    assert bad.returncode == 2 and "gpu009" in bad.stderr and "Traceback" not in bad.stderr


def test_import_from_a_running_slurmctld(tmp_path: Path) -> None:
    """The real slurmctld: scontrol's nodes, partitions and topology/tree become a topology."""
    from seamguard.testbed.slurm import SlurmCluster

    nodes = [f"gpu{i:03d}" for i in range(1, 7)]
    opts = {n: f"Gres=gpu:h100:8 Features=rack_r{i // 3},cdu_cdu-a,storage_lustre-a" for i, n in enumerate(nodes)}
    opts["gpu006"] = "Gres=gpu:4 Features=cdu_cdu-a"  # no rack: reported, left out
    topo = "SwitchName=leaf0 Nodes=gpu[001-003]\nSwitchName=leaf1 Nodes=gpu[004-006]\nSwitchName=spine0 Switches=leaf[0-1]\n"
    with SlurmCluster(tmp_path / "slurm", nodes, node_options=opts, topology_conf=topo) as sc:
        out = tmp_path / "topo.yaml"
        r = subprocess.run([sys.executable, "-m", "seamguard", "fleet", "import", "--slurm", "--rated-flow-lpm", "480",
                            "--out", str(out), "--json"], capture_output=True, text=True, timeout=120, check=False,
                           env={**subprocess_env(), "SLURM_CONF": str(sc.conf)})
    assert r.returncode == 0, r.stderr
    assert "node gpu006: no rack" in r.stderr
    doc = yaml.safe_load(out.read_text())
    fleet = parse_topology(doc, str(out))
    assert fleet.node_names == nodes[:5] and len(fleet.gpu_names) == 40
    assert {s["name"]: s["tier"] for s in doc["switches"]} == {"leaf0": "leaf", "leaf1": "leaf", "spine0": "spine"}
    assert sorted((u["leaf"], u["spine"]) for u in doc["uplinks"]) == [("leaf0", "spine0"), ("leaf1", "spine0")]
    assert [n["rack"] for n in doc["nodes"]] == ["r0", "r0", "r0", "r1", "r1"]
