"""The seam drill's files and figures (seamguard.testbed.drill): every file it writes is one the
product accepts as is, and the per-fault figures are read off the controller's events the way
benchmarks/seam_drill.py reports them. The drill itself (namespaces, Prometheus, a training
job) runs in the benchmark, minutes long; this checks the parts it is built from."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from seamguard.agent.config import parse_agent_config
from seamguard.app.config import load_policy, load_run_config, load_topology
from seamguard.fleet.model import Kind
from seamguard.testbed.drill import (
    JOB_MASTER_PORT,
    Layout,
    SlurmBins,
    agent_yaml,
    covered,
    fault_figures,
    healthy_actions,
    job_scripts,
    link_latency_query,
    phase_rates,
    policy_yaml,
    prometheus_yaml,
    run_yaml,
    steps_rolled_back,
    topology_yaml,
)
from seamguard.testbed.net import Testbed, TestbedSpec

LAY = Layout()


def test_the_drill_files_are_valid_product_inputs(tmp_path: Path):
    (tmp_path / "fleet.yaml").write_text(topology_yaml(LAY))
    fleet = load_topology(tmp_path / "fleet.yaml")
    assert fleet.node_names == ["h0", "h1", "h2"]
    assert LAY.link(0, 0) in fleet.link_names and fleet.index_of(Kind.NIC, LAY.nic(1, 1)) >= 0
    assert fleet.loop_names == ["cdu-a", "cdu-b"]
    (tmp_path / "policy.yaml").write_text(policy_yaml())
    policy = load_policy(tmp_path / "policy.yaml")
    assert policy.breaker.max_in_effect_fleet_fraction > 1 / 3  # one drained node of three is allowed
    (tmp_path / "run.yaml").write_text(run_yaml(LAY, tmp_path / "fleet.yaml", "http://127.0.0.1:9090", "enforce",
                                                tmp_path, tmp_path / "hints", 1.0, tmp_path / "policy.yaml"))
    cfg = load_run_config(tmp_path / "run.yaml")
    assert cfg.mode == "enforce" and {a.type for a in cfg.actuators} == {"log", "runtime"}
    tb = Testbed(TestbedSpec(hosts=LAY.hosts, rails=LAY.rails), prefix="sgdrilltest")  # never brought up
    agent = parse_agent_config(agent_yaml(tb, LAY, 1, tmp_path / "kmsg", tmp_path), "agent-h1.yaml")
    assert agent.node == "h1"
    assert {p.nic for p in agent.fabric.peers} == {LAY.nic(h, r) for h in (0, 2) for r in range(LAY.rails)}
    assert [r.link for r in agent.fabric.rails] == [LAY.link(1, r) for r in range(LAY.rails)]
    prom = prometheus_yaml(["10.213.200.1:9475"], "10.213.200.1:9477", "127.0.0.1:9400", 1.0)
    assert '"1000ms"' in prom and "GPU_TEMP" in prom and "seamguard_coolant_" in prom and "XID" not in prom


def test_link_latency_query_names_links_as_the_topology_does():
    q = link_latency_query(LAY)
    assert '"$1~leaf-r$2"' in q and "min by (link)" in q
    assert q.count("seamguard_fabric_probe_rtt_seconds_sum") == 2  # as source and as destination


def _apply(t: float, key: str) -> dict:
    return {"t": t, "action": {"op": "apply", "key": key}}


def test_figures_per_fault_and_healthy_actions():
    cover = covered(LAY)
    starts = {"gray_link": 100.0, "slow_storage": 125.0, "cooling": 150.0, "node_failure": 175.0}
    ends = {f: t + 25.0 for f, t in starts.items()}
    events = [
        _apply(90.0, "label_degraded:h2=async_batch_inference"),  # before any fault, on a healthy node
        _apply(104.5, f"drain:{LAY.node(0)}"),
        _apply(104.5, "checkpoint_interval:drill=450"),
        {"t": 130.0, "action": {"op": "revert", "key": f"drain:{LAY.node(0)}"}},  # not a decision
        _apply(131.0, "checkpoint_now:drill@t131"),  # no remedy for a stalled path; the job is at risk
        _apply(151.0, "move_job:drill@cdu-a"),
        _apply(176.0, f"drain:{LAY.node(1)}"),
        _apply(177.0, "avoid_link:leaf-r1~spine-0"),  # the node failure does not cover rail 1's uplink
    ]
    job_events = [{"event": "resumed", "gen": 2, "t": 178.0, "steps_redone": 3},
                  {"event": "resumed", "gen": 0, "t": 10.0, "steps_redone": None}]
    delivered = [{"key": f"drain:{LAY.node(1)}"}]
    fig = fault_figures(starts, ends, cover, events, job_events, delivered)
    assert fig["gray_link"]["time_to_action_s"] == 4.5
    assert fig["gray_link"]["actions"] == ["checkpoint_interval:drill=450", "drain:h0"]
    assert fig["slow_storage"]["action"] is None and fig["slow_storage"]["time_to_action_s"] is None
    assert fig["cooling"]["action"] == "move_job:drill@cdu-a" and fig["cooling"]["delivered"] == []
    assert fig["node_failure"] == {"time_to_action_s": 1.0, "action": "drain:h1", "actions": ["drain:h1"],
                                   "delivered": ["drain:h1"], "job_steps_lost": 3, "recoveries": 1}
    assert healthy_actions(starts, cover, events) == ["label_degraded:h2=async_batch_inference",
                                                      "avoid_link:leaf-r1~spine-0"]


def test_phase_rates_are_steps_per_second_in_each_window():
    starts = {"gray_link": 10.0, "slow_storage": 30.0, "cooling": 50.0, "node_failure": 70.0}
    steps = [(float(t), float(t * 2 if t < 10 or t > 20 else 20 + (t - 10) * 0.5)) for t in range(91)]
    r = phase_rates(steps, 0.0, starts, 10.0, 90.0)
    assert r["calm"] == 2.0 and r["gray_link"] == 0.5
    assert r["node_failure_after"] == 2.0 and list(r)[:3] == ["calm", "gray_link", "gray_link_after"]
    # a requeued run's counter reads 0 before it resumes: not a phase's progress
    restarted = [(t, v) for t, v in steps if t != 80] + [(80.0, 0.0)]
    assert phase_rates(restarted, 0.0, starts, 10.0, 90.0)["node_failure_after"] == 1.8  # 81..90, not 18 from 0


def test_the_slurm_run_config_and_the_job_scripts(tmp_path: Path):
    (tmp_path / "fleet.yaml").write_text(topology_yaml(LAY))
    (tmp_path / "policy.yaml").write_text(policy_yaml())
    bins = SlurmBins(*(str(tmp_path / "bin" / c) for c in ("scontrol", "sinfo", "squeue", "scancel")))
    (tmp_path / "run.yaml").write_text(run_yaml(LAY, tmp_path / "fleet.yaml", "http://127.0.0.1:9090", "enforce",
                                                tmp_path, tmp_path / "hints", 1.0, tmp_path / "policy.yaml", bins))
    cfg = load_run_config(tmp_path / "run.yaml")
    assert [a.type for a in cfg.actuators] == ["runtime", "slurm"]  # no log actuator masking a job move's phases
    slurm = cfg.actuators[1]
    assert slurm.move_jobs and slurm.squeue == bins.squeue and slurm.checkpoint_grace_s > 0
    assert cfg.slurm_placement is not None and cfg.slurm_placement.squeue == bins.squeue
    tb = Testbed(TestbedSpec(hosts=LAY.hosts, rails=LAY.rails), prefix="sgdrilltest")  # never brought up
    batch, node = job_scripts(tb, LAY, "/usr/bin/python3", ["--nproc", "1", "--spares", "1"],
                              ["train.py", "--steps", "9"], "/src", tmp_path / "node.sh")
    for name, text in (("job.sbatch", batch), ("node.sh", node)):
        (tmp_path / name).write_text(text)
        assert subprocess.run(["sh", "-n", str(tmp_path / name)], check=False).returncode == 0, name
    assert f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {tmp_path / 'node.sh'}" in batch
    for h in range(LAY.hosts):  # every Slurm node knows its rail-0 address
        assert f"{LAY.node(h)}) echo {tb.addr(h, 0)} ;;" in node
    assert f"--master-port {JOB_MASTER_PORT} --store tcp --nproc 1 --spares 1 -- train.py --steps 9" in node
    # the per-node script resolves node rank 0's address from the allocation, as srun runs it
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\necho h1; echo h2\n")
    (fake / "scontrol").chmod(0o755)
    probe = node.replace("/usr/bin/python3 -m seamguard launch", "echo")
    (tmp_path / "probe.sh").write_text(probe)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "h[1-2]", "SLURMD_NODENAME": "h2",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}
    out = subprocess.run(["sh", str(tmp_path / "probe.sh")], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert f"--nnodes 2 --node-rank 1 --master-addr {tb.addr(1, 0)} --master-port" in out.stdout
    bad = subprocess.run(["sh", str(tmp_path / "probe.sh")], env={**env, "SLURMD_NODENAME": "h9"},
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "no rail-0 address for node h9" in bad.stderr
    # a SIGTERM to the node's shell (Slurm's requeue) reaches the launcher, and its exit status is the shell's
    ready = tmp_path / "ready"
    sleeper = node.replace("/usr/bin/python3 -m seamguard launch",
                           f"sh -c 'trap \"exit 7\" TERM; touch {ready}; sleep 5 & wait' --")
    (tmp_path / "sleeper.sh").write_text(sleeper)
    proc = subprocess.Popen(["sh", str(tmp_path / "sleeper.sh")], env=env)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:  # both traps set
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(timeout=10) == 7


def test_steps_rolled_back_counts_drops_of_the_step_counter():
    # a requeue: 40 steps at t=2, the job down, then back from its checkpoint at step 30 at t=9;
    # the loss counts where the killed run was last seen (t=2), not where its successor resumed
    steps = [(0.0, 10.0), (1.0, 20.0), (2.0, 40.0), (9.0, 30.0), (10.0, 35.0), (11.0, 25.0)]
    assert steps_rolled_back(steps, 0.0, 9.5) == 10
    assert steps_rolled_back(steps, 0.0, 12.0) == 20
    assert steps_rolled_back(steps, 2.0, 2.5) == 10 and steps_rolled_back(steps, 2.5, 9.5) == 0
    assert steps_rolled_back(steps, 10.0, 10.5) == 10
    # the new run reports 0 until it has resumed (seen in a drill: 2295 -> 0 -> 2275 is 20 steps lost)
    assert steps_rolled_back([(0.0, 0.0), (1.0, 2295.0), (2.0, 0.0), (3.0, 2275.0), (4.0, 2290.0)], 0.0, 5.0) == 20
    assert steps_rolled_back([(0.0, 0.0), (1.0, 2295.0), (2.0, 0.0), (3.0, 2275.0), (4.0, 2290.0)], 1.5, 5.0) == 0
    # the drill's case: a move in the cooling window, the job back only in the node failure's
    starts = {"gray_link": -5.0, "slow_storage": 0.0, "cooling": 1.5, "node_failure": 8.5}
    fig = fault_figures(starts, {f: t + 2 for f, t in starts.items()}, covered(LAY), [], [], [], steps)
    assert fig["cooling"]["job_steps_lost"] == 10 and fig["node_failure"]["job_steps_lost"] == 10
    assert fig["slow_storage"]["job_steps_lost"] == 0


def test_the_slurm_controller_host_may_also_be_a_node_only_when_asked(tmp_path: Path):
    import pytest

    from seamguard.testbed.slurm import SlurmCluster

    tb = Testbed(TestbedSpec(hosts=3, rails=1), prefix="sgdrilltest")  # never brought up
    with pytest.raises(ValueError, match="none of them the controller's"):
        SlurmCluster(tmp_path, ["h0", "h1", "h2"], slurmd=True, testbed=tb, controller_host=2, node_hosts=[0, 1, 2])
    sc = SlurmCluster(tmp_path, ["h0", "h1", "h2"], slurmd=True, testbed=tb, controller_host=2, node_hosts=[0, 1, 2],
                      controller_is_node=True)
    assert sc.bin("squeue") == str(tmp_path / "bin" / "squeue")
