"""FSDP2 (`fully_shard`) under `seamguard launch`: a lost rank's shard of parameters and
optimizer state comes back from its holder's host memory, survivors are not restarted,
and every rank's final shard is bit-identical to a failure-free run's.

Real processes, a real TCPStore, gloo groups re-formed behind FSDP2's mesh
(`seamguard.runtime.fsdp.ResilientGroup`), injected failures (`seamguard.runtime.chaos`).
"""

from __future__ import annotations

import pytest

from .conftest import launch

pytestmark = pytest.mark.timeout(240)


def _shards(run, nproc: int) -> list[str]:
    files = [run.out / f"final_shard_{r}.txt" for r in range(nproc)]
    return [f.read_text() if f.exists() else "" for f in files]


@pytest.fixture(scope="module")
def clean_shards(tmp_path_factory):
    """Failure-free FSDP2 runs, computed once per module: {(nproc, steps): [checksum per rank]}."""
    cache: dict[tuple[int, int], list[str]] = {}

    def get(nproc: int, steps: int) -> list[str]:
        if (nproc, steps) not in cache:
            r = launch(tmp_path_factory.mktemp("fsdp-clean"), f"clean{nproc}x{steps}", nproc=nproc,
                       steps=steps, script="train_fsdp.py")
            assert r.code == 0, r.stderr
            assert r.notes("started") and all(_shards(r, nproc)), r.stderr
            cache[nproc, steps] = _shards(r, nproc)
        return cache[nproc, steps]
    return get


def _redone(run) -> list[int]:
    return [e["steps_redone"] for e in run.kinds("resumed") if e["gen"] > 0]


@pytest.mark.parametrize("action", ["kill", "nodeloss"])
def test_a_killed_fsdp_rank_is_replaced_from_host_memory(tmp_path, clean_shards, action):
    # kill: the victim's own snapshots outlive it in this node's /dev/shm and the spare
    # adopts them (hash-verified); nodeloss: they are gone with the "node", and the spare
    # takes the shard from the replica its holder keeps
    r = launch(tmp_path, action, spares=1, steps=20, chaos=f"{action}:rank=1,step=8",
               script="train_fsdp.py")
    assert r.code == 0, r.stderr
    assert _shards(r, 2) == clean_shards(2, 20)
    # the shards differ between ranks: the spare really took rank 1's, not a copy of rank 0's
    assert len(set(clean_shards(2, 20))) == 2
    chosen = [e for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert chosen[-1]["source"] == "memory"
    # the victim's start of step 7 reached its holder before it committed step 7; its
    # start of step 8 (pushed while step 8 computes) may have too
    resumed = chosen[-1]["step"]
    assert resumed in (7, 8) and _redone(r) == [8 - resumed], (chosen, _redone(r))
    received = [(n["role"], n["step"], n["holder"]) for n in r.notes("state_received")]
    assert received == ([(1, resumed, 0)] if action == "nodeloss" else []), received
    # the survivor kept its process: no second "started" note for worker 0
    assert [n["wid"] for n in r.notes("started")].count(0) == 1
    assert any(n["wid"] == 0 and n["gen"] == 1 for n in r.notes("recovered"))


def test_uneven_shards_over_three_ranks_survive_a_loss(tmp_path, clean_shards):
    # 64 rows over 3 ranks: FSDP2 pads; each rank's shard has its own size
    r = launch(tmp_path, "three", nproc=3, spares=1, steps=16, chaos="kill:rank=2,step=6",
               script="train_fsdp.py")
    assert r.code == 0, r.stderr
    assert _shards(r, 3) == clean_shards(3, 16)
    assert max(_redone(r)) <= 1


# Chaos on the sharded path: a rank dies or freezes in each phase of a step. Zero lost
# state (every run finishes), zero corrupted state (bit-identical shards), and at most one
# completed step redone per loss. A few seconds each on 2 cores.
@pytest.mark.parametrize("fault", [
    "kill:rank=0,step=5,phase=snapshot",      # half-way through copying its own snapshot
    "kill:rank=1,step=9,phase=replicate",     # half-way through pushing it to the holder
    "kill:rank=1,step=11,phase=optimizer",    # right after applying its shard's update
    "stop:rank=0,step=7",                     # frozen: judged hung, killed, replaced
    "kill:rank=0,step=4; kill:rank=1,step=12",  # two losses, a replenished spare for the second
])
def test_sharded_chaos_trial(tmp_path, clean_shards, fault):
    r = launch(tmp_path, "chaos", spares=1, steps=16, chaos=fault, script="train_fsdp.py")
    assert r.code == 0, r.stderr
    assert _shards(r, 2) == clean_shards(2, 16)
    redone = _redone(r)
    assert len(redone) == fault.count(";") + 1 and max(redone) <= 1, redone
    assert all(e["source"] == "memory" for e in r.kinds("resume_chosen") if e["gen"] > 0)
