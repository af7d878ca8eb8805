"""Snapshots of CUDA state: page-locked slots, the side-stream copy overlapping a step,
restore (in place and into a spare's fresh fused AdamW), the CUDA RNG, orphan adoption.

Needs a GPU; skipped without one (CI has none). Run on the device machine with
``python3 -m pytest tests/runtime/test_snapshot_cuda.py -q``.
"""

import time

import numpy as np
import pytest
import torch

from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.snapshot import (
    SlotStore,
    TrainingState,
    find_orphans,
    host_register,
    host_unregister,
    read_orphan,
    state_checksum,
    tensors_of,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _setup(seed=0, fused=True):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(256, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    return model, opt, TrainingState(model, opt, GlobalBatchSampler(64, 8).state_dict)


def _step(model, opt, before_optimizer=None):
    opt.zero_grad()
    # dropout draws from the CUDA RNG: a restored RNG must give the same masks
    model(torch.randn(16, 64, device="cuda")).pow(2).mean().backward()
    if before_optimizer is not None:
        before_optimizer()
    opt.step()


def test_slots_are_page_locked_and_unpinned_on_close(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgcuda-{tmp_path.name}", 3)
    try:
        _step(model, opt)
        slots.capture(state, 1, timeout_s=10)
        assert slots.slots and all(s.registered for s in slots.slots)
        assert torch.from_numpy(slots.slots[0].array).is_pinned()
    finally:
        slots.close()
    assert not any(s.registered for s in slots.slots)


def test_host_register_round_trip():
    arr = np.zeros(1 << 20, dtype=np.uint8)
    assert host_register(arr)
    assert torch.from_numpy(arr).is_pinned()
    host_unregister(arr)
    assert not torch.from_numpy(arr).is_pinned()


def test_overlapped_capture_equals_the_state_at_the_step_start(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgcuda2-{tmp_path.name}", 3)
    try:
        _step(model, opt)
        torch.cuda.synchronize()
        at_start = state_checksum(model)
        cap = slots.begin(state, 1, timeout_s=10, overlap=True)
        _step(model, opt, before_optimizer=cap.wait)   # the optimizer changes params after the copy
        assert state_checksum(model) != at_start
        slot = cap.slot
        tensors, meta = tensors_of(slots.build_manifest(slot, 0, 1), slot.array)
        state.restore(tensors, meta)
        assert state_checksum(model) == at_start
    finally:
        slots.close()


def test_restore_continues_bit_identically_with_cuda_rng(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgcuda3-{tmp_path.name}", 3)
    try:
        _step(model, opt)
        slot = slots.capture(state, 1, timeout_s=10)
        manifest = slots.build_manifest(slot, 0, 1)
        for _ in range(3):
            _step(model, opt)
        expected = state_checksum(model)
        for _ in range(2):
            _step(model, opt)   # diverge, then roll back
        state.restore(*tensors_of(manifest, slot.array))
        for _ in range(3):
            _step(model, opt)
        assert state_checksum(model) == expected
    finally:
        slots.close()


def test_spare_with_fresh_fused_adamw_adopts_an_orphan(tmp_path):
    """A spare (fresh model and fused AdamW, no optimizer state) restores the snapshot a
    dead process left in shared memory and trains on bit-identically; fused AdamW keeps
    its step counter on the GPU, so a CPU one would make its next step fail."""
    model, opt, state = _setup()
    prefix = f"sgcuda4-{tmp_path.name}"
    slots = SlotStore(prefix, 3)
    try:
        _step(model, opt)
        slot = slots.capture(state, 1, timeout_s=10)
        slots.publish_manifest(slot, slots.build_manifest(slot, 0, 1), role=0)
        for _ in range(2):
            _step(model, opt)
        expected = state_checksum(model)
        manifest, path = find_orphans(prefix, 0)[1]
        spare_model, spare_opt, spare_state = _setup(seed=7)
        spare_state.restore(*tensors_of(manifest, read_orphan(manifest, path)))
        steps = [s["step"] for s in spare_opt.state.values()]
        assert all(t.is_cuda for t in steps)
        for _ in range(2):
            _step(spare_model, spare_opt)
        assert state_checksum(spare_model) == expected
    finally:
        slots.close()


def test_slots_grown_on_a_thread_are_page_locked(tmp_path):
    """With CUDA, slots after the first are made off the training thread (grow_ahead):
    registered there (portable), so the side-stream copies into them run asynchronously."""
    model, opt, state = _setup()
    slots = SlotStore(f"sgcuda5-{tmp_path.name}", 3)
    try:
        _step(model, opt)
        slots.begin(state, 1, timeout_s=10).wait()
        assert slots.begin(state, 2, timeout_s=10) is None   # skipped while slot 2 is made
        deadline = time.monotonic() + 30
        while len(slots.slots) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(slots.slots) == 3 and all(s.registered for s in slots.slots)
        assert all(torch.from_numpy(s.array).is_pinned() for s in slots.slots)
    finally:
        slots.close()


def test_a_spares_prepared_slot_is_page_locked_and_taken_by_the_first_snapshot(tmp_path):
    """A hot spare prepares slot 0 (page-locked on its thread) while it waits; the first
    snapshot after it takes a rank over copies into it without making a slot."""
    from seamguard.runtime.snapshot import Layout

    model, opt, state = _setup()
    _step(model, opt)
    slots = SlotStore(f"sgcuda6-{tmp_path.name}", 3)
    try:
        slots.prepare(Layout.build(state.named_tensors(), len(state.meta(1))).total_bytes)
        deadline = time.monotonic() + 30
        while slots._prepared is None and time.monotonic() < deadline:
            time.sleep(0.01)
        prepared = slots._prepared
        assert prepared is not None and prepared.registered
        cap = slots.begin(state, 1, timeout_s=10)
        assert cap is not None and slots.slots == [prepared]
        cap.wait()
        assert torch.from_numpy(prepared.array).is_pinned()
    finally:
        slots.close()


def test_a_spare_restores_an_orphan_through_its_prepared_slot(tmp_path):
    """The spare copies a dead rank's snapshot into its page-locked prepared slot (hashed
    as it is copied) and restores to the GPU from there, bit-identically."""
    from seamguard.runtime.snapshot import Layout

    model, opt, state = _setup()
    _step(model, opt)
    dead = SlotStore(f"sgcuda7d-{tmp_path.name}", 2)
    spare = SlotStore(f"sgcuda7s-{tmp_path.name}", 2)
    try:
        slot = dead.capture(state, 1, timeout_s=10)
        dead.publish_manifest(slot, dead.build_manifest(slot, 0, 1), role=0)
        want = state_checksum(model)
        manifest, path = find_orphans(dead.prefix, 0)[1]
        spare.prepare(Layout.build(state.named_tensors(), len(state.meta(1))).total_bytes)
        deadline = time.monotonic() + 30
        while spare._prepared is None and time.monotonic() < deadline:
            time.sleep(0.01)
        into = spare.staging(manifest.total_bytes)
        assert into is not None and torch.from_numpy(into).is_pinned()
        _step(model, opt)   # move away from the snapshot
        tensors, meta = tensors_of(manifest, read_orphan(manifest, path, into=into))
        state.restore(tensors, meta)
        assert state_checksum(model) == want
    finally:
        dead.close()
        spare.close()


def test_checksum_of_a_gpu_model_equals_its_cpu_copys():
    """The recovery checksum streams GPU tensors through a pinned buffer in chunks; the
    digest must be the one the same bytes give on the CPU (ranks compare digests)."""
    import copy

    from seamguard.runtime import checksum

    model, opt, _ = _setup()
    _step(model, opt)
    big = torch.nn.Linear(3000, 3000).cuda()   # 36 MB of weights: crosses a chunk with a small one
    old = checksum._STAGE_BYTES
    checksum._STAGE_BYTES = 1 << 20
    checksum._STAGING.clear()
    try:
        for m in (model, big):
            assert state_checksum(m) == state_checksum(copy.deepcopy(m).cpu())
            assert state_checksum(m, params_only=True) == state_checksum(copy.deepcopy(m).cpu(), params_only=True)
    finally:
        checksum._STAGE_BYTES = old
        checksum._STAGING.clear()
