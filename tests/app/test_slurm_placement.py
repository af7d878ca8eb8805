"""Where the topology's jobs run, and their criticality, from squeue (app/slurm_placement.py).

Pure tables for the parser and the placement; then the live path against a real Slurm
cluster (slurmctld + slurmd per namespace): jobs submitted under topology names, with a
criticality in the comment, land on the nodes Slurm gave them.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from seamguard.app.slurm_placement import (
    SlurmPlacement,
    SlurmPlacementConfig,
    SqueueJob,
    criticality_of,
    parse_squeue,
    place,
)
from seamguard.fleet import FleetShape, generate_fleet

TOPO = generate_fleet(FleetShape(gpus=128, racks_per_loop=2), seed=3)  # 16 nodes gpu000..gpu015, 5 jobs
J0, J1 = TOPO.job_names[:2]
CFG = SlurmPlacementConfig(qos_criticality={"high": 5.0, "scavenger": 0.1})


def test_parse_squeue_rows_and_problems():
    text = (f"101|{J0}|RUNNING|high|4294|criticality=2.5; owner=llm|gpu[003-004]\n"
            "102|other|PENDING|normal|10||(null)\n"
            "103|x|RUNNING|normal|notanumber||gpu001\n"
            "garbage\n"
            f"104|{J1}|RUNNING|normal|1|a|b|c|gpu009\n")
    jobs, problems = parse_squeue(text)
    assert [j.job_id for j in jobs] == ["101", "102", "104"]
    assert jobs[0] == SqueueJob("101", J0, "RUNNING", "high", 4294.0, "criticality=2.5; owner=llm", "gpu[003-004]")
    assert jobs[2].comment == "a|b|c" and jobs[2].nodes == "gpu009"  # a comment may hold the separator
    assert problems == ["squeue line 3: priority 'notanumber' is not a number",
                        "squeue line 4: expected 7 '|'-separated fields, got 1"]


@pytest.mark.parametrize("comment, qos, want", [
    ("criticality=2.5", "normal", 2.5),
    ("owner=a, criticality=0.3", "high", 0.3),   # the comment wins over the QOS
    ("xcriticality=9", "high", 5.0),             # not the key: the QOS's
    ("", "scavenger", 0.1),
    ("", "normal", 1.7),                         # neither: the topology's
])
def test_criticality_from_comment_then_qos_then_topology(comment, qos, want):
    job = SqueueJob("1", J0, "RUNNING", qos, 0.0, comment, "")
    assert criticality_of(job, CFG, 1.7) == want


def test_place_moves_topology_jobs_and_leaves_the_rest_idle():
    jobs = [SqueueJob("7", J0, "RUNNING", "high", 1.0, "", "A"),
            SqueueJob("8", J0, "RUNNING", "normal", 1.0, "", "B"),      # a second job with the name
            SqueueJob("9", "not-ours", "RUNNING", "normal", 1.0, "", "C"),
            SqueueJob("10", J1, "PENDING", "normal", 1.0, "", "")]
    nodes = {"A": ["gpu010", "gpu011", "nope"], "B": ["gpu012"], "C": ["gpu001"]}
    fleet, problems = place(TOPO, jobs, nodes, CFG)
    assert fleet.summary() == TOPO.summary()  # the same entities: the controller takes it as a new placement
    assert list(np.flatnonzero(fleet.node_job == 0)) == [10, 11]
    assert not (fleet.node_job == 1).any()  # J1 is pending: it holds no node
    assert fleet.job_criticality[0] == 5.0 and fleet.job_criticality[1] == TOPO.job_criticality[1]
    assert problems == [f"job {J0} (7): node 'nope' is not in the topology",
                        f"job name {J0!r} is used by Slurm jobs 7 and 8: 8 ignored"]


def test_a_squeue_outage_keeps_the_last_placement(tmp_path):
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\necho '5|{J0}|RUNNING|high|1|criticality=4|gpu002'\n")
    squeue.chmod(0o755)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho $3\n")  # show hostnames <list>: a single node
    scontrol.chmod(0o755)
    t = [0.0]
    sp = SlurmPlacement(SlurmPlacementConfig(squeue=str(squeue), scontrol=str(scontrol), refresh_s=10),
                        clock=lambda: t[0])
    f1 = sp.fleet(TOPO)
    assert list(np.flatnonzero(f1.node_job == 0)) == [2] and f1.job_criticality[0] == 4.0
    squeue.write_text("#!/bin/sh\nexit 1\n")
    t[0] = 5.0
    assert sp.fleet(TOPO) is f1  # not yet due
    t[0] = 11.0
    assert sp.fleet(TOPO) is f1  # squeue fails: the last placement stays


@pytest.mark.slow
def test_jobs_placed_by_a_real_slurm_cluster(tmp_path):
    from seamguard.testbed.slurm import SlurmCluster

    nodes = ["gpu001", "gpu002", "gpu003"]
    with SlurmCluster(tmp_path / "slurm", nodes, slurmd=True) as sc:
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/sh\nwhile true; do sleep 0.2; done\n")
        script.chmod(0o755)
        sc.sbatch(script, f"--job-name={J0}", "--nodes=2", "--comment=criticality=2.5", "--output=/dev/null")
        sc.sbatch(script, "--job-name=someone-else", "--nodes=1", "--output=/dev/null")
        sp = SlurmPlacement(SlurmPlacementConfig(squeue=sc.bin("squeue"), scontrol=sc.bin("scontrol"),
                                                 refresh_s=0.1))
        deadline = time.monotonic() + 60
        fleet = TOPO
        while time.monotonic() < deadline:
            fleet = sp.fleet(TOPO)
            if (fleet.node_job == 0).sum() == 2:
                break
            time.sleep(0.3)
        placed = {TOPO.node_names[i] for i in np.flatnonzero(fleet.node_job == 0)}
        assert len(placed) == 2 and placed <= set(nodes), placed
        assert fleet.job_criticality[0] == 2.5
        assert not (fleet.node_job == 1).any()
        sc.run("scancel", "--user=root")


def test_the_live_source_takes_its_placement_from_slurm(tmp_path):
    import yaml

    from seamguard.app.config import load_run_config
    from seamguard.app.sources import PrometheusLiveSource
    from seamguard.fleet.topology import fleet_to_topology

    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet_to_topology(TOPO)))
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\necho '5|{J1}|RUNNING|normal|1|criticality=0.5|gpu014'\n")
    squeue.chmod(0o755)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho $3\n")
    scontrol.chmod(0o755)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "version": 1, "topology": "fleet.yaml", "prometheus": {"url": "http://127.0.0.1:9"},
        "slurm_placement": {"squeue": str(squeue), "scontrol": str(scontrol)}}))
    src = PrometheusLiveSource(load_run_config(tmp_path / "run.yaml"))
    try:
        fleet = src.placement()
    finally:
        src.close()
    assert list(np.flatnonzero(fleet.node_job == 1)) == [14] and fleet.job_criticality[1] == 0.5
    assert not (fleet.node_job == 0).any()  # not in squeue: not running
