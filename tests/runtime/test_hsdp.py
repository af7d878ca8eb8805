"""HSDP (FSDP2 over a 2-D mesh, `rt.device_mesh(replicate=R)`) under `seamguard launch`:
4 ranks as 2 replicas x 2 shards and a spare; a killed rank's spare takes its index and its
shard from host memory, survivors keep their processes, and every rank's final shard is
bit-identical to a failure-free run's.

Real processes, a real TCPStore, gloo subgroups per mesh dimension re-formed with the
world group at each recovery, injected failures (`seamguard.runtime.chaos`).
"""

from __future__ import annotations

import pytest
import torch

from seamguard.runtime.fsdp import hsdp_subgroups

from .conftest import launch
from .test_fsdp import _redone, _shards

pytestmark = pytest.mark.timeout(240)

HSDP = ("--replicate", "2")


def test_hsdp_subgroups_are_the_ranks_column_and_row():
    layout = torch.arange(6, dtype=torch.int).view(2, 3)
    assert hsdp_subgroups(layout, 4) == [("seamguard/replicate/1", [1, 4]),
                                         ("seamguard/shard/1", [3, 4, 5])]
    assert hsdp_subgroups(layout, 0) == [("seamguard/replicate/0", [0, 3]),
                                         ("seamguard/shard/0", [0, 1, 2])]


@pytest.fixture(scope="module")
def clean_hsdp(tmp_path_factory) -> list[str]:
    r = launch(tmp_path_factory.mktemp("hsdp-clean"), "clean", nproc=4, steps=14,
               script="train_fsdp.py", script_args=HSDP)
    assert r.code == 0, r.stderr
    shards = _shards(r, 4)
    assert all(shards), r.stderr
    # replicas hold the same shard (the all-reduce across replicas ran: each replica saw
    # other samples), the two shards differ
    assert shards[0] == shards[2] and shards[1] == shards[3] and shards[0] != shards[1], shards
    return shards


@pytest.mark.parametrize("action", ["kill", "nodeloss"])
def test_a_killed_hsdp_rank_is_replaced_bit_identically(tmp_path, clean_hsdp, action):
    r = launch(tmp_path, action, nproc=4, spares=1, steps=14, chaos=f"{action}:rank=3,step=6",
               script="train_fsdp.py", script_args=HSDP)
    assert r.code == 0, r.stderr
    assert _shards(r, 4) == clean_hsdp
    chosen = [e for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert chosen and chosen[-1]["source"] == "memory", chosen
    redone = _redone(r)
    assert redone and max(redone) <= 1, redone
    # the survivors kept their processes; the spare (w4) took rank 3
    started = [n["wid"] for n in r.notes("started")]
    assert all(started.count(w) == 1 for w in (0, 1, 2)), started
    recovered = {(n["wid"], n["rank"]) for n in r.notes("recovered") if n["gen"] == 1}
    assert {(0, 0), (1, 1), (2, 2), (4, 3)} <= recovered, recovered
    # each rank's replica holder is its replicate peer, which holds the same shard: only
    # rank-private bytes (the meta blob: RNG states, data position, ~12 KB here) cross, not
    # the shard, which every full replica would carry. The example's model (dim 32,
    # hidden 64, 2 layers) has 6,922 parameters; a rank's shard of them with AdamW's two
    # moments, fp32, is half of 6,922 x 3 x 4 bytes.
    shard_bytes = 6922 * 3 * 4 / 2
    finished = [n for n in r.notes("finished") if n["rank"] >= 0]
    assert len({n["rank"] for n in finished}) == 4, finished
    for n in finished:
        assert n["snapshots"] > 0 and n["replica_bytes_sent"] / n["snapshots"] < 0.5 * shard_bytes, n
    # a spare that fetched the shard from its holder (always after a nodeloss) received it
    # straight into a slot that is its snapshot of the resumed step, so it snapshots every
    # later step (the default --snapshot-every 1) but not that one again; one that adopted
    # the killed rank's own snapshot from shared memory (a kill, when that snapshot was
    # complete) reads it in place and takes its own as before
    spare = next(n for n in finished if n["wid"] == 4)
    fetched = any(n["wid"] == 4 for n in r.notes("state_received"))
    assert fetched or action == "kill"
    assert spare["snapshots"] == 14 - chosen[-1]["step"] - fetched, (spare, chosen[-1], fetched)


# Snapshots every 5 steps; rank 3 is lost at step 8, between two of them. Its replicate
# peer (rank 1) holds the same shard live, so the spare takes that shard from it at the
# step the survivors are at instead of the job going back to the snapshot of step 5:
# * nodeloss (rank 3 and its node's memory lost at step 8's start): the survivors capture
#   the start of step 8 at the recovery: only the step in flight is computed again;
# * kill after its optimizer step (step 8 applied, step 9's start never pushed): the
#   survivors are at step 9, and the part of its private bytes only rank 3 had (RNG
#   states: dropout is on) went to its holder when step 8's collectives finished, so
#   nothing is redone (before, the job went back to step 5: 4 steps redone).
@pytest.mark.parametrize("fault, step, redone", [
    ("nodeloss:rank=3,step=8", 8, [0]),
    ("kill:rank=3,step=8,phase=optimizer", 9, [0]),
])
def test_an_hsdp_rank_lost_between_snapshots_resumes_from_its_peer(tmp_path, clean_hsdp, fault, step, redone):
    r = launch(tmp_path, "sparse", nproc=4, spares=1, steps=14, chaos=fault,
               script="train_fsdp.py", script_args=HSDP, extra=("--snapshot-every", "5"))
    assert r.code == 0, r.stderr
    assert _shards(r, 4) == clean_hsdp
    chosen = [e for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert chosen and chosen[-1]["source"] == "memory" and chosen[-1]["step"] == step, chosen
    assert _redone(r) == redone
    assert not r.notes("rank_part_off")
