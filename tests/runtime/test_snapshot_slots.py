"""Slot rotation: the newest snapshot with a published manifest is never overwritten
before a newer one is published, so a dead process always leaves one adoptable snapshot
even when hashing lags behind the captures (as on a GPU, where the copy outruns it)."""

import os
from pathlib import Path

import pytest
import torch

from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.snapshot import (
    SlotStore,
    TrainingState,
    find_orphans,
    read_orphan,
)


def _state():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return TrainingState(model, opt, GlobalBatchSampler(64, 8).state_dict)


def test_unhashed_captures_never_reuse_the_newest_published_slot(tmp_path):
    state = _state()
    prefix = f"sgslots-{tmp_path.name}"
    slots = SlotStore(prefix, 3)
    try:
        slot = slots.capture(state, 1, timeout_s=5)
        slots.publish_manifest(slot, slots.build_manifest(slot, 0, 1), role=0)
        for step in range(2, 9):   # the hasher never gets to these
            assert slots.capture(state, step, timeout_s=5) is not None
            assert 1 in find_orphans(prefix, 0), f"published step 1 lost at capture {step}"
        manifest, path = find_orphans(prefix, 0)[1]
        read_orphan(manifest, path)   # still intact: verifies every hash
        assert slots.find(8) is not None
    finally:
        slots.close()


def test_a_newer_published_snapshot_frees_the_older_one(tmp_path):
    state = _state()
    prefix = f"sgslots2-{tmp_path.name}"
    slots = SlotStore(prefix, 3)
    try:
        for step in (1, 2):
            slot = slots.capture(state, step, timeout_s=5)
            slots.publish_manifest(slot, slots.build_manifest(slot, 0, 1), role=0)
        for step in (3, 4):
            slots.capture(state, step, timeout_s=5)
        assert set(find_orphans(prefix, 0)) == {2}   # step 1's slot was reused, step 2's kept
    finally:
        slots.close()


def _wait_for(cond, timeout_s=10.0):
    import time
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_growing_ahead_skips_a_capture_instead_of_waiting_for_a_new_slot(tmp_path):
    """grow_ahead (on by default with CUDA, where a page-locked slot takes seconds to make):
    the first slot of a layout is made at once, later ones on a thread, and a periodic
    capture finding none ready is skipped rather than stalled."""
    state = _state()
    slots = SlotStore(f"sgslots3-{tmp_path.name}", 3, grow_ahead=True)
    try:
        cap = slots.begin(state, 1, timeout_s=5)
        assert cap is not None and len(slots.slots) == 1   # the layout's first snapshot is taken
        cap.wait()
        assert slots.begin(state, 2, timeout_s=5) is None  # the only slot is the latest: skipped
        _wait_for(lambda: len(slots.slots) == 3)           # the others were made off this thread
        for step in (3, 4, 5):
            cap = slots.begin(state, step, timeout_s=5)
            assert cap is not None
            cap.wait()
        assert slots.steps() == [3, 4, 5]
        assert slots.capture(state, 6, timeout_s=5) is not None   # an explicit capture still waits
    finally:
        slots.close()


def test_grow_one_makes_the_next_captures_slot_on_a_thread_and_only_that_one(tmp_path):
    """--snapshot-every auto: one slot ahead, made (and its pages mapped) off the training
    thread, so the next capture does not make one; never more than one unused, never more
    than n_slots."""
    state = _state()
    slots = SlotStore(f"sgslots6-{tmp_path.name}", 3)
    try:
        slots.capture(state, 1, timeout_s=5)
        assert slots.made == 1
        slots.grow_one()
        _wait_for(lambda: not slots.growing)
        assert (slots.made, len(slots.slots)) == (2, 2)
        slots.grow_one()   # one is there that no capture has used: nothing more
        assert not slots.growing and len(slots.slots) == 2
        slot = slots.capture(state, 2, timeout_s=5)
        assert slot.index == 1 and slots.made == 2   # the capture took it, made nothing
        for step in (3, 4):
            slots.grow_one()
            _wait_for(lambda: not slots.growing)
            slots.capture(state, step, timeout_s=5)
        assert len(slots.slots) == 3 and slots.made == 3   # n_slots is the bound
        assert slots.steps()[-1] == 4
    finally:
        slots.close()


def test_populate_maps_a_fresh_slots_pages(tmp_path):
    import numpy as np

    from seamguard.runtime.snapshot import populate

    path = Path(f"/dev/shm/sgpopulate-{tmp_path.name}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, 8 << 20)
        arr = np.memmap(path, dtype=np.uint8, mode="r+", shape=(8 << 20,))
        rss_before = _rss_shmem_kib()
        if not populate(arr):
            pytest.skip("kernel without MADV_POPULATE_WRITE (before 5.14)")
        assert _rss_shmem_kib() - rss_before >= 8 << 10   # every page is mapped into this process
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _rss_shmem_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    pytest.skip("no RssShmem in /proc/self/status")


def test_a_slot_grown_after_close_is_deleted(tmp_path):
    state = _state()
    prefix = f"sgslots4-{tmp_path.name}"
    slots = SlotStore(prefix, 3, grow_ahead=True)
    slots.capture(state, 1, timeout_s=5)
    assert slots.begin(state, 2, timeout_s=5) is None   # starts growing slot 1
    slots.close()
    _wait_for(lambda: not slots._growing)
    assert not list(Path("/dev/shm").glob(f"{prefix}-slot*"))


def _layout_bytes(state) -> int:
    from seamguard.runtime.snapshot import Layout
    return Layout.build(state.named_tensors(), len(state.meta(0))).total_bytes


def test_a_prepared_slot_of_the_layouts_size_is_the_first_snapshots_slot(tmp_path):
    """A hot spare prepares slot 0 with its node's ranks' slot size while it waits; the
    first snapshot after it takes a rank over uses that slot instead of making one."""
    state = _state()
    prefix = f"sgslots5-{tmp_path.name}"
    slots = SlotStore(prefix, 3, grow_ahead=True)
    try:
        nbytes = _layout_bytes(state)
        slots.prepare(nbytes)
        _wait_for(lambda: slots._prepared is not None)
        prepared = slots._prepared
        slots.prepare(nbytes)   # the same size again: kept, nothing made
        assert slots._prepared is prepared and not slots._preparing
        cap = slots.begin(state, 1, timeout_s=5)
        assert cap is not None and slots.slots == [prepared] and slots._prepared is None
        cap.wait()
        slots.publish_manifest(prepared, slots.build_manifest(prepared, 0, 1), role=0)
        read_orphan(*find_orphans(prefix, 0)[1])   # the snapshot in the prepared slot verifies
        slots.prepare(nbytes)   # slots exist: a no-op
        assert slots._prepared is None and not slots._preparing
    finally:
        slots.close()


def test_a_prepared_slot_of_another_size_is_replaced_and_close_frees_it(tmp_path):
    state = _state()
    prefix = f"sgslots6-{tmp_path.name}"
    slots = SlotStore(prefix, 3, grow_ahead=True)
    nbytes = _layout_bytes(state)
    slots.prepare(nbytes + 4096)
    _wait_for(lambda: slots._prepared is not None)
    cap = slots.begin(state, 1, timeout_s=5)   # the layout is smaller: a slot of its own size
    assert cap is not None and slots.slots[0].array.size == nbytes
    cap.wait()
    assert Path(f"/dev/shm/{prefix}-slot0").stat().st_size == nbytes
    slots.close()
    other = SlotStore(f"{prefix}b", 3)
    other.prepare(nbytes)
    _wait_for(lambda: other._prepared is not None)
    other.close()
    for p in (prefix, f"{prefix}b"):
        assert not list(Path("/dev/shm").glob(f"{p}-slot*"))


def test_an_orphan_read_into_staging_memory_is_copied_whole_and_verified(tmp_path):
    """A spare restoring a dead rank's snapshot on a GPU copies it into its page-locked
    prepared slot first (hashed as it is copied): the copy equals the orphan's bytes, and a
    damaged tensor is refused as it is without the copy."""
    import numpy as np
    import pytest

    state = _state()
    prefix = f"sgslots7-{tmp_path.name}"
    slots = SlotStore(prefix, 2)
    try:
        slot = slots.capture(state, 3, timeout_s=5)
        slots.publish_manifest(slot, slots.build_manifest(slot, 0, 1), role=0)
        manifest, path = find_orphans(prefix, 0)[3]
        into = np.full(manifest.total_bytes + 64, 0xAB, dtype=np.uint8)
        got = read_orphan(manifest, path, into=into)
        assert np.shares_memory(got, into) and got.size == manifest.total_bytes
        orphan = np.memmap(path, dtype=np.uint8, mode="r")
        for e in manifest.entries:
            assert bytes(got[e.offset:e.offset + e.nbytes]) == bytes(orphan[e.offset:e.offset + e.nbytes])
        victim = manifest.entries[0]
        slot.array[victim.offset] ^= 0xFF   # the dead process was overwriting it
        with pytest.raises(ValueError, match="fails its hash"):
            read_orphan(manifest, path, into=into)
        assert slots.staging(manifest.total_bytes) is None   # no prepared, page-locked slot here
    finally:
        slots.close()


def test_a_replica_fetched_into_a_slot_is_kept_as_that_steps_snapshot(tmp_path):
    # A spare fetches the replica it restores from straight into a slot laid out as the
    # replica's manifest; once restored, that slot is its snapshot of the step: the same
    # bytes (every tensor re-hashed equal), the latest, and published for adoption.
    state = _state()
    holder, spare = SlotStore(f"sgkeep-h-{tmp_path.name}", 3), SlotStore(f"sgkeep-s-{tmp_path.name}", 3)
    try:
        slot = holder.capture(state, 7, timeout_s=5)
        manifest = holder.build_manifest(slot, 0, 2)
        into = spare.receiving(manifest, timeout_s=5)
        assert spare.find(7) is None and into.filling   # not a snapshot until kept
        into.array[:manifest.total_bytes] = slot.array[:manifest.total_bytes]   # as replica.fetch does
        spare.kept(into, manifest, role=1, rank=1, world_size=2)
        assert spare.find(7) is into and spare.latest == into.index and into.manifest.rank == 1
        rehashed = {e.name: e.xxh3 for e in spare.build_manifest(into, 1, 2).entries}
        assert rehashed == {e.name: e.xxh3 for e in manifest.entries}
        assert set(find_orphans(f"sgkeep-s-{tmp_path.name}", 1)) == {7}
        # the layout is the state's own: the next capture reuses the slots, not lays them out anew
        allocations = spare.allocations
        assert spare.capture(state, 8, timeout_s=5) is not None and spare.allocations == allocations
        # a failed fetch hands its slot back
        again = spare.receiving(holder.build_manifest(slot, 0, 2), timeout_s=5)
        spare.release(again)
        assert not again.filling and again.step == -1
    finally:
        holder.close()
        spare.close()
