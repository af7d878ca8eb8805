"""Job moves, sheds and no-new-work reservations against a real Slurm cluster.

slurmctld plus one real slurmd per node, each in its own network namespace
(`SlurmCluster(slurmd=True)`): batch jobs really run, are really signalled, requeued
and restarted on another node. The actuator is configured with the cluster's client
wrappers, as a user configures it with their own scontrol/squeue/scancel.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from seamguard.act.reconcile import reconcile
from seamguard.act.slurm import SlurmActuator, SlurmConfig
from seamguard.decide.actions import Action, Decisions, Verb, action_key
from seamguard.ledger.sqlite import Ledger
from seamguard.testbed.net import Testbed, TestbedSpec, list_namespaces
from seamguard.testbed.slurm import SlurmCluster

pytestmark = pytest.mark.slow

NODES = ["n1", "n2", "n3"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurmd"), NODES, slurmd=True) as sc:
        yield sc


def actuator(sc: SlurmCluster, **kw) -> SlurmActuator:
    return SlurmActuator(SlurmConfig(scontrol=sc.bin("scontrol"), sinfo=sc.bin("sinfo"), squeue=sc.bin("squeue"),
                                     scancel=sc.bin("scancel"), timeout_s=20, **kw))


@pytest.fixture
def clean(cluster):
    """Every job cancelled, every reservation deleted and every node back in service afterwards."""
    yield cluster
    cluster.run("scancel", "--full", "--signal=KILL", "--user=root")
    for line in cluster.scontrol("show", "reservation", "-o").stdout.splitlines():
        name = line.split()[0].partition("=")[2]
        if name:
            cluster.scontrol("delete", f"ReservationName={name}")
    for n in NODES:
        cluster.scontrol("update", f"NodeName={n}", "AvailableFeatures=", "ActiveFeatures=")
    wait(lambda: not cluster.run("squeue", "-h").stdout.strip(), 30, "jobs did not leave")


def wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.25)
    raise AssertionError(f"{what} within {timeout_s}s")


def training_script(d: Path) -> Path:
    """A job that logs each start (node, restart count) and writes a checkpoint file on SIGUSR1."""
    s = d / "train.sh"
    s.write_text("#!/bin/sh\n"
                 f"trap 'echo $SLURMD_NODENAME >> {d}/checkpoint.$SLURM_JOB_ID' USR1\n"
                 f"echo $SLURMD_NODENAME ${{SLURM_RESTART_COUNT:-0}} >> {d}/starts.$SLURM_JOB_ID\n"
                 "while true; do sleep 0.2; done\n")
    return s


def move(job: str, domain: str, nodes: list[str]) -> Action:
    return Action(key=action_key(Verb.MOVE_JOB, job, domain), verb=Verb.MOVE_JOB, target=job, target_kind="job",
                  params=(("domain", domain), ("domain_kind", "cooling_loop"), ("nodes", ",".join(nodes))),
                  reason=f"seamguard: {domain} degraded", cause=domain)


def running_on(sc: SlurmCluster, jid: int) -> str:
    j = sc.job(jid)
    return j.get("NodeList", "") if j.get("JobState") == "RUNNING" else ""


def test_move_checkpoints_then_requeues_the_job_off_the_domain(clean, tmp_path) -> None:
    sc = clean
    jid = sc.sbatch(training_script(tmp_path), "--job-name=pretrain", "-o", "/dev/null", "--requeue",
                    "--nodelist=n1")
    assert wait(lambda: running_on(sc, jid), 20, "job did not start") == "n1"
    act = actuator(sc, checkpoint_grace_s=2.0, checkpoint_signal="USR1")
    key = action_key(Verb.MOVE_JOB, "pretrain", "cdu-a")

    first = act.apply(move("pretrain", "cdu-a", ["n1", "n2"]))
    assert first.ok and "checkpoint asked (SIGUSR1)" in first.detail, first.detail
    assert key not in act.observe()  # asked, not moved yet: the next tick continues
    assert wait(lambda: (tmp_path / f"checkpoint.{jid}").exists(), 10, "no checkpoint on SIGUSR1")
    early = act.apply(move("pretrain", "cdu-a", ["n1", "n2"]))
    assert early.ok and "requeue in" in early.detail and running_on(sc, jid) == "n1"

    time.sleep(2.0)
    moved = act.apply(move("pretrain", "cdu-a", ["n1", "n2"]))
    assert moved.ok and "requeued from n1" in moved.detail, moved.detail
    assert key in act.observe()
    # Really restarted, outside the domain (n3 is the only node left), as its second start.
    assert wait(lambda: running_on(sc, jid), 40, "requeued job did not restart") == "n3"
    starts = tmp_path / f"starts.{jid}"
    wait(lambda: len(starts.read_text().split()) >= 4, 10, "the restarted job wrote nothing")
    assert starts.read_text().split("\n")[:2] == ["n1 0", "n3 1"]
    assert (tmp_path / f"checkpoint.{jid}").read_text().split() == ["n1"]  # one checkpoint, before the move

    # A restarted controller recognises its own work from Slurm; applying again changes nothing.
    fresh = actuator(sc, checkpoint_grace_s=2.0)
    assert key in fresh.observe()
    again = fresh.apply(move("pretrain", "cdu-a", ["n1", "n2"]))
    assert again.ok and "off the domain" in again.detail and running_on(sc, jid) == "n3"
    # Lifted: the token goes, the job keeps running where it is.
    assert fresh.revert(key).ok
    assert key not in fresh.observe() and running_on(sc, jid) == "n3"
    assert not sc.job(jid).get("AdminComment", "").startswith("seamguard:")


def test_pending_job_gets_the_domain_excluded_and_revert_keeps_foreign_exclusions(clean, tmp_path) -> None:
    sc = clean
    hold = sc.sbatch(training_script(tmp_path), "--job-name=filler", "-o", "/dev/null", "-N", "3")
    wait(lambda: running_on(sc, hold), 20, "filler did not start")
    jid = sc.sbatch(training_script(tmp_path), "--job-name=eval", "-o", "/dev/null", "--exclude=n3")
    assert sc.scontrol("update", f"JobId={jid}", "AdminComment=ticket-42").returncode == 0
    act = actuator(sc)
    key = action_key(Verb.MOVE_JOB, "eval", "cdu-a")
    res = act.apply(move("eval", "cdu-a", ["n1"]))
    assert res.ok and "off the domain (pending)" in res.detail, res.detail
    j = sc.job(jid)
    assert sc.run("scontrol", "show", "hostnames", j["ExcNodeList"]).stdout.split() == ["n1", "n3"]
    assert j["AdminComment"].startswith("seamguard:move_job:eval@cdu-a;moved=")
    assert "ticket-42" in sc.scontrol("show", "job", "-o", str(jid)).stdout  # the admin's text is kept
    assert key in act.observe()
    assert act.revert(key).ok
    j = sc.job(jid)
    assert j["ExcNodeList"] == "n3" and j["AdminComment"] == "ticket-42"  # only what seamguard added is gone
    assert key not in act.observe()


def test_move_of_an_unknown_job_is_refused_not_retried(clean) -> None:
    res = actuator(clean).apply(move("nosuchjob", "cdu-a", ["n1"]))
    assert not res.ok and not res.retryable and "no live job named 'nosuchjob'" in res.detail
    res = actuator(clean).apply(move("nosuchjob", "cdu-a", []))
    assert not res.ok and "no nodes" in res.detail


def test_shed_through_reconcile_and_ledger_leaves_the_job_pending(clean, tmp_path) -> None:
    """A shed is a move with no room: the low-criticality job waits; the ledger records both phases."""
    sc = clean
    crit = sc.sbatch(training_script(tmp_path), "--job-name=critical", "-o", "/dev/null", "-N", "2",
                     "--nodelist=n2,n3")
    low = sc.sbatch(training_script(tmp_path), "--job-name=sweep", "-o", "/dev/null", "--nodelist=n1")
    wait(lambda: running_on(sc, crit) and running_on(sc, low), 20, "jobs did not start")
    act = actuator(sc, checkpoint_grace_s=0.0)
    shed = move("sweep", "cdu-a", ["n1"])
    shed = Action(**{**shed.__dict__, "params": shed.params + (("mode", "shed"),)})
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        changes = reconcile(Decisions(t_s=0.0, desired={shed.key: shed}), [act], ledger, tick=1, enforce=True)
        assert [(c.op, c.status) for c in changes] == [("apply", "done")], changes
        assert "requeued from n1" in changes[0].detail
        # The next tick finds it in effect: nothing to apply, nothing repeated.
        assert reconcile(Decisions(t_s=15.0, desired={shed.key: shed}), [act], ledger, tick=2, enforce=True) == []
        time.sleep(sc.cred_expire_s + 2)
        j = sc.job(low)
        assert j["JobState"] == "PENDING" and running_on(sc, crit)  # no room off the loop: shed, not moved
        # Recovered: the decision goes, the exclusion seamguard added goes, the job may run on n1 again.
        changes = reconcile(Decisions(t_s=30.0, desired={}), [act], ledger, tick=3, enforce=True)
        assert [(c.op, c.status) for c in changes] == [("revert", "done")]
        assert wait(lambda: running_on(sc, low), 20, "shed job did not come back") == "n1"
        rows = ledger.db.execute("SELECT op, status FROM actions ORDER BY rowid").fetchall()
        assert [tuple(r) for r in rows] == [("apply", "done"), ("revert", "done")]
    finally:
        ledger.close()


def test_no_new_work_reservation_keeps_jobs_off_and_is_lifted(clean, tmp_path) -> None:
    sc = clean
    assert sc.scontrol("create", "reservation", "ReservationName=admin_maint", "Nodes=n3", "StartTime=now",
                       "Duration=60", "Users=root", "Flags=MAINT").returncode == 0
    act = actuator(sc)
    key = action_key(Verb.LABEL_DEGRADED, "n1", value="none")  # the planner's "no job class" label
    label = Action(key=key, verb=Verb.LABEL_DEGRADED, target="n1", target_kind="node", params=(("classes", "checkpoint_restore"),),
                   reason="seamguard: admissible for no job class (no new work) (cooling_loop:cdu-a)")
    res = act.apply(label)
    assert res.ok and "reservation sg_nonew_n1 created" in res.detail, res.detail
    assert key in act.observe()
    assert "sg_degraded" in sc.run("sinfo", "-n", "n1", "-h", "-o", "%f").stdout
    jid = sc.sbatch(training_script(tmp_path), "--job-name=newwork", "-o", "/dev/null")
    assert wait(lambda: running_on(sc, jid), 20, "job did not start") == "n2"  # not n1 (ours), not n3 (admin's)
    # Someone else's reservation is neither observed nor touched.
    assert act.revert(key).ok
    out = sc.scontrol("show", "reservation", "-o").stdout
    assert "sg_nonew_n1" not in out and "admin_maint" in out
    assert key not in act.observe()
    jid2 = sc.sbatch(training_script(tmp_path), "--job-name=after", "-o", "/dev/null")
    assert wait(lambda: running_on(sc, jid2), 20, "job did not start") == "n1"


def test_reservation_missing_means_not_in_effect(clean) -> None:
    """Features alone (a reservation deleted by hand) are not the label: reconcile puts it back."""
    act = actuator(clean)
    key = action_key(Verb.LABEL_DEGRADED, "n2", value="none")
    label = Action(key=key, verb=Verb.LABEL_DEGRADED, target="n2", target_kind="node", params=(("classes", "checkpoint_restore"),),
                   reason="seamguard: no new work")
    assert act.apply(label).ok and key in act.observe()
    assert clean.scontrol("delete", "ReservationName=sg_nonew_n2").returncode == 0
    assert key not in act.observe()
    assert "reservation sg_nonew_n2 created" in act.apply(label).detail and key in act.observe()


def test_a_lent_multi_rail_test_bed_hosts_the_cluster_and_jobs_run_in_the_nodes_namespaces(tmp_path) -> None:
    """A caller's test bed (two rails) carries the cluster; it stays up, only Slurm's processes go."""
    with Testbed(TestbedSpec(hosts=3, rails=2)) as tb:
        with SlurmCluster(tmp_path / "slurm", ["a1", "a2"], slurmd=True, testbed=tb, controller_host=2,
                          node_hosts=[0, 1]) as sc:
            script = tmp_path / "addr.sh"
            script.write_text(f"#!/bin/sh\nip -o -4 addr show > {tmp_path}/addr.$SLURMD_NODENAME\nsleep 60\n")
            jid = sc.sbatch(script, "-o", "/dev/null", "--nodelist=a2")
            wait(lambda: (tmp_path / "addr.a2").exists() and running_on(sc, jid), 20, "job did not run")
            addrs = (tmp_path / "addr.a2").read_text()
            assert tb.addr(1, None) in addrs and tb.addr(1, 1) in addrs  # host 1's mgmt and rail-1 addresses
        assert set(tb.namespaces()) <= set(list_namespaces())
        r = subprocess.run(["ip", "netns", "pids", tb.host_ns(1)], capture_output=True, text=True, check=False)
        assert r.stdout.split() == []  # slurmstepd and the job are gone with the cluster
