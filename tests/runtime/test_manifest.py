"""Commit protocol and corruption detection of persisted checkpoints."""

import numpy as np
import pytest

from seamguard.runtime.manifest import (CheckpointError, Manifest, TensorEntry, hash_bytes,
                                        latest_verified, read_checkpoint, step_dir,
                                        write_checkpoint)


def _write(root, step, rank=0, world=1, seed=0):
    payload = np.random.default_rng(seed + step).integers(0, 255, 256, dtype=np.uint8)
    entries = [TensorEntry("model/w", "float32", [32], 0, 128, hash_bytes(payload[:128])),
               TensorEntry("optim/0/exp_avg", "float32", [32], 128, 128, hash_bytes(payload[128:]))]
    write_checkpoint(root, Manifest(step, rank, world, entries), payload)
    return payload


def test_round_trip(tmp_path):
    payload = _write(tmp_path, 5)
    manifest, got = read_checkpoint(tmp_path, 5, 0)
    assert manifest.step == 5 and np.array_equal(got, payload)
    assert not list(tmp_path.rglob("*.tmp"))


def test_flipped_byte_names_file_and_tensor(tmp_path):
    _write(tmp_path, 5)
    f = step_dir(tmp_path, 5) / "rank_00000.bin"
    raw = bytearray(f.read_bytes())
    raw[130] ^= 0x01
    f.write_bytes(raw)
    with pytest.raises(CheckpointError, match=r"rank_00000\.bin: tensor 'optim/0/exp_avg'"):
        read_checkpoint(tmp_path, 5, 0)


def test_truncation_and_missing_marker(tmp_path):
    _write(tmp_path, 5)
    f = step_dir(tmp_path, 5) / "rank_00000.bin"
    f.write_bytes(f.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(tmp_path, 5, 0)
    _write(tmp_path, 6)
    (step_dir(tmp_path, 6) / "rank_00000.commit").unlink()
    with pytest.raises(CheckpointError, match="commit marker missing"):
        read_checkpoint(tmp_path, 6, 0)


def test_latest_verified_skips_corrupt_and_incomplete(tmp_path):
    for step in (5, 10, 15):
        _write(tmp_path, step, rank=0, world=2)
        _write(tmp_path, step, rank=1, world=2, seed=7)
    (step_dir(tmp_path, 15) / "rank_00001.commit").unlink()  # torn: rank 1 never committed
    f = step_dir(tmp_path, 10) / "rank_00000.bin"
    raw = bytearray(f.read_bytes())
    raw[3] ^= 0xFF
    f.write_bytes(raw)
    why = []
    assert latest_verified(tmp_path, why) == (5, 2)
    assert any("step 15" in w and "commit marker" in w for w in why)
    assert any("step 10" in w and "'model/w'" in w for w in why)


def test_writer_refuses_a_buffer_that_changed(tmp_path):
    payload = np.zeros(128, dtype=np.uint8)
    m = Manifest(1, 0, 1, [TensorEntry("model/w", "uint8", [128], 0, 128, hash_bytes(payload))])
    payload[0] = 1
    with pytest.raises(CheckpointError, match="changed while writing"):
        write_checkpoint(tmp_path, m, payload)
    assert not (step_dir(tmp_path, 1) / "rank_00000.commit").exists()
