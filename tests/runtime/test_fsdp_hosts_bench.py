"""The parts of `failover_training.py --fsdp --hosts 2` (benchmarks/_fsdp_hosts.py) that
decide its figures: where the kills land, when a host is killed, and which failure a
resume time belongs to. The runs themselves (namespaces, etcd, three systems) take
minutes and live in the benchmark."""

from __future__ import annotations

import json
import random
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import _fsdp_hosts as hosts


def _log(out, wid: int, rows: list[tuple[int, float, int]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"worker_{wid}.log", "a") as f:
        f.writelines(f"{step} {t:.6f} {wid} 4 {gen}\n" for step, t, gen in rows)


def test_kill_steps_leave_the_first_recovery_room():
    rng = random.Random(0)
    for _ in range(200):
        rank_step, host_step = hosts.kill_steps(rng, 36)
        assert 6 <= rank_step <= 12 and 18 <= host_step <= 24
        assert host_step - rank_step >= 6


def test_furthest_step_reads_the_last_line_of_every_worker(tmp_path):
    assert hosts.furthest_step(tmp_path) == -1
    _log(tmp_path, 0, [(0, 1.0, 0), (1, 2.0, 0), (2, 3.0, 0)])
    _log(tmp_path, 3, [(0, 1.0, 0), (1, 2.0, 0)])
    assert hosts.furthest_step(tmp_path) == 2


def test_result_tags_the_rank_kill_and_the_host_kill(tmp_path):
    out, chaos = tmp_path / "run", tmp_path / "chaos"
    # steps 0-4 in gen 0; rank kill at t=4.5 (step 5); gen 1 redoes step 4 at t=6;
    # host kill at t=8.5 after step 7; gen 2 resumes at step 8 at t=10
    rows = [(s, float(s), 0) for s in range(5)] + [(4, 6.0, 1), (5, 6.5, 1), (6, 7.0, 1), (7, 8.0, 1)] \
        + [(8, 10.0, 2), (9, 10.5, 2)]
    for wid in (0, 1):
        _log(out, wid, rows)
    chaos.mkdir()
    (chaos / "kills.jsonl").write_text(json.dumps({"time_s": 4.5, "step": 5, "rank": 1}) + "\n")
    host_kill = {"time_s": 8.5, "step": 8, "action": "host", "host": 1}
    r = hosts._result(out, chaos, host_kill, {"node0": 0, "node1": None}, 12.0, same_generation_ok=False)
    assert [(f["kind"], f["resume_s"], f["steps_lost"]) for f in r["failures"]] == [
        ("rank", 1.5, 1), ("host", 1.5, 0)]
    assert r["last_step"] == 9 and r["window_s"] == 10.5


def test_result_without_a_host_kill_has_only_rank_failures(tmp_path):
    out = tmp_path / "run"
    _log(out, 0, [(0, 1.0, 0), (1, 2.0, 0)])
    r = hosts._result(out, tmp_path / "nochaos", None, {}, 3.0, same_generation_ok=False)
    assert r["failures"] == [] and r["last_step"] == 1 and r["shards"] == []


def _run(window_s: float, failures=(), shards=("final_shard_0.txt:a",), last_step=35) -> dict:
    return {"window_s": window_s, "failures": list(failures), "shards": list(shards), "last_step": last_step}


def test_summary_splits_the_worst_failure_by_kind_and_checks_the_shards():
    sg_fail = [{"kind": "rank", "resume_s": 0.9, "steps_lost": 0}, {"kind": "host", "resume_s": 1.7, "steps_lost": 1}]
    tr_fail = [{"kind": "rank", "resume_s": 15.0, "steps_lost": 4}, {"kind": "host", "resume_s": None, "steps_lost": None}]
    rep = {"kills": [[12, 1], [21, "host1"]], "runs": {
        "plain": {"clean": _run(10.0)},
        "seamguard": {"clean": _run(11.0), "faults": _run(14.0, sg_fail)},
        "torchrun": {"clean": _run(10.0), "faults": _run(50.0, tr_fail, last_step=30)}}}
    s = hosts.summarize_hosts([rep], ["seamguard", "torchrun"], 36)
    assert s["seamguard"]["rank_kill"] == {"resume_s_max": 0.9, "steps_lost_max": 0, "unrecovered": 0}
    assert s["seamguard"]["host_kill"] == {"resume_s_max": 1.7, "steps_lost_max": 1, "unrecovered": 0}
    assert s["seamguard"]["bit_identical"] == [True] and s["seamguard"]["finished_all_steps"] == [True]
    assert s["seamguard"]["wall_ratio"] == 1.4 and s["seamguard"]["failure_free_wall_ratio"] == 1.1
    assert s["torchrun"]["host_kill"] == {"resume_s_max": None, "steps_lost_max": None, "unrecovered": 1}
    assert s["torchrun"]["finished_all_steps"] == [False]
    rep["runs"]["seamguard"]["faults"]["shards"] = ["final_shard_0.txt:b"]
    assert hosts.summarize_hosts([rep], ["seamguard"], 36)["seamguard"]["bit_identical"] == [False]


def test_recovery_phases_split_kill_to_next_step_by_the_runtimes_events():
    # host killed at t=10: the link closes (node_lost at 10.1), plan at 10.12; the last
    # member starts recovering at 10.4 and is recovered at 10.6; the resume is chosen at
    # 10.45; the redone step commits at 11.3
    events = [
        {"t": 5.0, "event": "plan", "gen": 1}, {"t": 5.1, "event": "resume_chosen", "gen": 1},
        {"t": 10.1, "event": "node_lost", "node": 1, "evidence": "its launcher's link closed"},
        {"t": 10.12, "event": "plan", "gen": 2},
        {"t": 10.45, "event": "resume_chosen", "gen": 2},
        {"t": 10.5, "event": "worker", "kind": "recovered", "gen": 2, "wid": 0, "seconds": 0.3,
         "phases_s": {"restore_state": 0.01}},
        {"t": 10.6, "event": "worker", "kind": "recovered", "gen": 2, "wid": 3, "seconds": 0.2,
         "phases_s": {"restore_state": 0.05}},
    ]
    rows = [(8, 9.9, 1), (8, 11.3, 2), (9, 12.0, 2)]
    p = hosts.recovery_phases(events, rows, 10.0, 2)
    assert p["evidence"] == "its launcher's link closed"
    parts = [p[k] for k in ("detect_s", "plan_s", "members_ready_s", "resume_chosen_s",
                            "restored_and_regrouped_s", "first_step_s")]
    assert parts == [0.1, 0.02, 0.28, 0.05, 0.15, 0.7]
    assert p["kill_to_next_step_s"] == 1.3 and p["slowest_member_phases_s"] == {"restore_state": 0.05}
    assert hosts.recovery_phases(events, rows, 10.0, 3) is None   # no such generation


def test_replicas_agree_compares_each_rank_with_its_replicate_peer():
    same = ["final_shard_0.txt:a", "final_shard_1.txt:b", "final_shard_2.txt:a", "final_shard_3.txt:b"]
    assert hosts.replicas_agree(same, 2) is True
    apart = [*same[:3], "final_shard_3.txt:c"]
    assert hosts.replicas_agree(apart, 2) is False
    # rows are consecutive ranks: rank 0's peer is rank 2, not rank 1
    assert hosts.replicas_agree(["final_shard_0.txt:a", "final_shard_1.txt:a",
                                 "final_shard_2.txt:b", "final_shard_3.txt:b"], 2) is False
    assert hosts.replicas_agree(same[:2], 2) is None      # host 1's ranks never finished
    assert hosts.replicas_agree(same, 1) is None          # FSDP2: no replicas to compare


def test_summary_reports_replica_agreement_only_in_hsdp_and_only_where_shards_exist():
    shards = ["final_shard_0.txt:a", "final_shard_1.txt:b", "final_shard_2.txt:a", "final_shard_3.txt:b"]
    ok = [{"kind": "rank", "resume_s": 0.9, "steps_lost": 0}]
    rep = {"kills": [[12, 1]], "runs": {
        "plain": {"clean": _run(10.0, shards=())},
        "seamguard": {"clean": _run(11.0, shards=shards), "faults": _run(14.0, ok, shards=shards[:2])},
        "torchrun": {"clean": _run(10.0, shards=()), "faults": _run(12.0, ok, shards=())}}}
    s = hosts.summarize_hosts([rep], ["seamguard", "torchrun"], 36, replicate=2)
    assert s["seamguard"]["replicas_agree"] == [{"clean": True, "faults": None}]
    assert "replicas_agree" not in s["torchrun"]
    assert "replicas_agree" not in hosts.summarize_hosts([rep], ["seamguard"], 36)["seamguard"]


def test_hsdp_option_reaches_the_sharded_workloads_only_when_asked():
    from failover_training import Config

    assert Config(steps=1, kills=(), ckpt_every=0).mesh_args() == []
    assert Config(steps=1, kills=(), ckpt_every=0, replicate=2).mesh_args() == ["--replicate", "2"]


def test_torchrun_hsdp_shape_keeps_the_rows_while_the_world_divides():
    from torchrun_fsdp_train import hsdp_shape

    assert hsdp_shape(4, 2) == (2, 2)
    assert hsdp_shape(2, 2) == (2, 1)     # one host left after an elastic restart
    with pytest.raises(ValueError, match="--replicate 2: the world size 3"):
        hsdp_shape(3, 2)


def test_kill_phases_follow_the_generation_that_resumed_not_the_kills_ordinal():
    # rank kill at t=10 -> gen 1 planned (10.2) but overtaken: node 0 wrongly judged lost
    # at 11.5, gen 2 planned (11.6) resumes (first step 13.0); a false eviction makes gen 3
    # (20.1); the host kill at t=30 -> gen 4 (30.2, first step 31.0)
    def plan(t, gen):
        return {"t": t, "event": "plan", "gen": gen}

    def resumed(t, gen):
        return [{"t": t - 0.1, "event": "resume_chosen", "gen": gen},
                {"t": t, "event": "worker", "kind": "recovered", "gen": gen, "seconds": 0.2, "phases_s": {}}]

    events = [{"t": 10.1, "event": "detected", "kind": "exited"}, plan(10.2, 1),
              {"t": 11.5, "event": "node_lost", "evidence": "node record silent"}, plan(11.6, 2), *resumed(12.5, 2),
              {"t": 20.0, "event": "detected", "kind": "unresponsive"}, plan(20.1, 3), *resumed(20.5, 3),
              {"t": 30.1, "event": "node_lost", "evidence": "link closed"}, plan(30.2, 4), *resumed(30.6, 4)]
    rows = [(5, 9.0, 0), (5, 13.0, 2), (9, 21.0, 3), (20, 29.0, 3), (20, 31.0, 4)]
    rank, host = hosts.kill_phases(events, rows, [{"time_s": 30.0}, {"time_s": 10.0}])
    assert rank["generations"] == [1, 2] and rank["evidence"] == "node record silent"
    assert rank["detect_s"] == 1.5 and rank["kill_to_next_step_s"] == 3.0
    assert host["generations"] == [4] and host["detect_s"] == 0.1 and host["kill_to_next_step_s"] == 1.0
    assert hosts.kill_phases(events, rows[:1], [{"time_s": 10.0}]) == [None]   # never resumed
