"""Decision tables for membership planning and the rollback-step choice."""

import pytest

from seamguard.runtime.membership import (Plan, identical_ranks, initial_plan, next_plan, replica_holder,
                                          resume_step)


@pytest.mark.parametrize("rank,world,per_node,holder", [
    (0, 4, 4, 1), (3, 4, 4, 0), (0, 8, 4, 4), (5, 8, 4, 1), (0, 1, 1, 0), (1, 2, 2, 0)])
def test_replica_holder_is_next_rank_or_next_node(rank, world, per_node, holder):
    assert replica_holder(rank, world, per_node) == holder


@pytest.mark.parametrize("world,replicas,per_node,holders", [
    # 2 hosts x 2 ranks, rows on hosts: each rank's replicate peer, on the other host
    (4, 2, 2, [2, 3, 0, 1]),
    # one node of 4: the peer one row on (there is no other node)
    (4, 2, 4, [2, 3, 0, 1]),
    # 4 replica rows of 2 over 2 nodes of 4: one row on is the same node, two rows on is not
    (8, 4, 4, [4, 5, 6, 7, 0, 1, 2, 3]),
    # rows span 2 nodes (8 ranks a row, 4 a node): the next row is already another node
    (16, 2, 4, list(range(8, 16)) + list(range(8))),
])
def test_hsdp_replica_holder_is_a_replicate_peer_on_another_node(world, replicas, per_node, holders):
    got = [replica_holder(r, world, per_node, replicas) for r in range(world)]
    assert got == holders
    row = world // replicas
    assert sorted(got) == list(range(world))                       # one replica per holder
    assert all(h % row == r % row and h != r for r, h in enumerate(got))   # same shard column
    if world > per_node:
        assert all(h // per_node != r // per_node for r, h in enumerate(got))  # other node


def test_hsdp_plan_records_the_replicate_peer_as_holder():
    # 2 hosts x 2 ranks (w0 w1 | w2 w3), HSDP 2x2: rank 1's shard is also on rank 3
    p = next_plan(initial_plan([0, 1, 2, 3], [4]), {1}, 2, "lost 1", replicas=2)
    assert p.ranks == [0, 4, 2, 3] and p.holders == {1: 3}


@pytest.mark.parametrize("world,replicas,groups", [
    (4, 0, [[0, 1, 2, 3]]),        # data parallel: everyone holds the whole model
    (4, 1, []),                    # FSDP: four different shards
    (4, 2, [[0, 2], [1, 3]]),      # HSDP 2x2: the columns
    (6, 3, [[0, 2, 4], [1, 3, 5]]),
])
def test_identical_ranks(world, replicas, groups):
    assert identical_ranks(world, replicas) == groups


def test_spare_takes_lost_rank_and_records_holder():
    p = next_plan(initial_plan([0, 1, 2, 3], [4]), {2}, 4, "lost 2")
    assert p.gen == 1 and p.ranks == [0, 1, 4, 3] and p.roles == [0, 1, 2, 3]
    assert p.holders == {2: 3} and p.spares == [] and p.lost == [2]


def test_an_evacuated_rank_takes_a_spare_off_its_node_while_one_is_left():
    # two nodes of 2 ranks + 1 spare: w0 w1 s2 | w3 w4 s5; rank 0 (w0) evacuated from node 0
    p = next_plan(initial_plan([0, 1, 3, 4], [2, 5]), {0}, 2, "evacuate 0", avoid=frozenset({2}))
    assert p.ranks == [5, 1, 3, 4] and p.spares == [2]
    # both ranks of node 0 evacuated: one spare elsewhere, then the one left on the node
    p = next_plan(initial_plan([0, 1, 3, 4], [2, 5]), {0, 1}, 2, "evacuate 0,1", avoid=frozenset({2}))
    assert p.ranks == [5, 2, 3, 4] and p.spares == []
    assert next_plan(initial_plan([0, 1, 3, 4], [2, 5]), {0}, 2, "lost 0").ranks[0] == 2  # a crash: lowest id


def test_without_spare_the_group_shrinks_keeping_order():
    p = next_plan(initial_plan([0, 1, 2, 3], []), {1}, 4, "lost 1")
    assert p.ranks == [0, 2, 3] and p.roles == [0, 2, 3] and p.holders == {}


def test_losing_everyone_is_an_error():
    with pytest.raises(ValueError, match="every rank lost"):
        next_plan(initial_plan([0, 1], []), {0, 1}, 2, "x")


def test_resume_step_is_newest_common_step():
    p = next_plan(initial_plan([0, 1, 2], [3]), {1}, 3, "lost 1")  # 3 replaces role 1, holder 2
    holdings = {0: {"own": [7, 8]}, 2: {"own": [7, 8], "replicas": {"1": [7, 8]}}, 3: {"own": []}}
    assert resume_step(p, holdings) == 8
    holdings[0] = {"own": [6, 7]}  # rank 0 is one step behind
    assert resume_step(p, holdings) == 7


def test_resume_step_none_when_replica_missing_or_disk_forced():
    p = next_plan(initial_plan([0, 1, 2], [3]), {1}, 3, "lost 1")
    assert resume_step(p, {0: {"own": [8]}, 2: {"own": [8], "replicas": {}}}) is None
    forced = Plan(**{**p.__dict__, "force_disk": True})
    assert resume_step(forced, {0: {"own": [8]}, 2: {"own": [8], "replicas": {"1": [8]}}}) is None


def test_plan_json_round_trip():
    p = next_plan(initial_plan([0, 1], [2]), {0}, 2, "lost 0")
    assert Plan.from_json(p.to_json()) == p


def test_pending_recovery_carries_holders_and_detects_lost_holder():
    g1 = next_plan(initial_plan([0, 1], [2, 3]), {0}, 2, "lost 0")  # 2 takes role 0, holder 1
    g2 = next_plan(g1, {1}, 2, "lost 1", pending=True)  # holder of role 0 died mid-recovery
    assert g2.ranks == [2, 3] and g2.holders == {0: 1, 1: 2}
    holdings = {2: {"own": [], "replicas": {"1": [8]}}, 3: {"own": []}}
    assert resume_step(g2, holdings) is None  # role 0's replica died with worker 1


def test_rollback_generation_caps_the_resume_step_and_survives_a_loss():
    p = next_plan(initial_plan([0, 1], [2]), set(), 2, "rollback to step 20", max_step=20)
    holdings = {0: {"own": [20, 25, 30]}, 1: {"own": [20, 25, 30]}}
    assert resume_step(p, holdings) == 20
    assert resume_step(p, {0: {"own": [25, 30]}, 1: {"own": [25, 30]}}) is None  # -> disk
    assert Plan.from_json(p.to_json()).max_step == 20
    # a loss while the rollback is still recovering keeps the cap
    q = next_plan(p, {1}, 2, "lost 1", pending=True)
    assert q.max_step == 20 and q.ranks == [0, 2]
    # an ordinary loss later does not
    assert next_plan(q, {0}, 2, "lost 0").max_step is None
