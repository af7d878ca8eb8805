"""Replica pushes: a holder on the pusher's host reads the slot file, any other the socket;
either way every tensor is hash-checked before the replica is kept."""

import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from seamguard.runtime import replica
from seamguard.runtime.manifest import Manifest, hash_bytes
from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.snapshot import SlotStore, TrainingState

HOST = "127.0.0.1"


@pytest.fixture
def pusher(tmp_path):
    """A captured, hashed snapshot in a shared-memory slot: (slot, manifest)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    slots = SlotStore(f"sgtest-push-{tmp_path.name}", 3)
    slot = slots.capture(TrainingState(model, opt, GlobalBatchSampler(64, 8).state_dict), 7, timeout_s=5.0)
    yield slot, slots.build_manifest(slot, rank=1, world_size=2)
    slots.close()


@pytest.fixture
def holder(tmp_path):
    slots = SlotStore(f"sgtest-hold-{tmp_path.name}", 3)
    server = replica.ReplicaServer(replica.ReplicaStore(slots), HOST, timeout_s=5.0, dedup=False)
    yield server
    server.close()
    slots.close()


def _held(server, manifest) -> list[bytes]:
    """Every tensor's bytes of the replica the holder keeps (fetched, hash-checked)."""
    got_manifest, payload = replica.fetch(server.address, 1, manifest.step, timeout_s=5.0)
    assert got_manifest.entries == manifest.entries
    return _tensors(manifest, payload)


def _tensors(manifest, payload: np.ndarray) -> list[bytes]:
    return [payload[e.offset:e.offset + e.nbytes].tobytes() for e in manifest.entries]


def test_a_holder_on_the_same_host_reads_the_slot_file_not_the_socket(pusher, holder):
    slot, manifest = pusher
    # what crosses the socket here would fail the hashes: the holder must take the file's bytes
    garbage = np.zeros_like(slot.array)
    took = replica.push(holder.address, 1, manifest, garbage, 5.0, local=(HOST, str(slot.path)))
    assert took == sum(e.nbytes for e in manifest.entries)
    assert _held(holder, manifest) == _tensors(manifest, slot.array)


def test_a_holder_on_another_host_takes_the_bytes_from_the_socket(pusher, holder):
    slot, manifest = pusher
    sent = slot.array.copy()
    slot.array[:] = 0   # the file no longer holds the snapshot: only the socket's bytes are right
    replica.push(holder.address, 1, manifest, sent, 5.0, local=("10.11.12.13", str(slot.path)))
    assert _held(holder, manifest) == _tensors(manifest, sent)


def test_a_slot_file_that_is_gone_falls_back_to_the_socket(pusher, holder):
    slot, manifest = pusher
    sent = slot.array.copy()
    slot.path.unlink()
    replica.push(holder.address, 1, manifest, sent, 5.0, local=(HOST, str(slot.path)))
    assert _held(holder, manifest) == _tensors(manifest, sent)


def test_bytes_read_from_the_file_that_fail_their_hash_are_refused(pusher, holder):
    slot, manifest = pusher
    e = manifest.entries[0]
    slot.array[e.offset] ^= 0xFF   # changed after hashing: what a torn slot would look like
    with pytest.raises((replica.ReplicaError, OSError)):
        replica.push(holder.address, 1, manifest, slot.array, 5.0, local=(HOST, str(slot.path)))
    with pytest.raises(replica.ReplicaError, match="no replica"):
        replica.fetch(holder.address, 1, manifest.step, timeout_s=5.0)


def test_a_peer_cannot_have_the_holder_read_a_file_that_is_no_slot(pusher, holder, tmp_path):
    slot, manifest = pusher
    other = tmp_path / "secret-slot0"
    other.write_bytes(slot.array.tobytes())   # right bytes, but not a shared-memory slot
    sent = slot.array.copy()
    replica.push(holder.address, 1, manifest, sent, 5.0, local=(HOST, str(other)))
    assert _held(holder, manifest) == _tensors(manifest, sent)   # taken from the socket
    with pytest.raises((replica.ReplicaError, OSError)):   # refused; the pusher may see a broken pipe
        replica.push(holder.address, 1, manifest, np.zeros_like(sent), 5.0, local=(HOST, str(other)))
    assert _held(holder, manifest) == _tensors(manifest, sent)   # the good replica is still the one held


def _variant(slot, manifest, step: int, salt: int):
    """The snapshot's bytes with every tensor changed (salt), as the manifest of ``step``."""
    payload = slot.array.copy()
    entries = []
    for e in manifest.entries:
        payload[e.offset:e.offset + e.nbytes] ^= np.uint8(salt)
        entries.append(replace(e, xxh3=hash_bytes(payload[e.offset:e.offset + e.nbytes])))
    return Manifest(step, manifest.rank, manifest.world_size, entries), payload


def test_a_push_cut_off_midway_leaves_no_torn_replica_advertised(pusher, holder):
    # The holder keeps two replicas per role and receives a third into the oldest one's
    # buffers. A pusher killed mid-stream must not leave that oldest replica listed with
    # half its tensors overwritten: a recovery choosing it would fail its hash check on
    # the spare (and a second time, and so on). The newest complete replica stays.
    slot, manifest = pusher
    m7, p7 = _variant(slot, manifest, 7, 0x11)
    m8, p8 = _variant(slot, manifest, 8, 0x22)
    m9, p9 = _variant(slot, manifest, 9, 0x33)
    for m, p in ((m7, p7), (m8, p8)):
        replica.push(holder.address, 1, m, p, 5.0)
    assert holder.store.valid_steps() == {"1": [7, 8]}

    def die() -> None:
        raise ConnectionAbortedError("pusher killed")
    with pytest.raises(ConnectionAbortedError):
        replica.push(holder.address, 1, m9, p9, 5.0, midway=die)
    deadline = time.monotonic() + 5.0
    while 7 in holder.store.valid_steps().get("1", []) and time.monotonic() < deadline:
        time.sleep(0.01)   # the holder's thread sees the closed channel
    steps = holder.store.valid_steps()["1"]
    assert 8 in steps and 9 not in steps, steps
    for step, m, p in ((7, m7, p7), (8, m8, p8)):
        if step in steps:   # every replica advertised is whole
            assert _held(holder, m) == _tensors(m, p)
