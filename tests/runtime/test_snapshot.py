"""Snapshots: bit-exact round trip of model, optimizer, RNG; buffers reused, not reallocated."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.snapshot import SlotStore, TrainingState, state_checksum, tensors_of


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, TrainingState(model, opt, GlobalBatchSampler(64, 8).state_dict)


def _train(model, opt, n):
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def test_restore_continues_bit_identically(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgtest-{tmp_path.name}", 3)
    try:
        _train(model, opt, 2)
        random.random()
        slot = slots.capture(state, 2, timeout_s=5)
        _train(model, opt, 3)
        expected = state_checksum(model)
        _train(model, opt, 4)  # diverge, then roll back
        m = slots.build_manifest(slot, 0, 1)
        tensors, meta = tensors_of(m, slot.array)
        assert state.restore(tensors, meta)["data"]["step"] == 2
        _train(model, opt, 3)
        assert state_checksum(model) == expected
    finally:
        slots.close()


def test_spare_with_fresh_optimizer_receives_state(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgtest2-{tmp_path.name}", 3)
    try:
        _train(model, opt, 2)
        slot = slots.capture(state, 2, timeout_s=5)
        m = slots.build_manifest(slot, 0, 1)
        payload = np.array(slot.array)  # what a fetch delivers
        _train(model, opt, 2)
        expected = state_checksum(model)
        spare_model, spare_opt, spare_state = _setup(seed=99)  # different init, no optim state
        tensors, meta = tensors_of(m, payload)
        spare_state.restore(tensors, meta)
        _train(spare_model, spare_opt, 2)
        assert state_checksum(spare_model) == expected
        # the spare's optimizer state is its own memory, not a view of the payload
        payload[:] = 0
        assert state_checksum(spare_model) == expected
    finally:
        slots.close()


def test_buffers_are_created_on_demand_and_reused(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgtest3-{tmp_path.name}", 3)
    try:
        slots.capture(state, 0, timeout_s=5)  # before the optimizer has state
        assert len(slots.slots) == 1          # one slot, not all three, before the first
        ids = set()
        for step in range(1, 30):
            _train(model, opt, 1)
            s = slots.capture(state, step, timeout_s=5)
            ids.add(s.array.ctypes.data)
        assert slots.allocations == 2  # once at start, once when Adam created its state
        assert len(ids) == 3  # three slots rotate
        assert slots.steps() == [27, 28, 29]
    finally:
        slots.close()


def test_overlapped_capture_holds_the_state_of_its_step(tmp_path):
    """Buffers are taken before `begin` returns (the forward pass changes them); the
    slot is not a snapshot until `wait`, and then holds exactly the step's state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = TrainingState(model, opt, GlobalBatchSampler(64, 8).state_dict)
    slots = SlotStore(f"sgtest4-{tmp_path.name}", 3)
    try:
        _train(model, opt, 2)
        expected = state_checksum(model)
        cap = slots.begin(state, 2, timeout_s=5, overlap=True)
        assert cap is not None and slots.find(2) is None   # not a snapshot yet
        # the next step's forward pass moves the BatchNorm statistics during the copy
        model(torch.randn(4, 8)).sum().backward()
        slot = cap.wait()
        assert slots.find(2) is slot and slots.latest == slot.index and not slot.filling
        opt.step()
        tensors, meta = tensors_of(slots.build_manifest(slot, 0, 1), slot.array)
        state.restore(tensors, meta)
        assert state_checksum(model) == expected
    finally:
        slots.close()


def test_a_slot_being_filled_is_never_handed_out_twice(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgtest5-{tmp_path.name}", 3)
    try:
        _train(model, opt, 1)
        caps = [slots.begin(state, s, timeout_s=5, overlap=True) for s in (1, 2)]
        third = slots.begin(state, 3, timeout_s=0.05, overlap=True)
        assert len({c.slot.index for c in caps + [third]}) == 3
        # all three are filling: a fourth waits and gives up
        assert slots.begin(state, 4, timeout_s=0.05) is None
    finally:
        slots.close()


def test_a_failed_background_copy_surfaces_in_wait(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgtest6-{tmp_path.name}", 3)
    try:
        _train(model, opt, 1)

        def boom():
            raise OSError("device gone")
        cap = slots.begin(state, 1, timeout_s=5, overlap=True, midway=boom)
        try:
            cap.wait()
        except RuntimeError as exc:
            assert "step 1" in str(exc) and "device gone" in str(exc)
        else:
            raise AssertionError("wait() hid the failed copy")
        assert slots.find(1) is None and not cap.slot.filling
    finally:
        slots.close()


def test_the_newest_persisted_slot_is_kept_out_of_rotation(tmp_path):
    model, opt, state = _setup()
    slots = SlotStore(f"sgtest7-{tmp_path.name}", 4)
    try:
        for step in range(1, 4):
            _train(model, opt, 1)
            slots.capture(state, step, timeout_s=5)
        persisted = slots.find(2)
        slots.retain(persisted.index, 2)
        slots.retain(slots.find(3).index, 99)   # the slot no longer holds that step: ignored
        assert slots.retained == persisted.index
        for step in range(4, 10):
            _train(model, opt, 1)
            slots.capture(state, step, timeout_s=5)
            assert slots.find(2) is persisted       # never reused while retained
        slots.forget_after(1)                        # a rollback before it: dropped
        assert slots.retained == -1
    finally:
        slots.close()
    three = SlotStore(f"sgtest8-{tmp_path.name}", 3)
    try:
        _train(model, opt, 1)
        three.retain(three.capture(state, 1, timeout_s=5).index, 1)
        assert three.retained == -1                  # three slots: retention would stall
    finally:
        three.close()


def test_no_host_memory_for_a_slot_is_a_clear_error(tmp_path, monkeypatch):
    import errno
    import os

    model, opt, state = _setup()
    slots = SlotStore(f"sgtest-full-{tmp_path.name}", 3)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    try:
        with pytest.raises(OSError, match="cannot reserve .* MiB of host memory for snapshot "
                                          "slot .*No space left on device"):
            slots.capture(state, 0, timeout_s=5)
        assert not slots.slots and not list(Path("/dev/shm").glob(f"{slots.prefix}-*"))
    finally:
        slots.close()
