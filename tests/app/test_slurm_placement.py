"""Where the topology's jobs run, and their criticality, from squeue (app/slurm_placement.py).

Pure tables for the parser and the placement; then the live path against a real Slurm
cluster (slurmctld + slurmd per namespace): jobs submitted under topology names, with a
criticality in the comment, land on the nodes Slurm gave them.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import numpy as np
import pytest

from seamguard.app.slurm_placement import (
    SlurmPlacement,
    SlurmPlacementConfig,
    SqueueJob,
    criticality_of,
    deadline_of,
    parse_squeue,
    parse_times,
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


# ---- deadlines (decide/slip.py's input) ----------------------------------------------------------

def test_parse_times_reads_deadline_and_end_time_as_local_time():
    text = ("  101   2026-12-01T18:00:00    2026-12-01T12:30:00  \n"
            "102 N/A Unknown\n"
            "garbage\n"
            "103|x|RUNNING|normal|1||gpu001\n")  # a row of the other format: skipped
    times = parse_times(text)
    assert sorted(times) == ["101", "102"]
    assert times["101"][0] == datetime(2026, 12, 1, 18, 0).timestamp()  # naive: local, as squeue printed it
    assert times["101"][1] == datetime(2026, 12, 1, 12, 30).timestamp()
    assert all(np.isnan(v) for v in times["102"])


JAN15_8Z = datetime(2027, 1, 15, 8, tzinfo=timezone.utc).timestamp()
D0 = 1_800_000_000.0  # Slurm's Deadline of the job
END = 1_700_000_000.0  # its EndTime


@pytest.mark.parametrize("comment, times, time_limit, want, problem", [
    ("deadline=2027-01-15T08:00:00Z", (D0, END), False, JAN15_8Z, ""),             # the comment wins
    ("owner=a; deadline=2027-01-15T10:00:00+02:00", None, False, JAN15_8Z, ""),
    ("", (D0, END), False, D0, ""),                     # sbatch --deadline
    ("", (float("nan"), END), False, 5.0, ""),          # no deadline: the run config's (5.0 here)
    ("", (float("nan"), END), True, END, ""),           # time_limit_as_deadline: the end of the time limit
    ("deadline=tomorrow", (D0, END), False, D0, "is not an ISO 8601 time"),   # bad token: reported, Slurm's used
    ("deadline=2027-01-15T08:00:00", None, False, 5.0, "has no timezone"),
])
def test_deadline_from_comment_then_slurm_then_time_limit_then_config(comment, times, time_limit, want, problem):
    cfg = SlurmPlacementConfig(time_limit_as_deadline=time_limit)
    got, why = deadline_of(SqueueJob("42", J0, "RUNNING", "normal", 0.0, comment, ""), times, cfg, 5.0)
    assert got == want
    assert (problem in why) and (bool(why) == bool(problem))
    if problem:
        assert why.startswith(f"job {J0} (42): comment deadline: ")


def test_place_sets_deadlines_and_reports_a_bad_one():
    jobs = [SqueueJob("7", J0, "RUNNING", "high", 1.0, "deadline=2027-01-15T08:00:00Z", "A"),
            SqueueJob("8", J1, "RUNNING", "normal", 1.0, "deadline=soon", "B")]
    fleet, problems = place(TOPO, jobs, {"A": ["gpu010"], "B": ["gpu012"]}, CFG, {"8": (D0, END)})
    dl, _, _ = fleet.job_schedule()
    assert dl[0] == JAN15_8Z
    assert dl[1] == D0 and np.isnan(dl[2:]).all()
    assert problems == [f"job {J1} (8): comment deadline: 'soon' is not an ISO 8601 time "
                        "(e.g. 2026-12-01T18:00:00+00:00); its deadline ignored"]


def test_a_squeue_that_cannot_print_deadlines_costs_the_deadlines_not_the_placement(tmp_path, caplog):
    squeue = tmp_path / "squeue"
    # this squeue knows -o but refuses -O (an older or trimmed Slurm)
    squeue.write_text("#!/bin/sh\ncase \"$*\" in *-O*) echo 'invalid field Deadline' >&2; exit 1;; esac\n"
                      f"echo '5|{J0}|RUNNING|high|1|criticality=4|gpu002'\n")
    squeue.chmod(0o755)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho $3\n")
    scontrol.chmod(0o755)
    sp = SlurmPlacement(SlurmPlacementConfig(squeue=str(squeue), scontrol=str(scontrol)))
    with caplog.at_level("WARNING", logger="seamguard.app.slurm_placement"):
        fleet = sp.fleet(TOPO)
    assert list(np.flatnonzero(fleet.node_job == 0)) == [2] and fleet.job_criticality[0] == 4.0
    assert np.isnan(fleet.job_schedule()[0]).all()
    assert any("deadlines not read from Slurm" in r.getMessage() and "invalid field Deadline" in r.getMessage()
               for r in caplog.records)


@pytest.mark.slow
def test_a_deadline_from_a_real_slurm_job(tmp_path):
    """sbatch --deadline on a real slurmctld: squeue --Format=Deadline is read into the job's deadline."""
    from datetime import timedelta

    from seamguard.testbed.slurm import SlurmCluster

    with SlurmCluster(tmp_path / "slurm", ["gpu001", "gpu002"], slurmd=True) as sc:
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/sh\nwhile true; do sleep 0.2; done\n")
        script.chmod(0o755)
        when = (datetime.now() + timedelta(hours=3)).replace(microsecond=0)  # sbatch reads local time
        sc.sbatch(script, f"--job-name={J0}", "--nodes=1", f"--deadline={when.isoformat()}", "--time=60",
                  "--output=/dev/null")
        sc.sbatch(script, f"--job-name={J1}", "--nodes=1", "--time=30", "--output=/dev/null")
        sp = SlurmPlacement(SlurmPlacementConfig(squeue=sc.bin("squeue"), scontrol=sc.bin("scontrol"),
                                                 refresh_s=0.1, time_limit_as_deadline=True))
        limit = time.monotonic() + 60
        fleet = TOPO
        while time.monotonic() < limit:
            fleet = sp.fleet(TOPO)
            if (fleet.node_job == 0).sum() == 1 and (fleet.node_job == 1).sum() == 1:
                break
            time.sleep(0.3)
        dl, _, _ = fleet.job_schedule()
        assert dl[0] == when.timestamp()  # --deadline, to the second
        # J1 has no --deadline: the end of its 30-minute time limit
        assert abs(dl[1] - (time.time() + 30 * 60)) < 120, dl[1] - time.time()
        sc.run("scancel", "--user=root")
