"""Checkpoint manifests, the commit protocol on storage, and verification on load.

A snapshot is a set of named tensors packed into one buffer. Its manifest lists for every
tensor its name, dtype, shape, byte offset, byte count and xxh3_64 hash. On storage a
rank's checkpoint is `step_XXXXXXXX/rank_XXXXX.bin` plus `rank_XXXXX.manifest.json`,
made visible by `rank_XXXXX.commit`, written last (tmp, fsync, rename, fsync the
directory). Loading verifies the marker, the size and every hash, and names the file and
the tensor at fault: `torch.load` would silently accept a flipped byte. No torch here:
the persister process and the coordinator use it without importing torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import xxhash


class CheckpointError(Exception):
    """A checkpoint on storage is missing, torn or corrupted (message says where)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    xxh3: str


@dataclass(frozen=True)
class Manifest:
    step: int
    rank: int
    world_size: int
    entries: list[TensorEntry]

    @property
    def total_bytes(self) -> int:
        return max((e.offset + e.nbytes for e in self.entries), default=0)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> "Manifest":
        raw = json.loads(text)
        raw["entries"] = [TensorEntry(**e) for e in raw["entries"]]
        return Manifest(**raw)


def hash_bytes(view: np.ndarray | memoryview | bytes) -> str:
    return xxhash.xxh3_64_hexdigest(view)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def _names(rank: int) -> tuple[str, str, str]:
    stem = f"rank_{rank:05d}"
    return f"{stem}.bin", f"{stem}.manifest.json", f"{stem}.commit"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_checkpoint(root: Path, manifest: Manifest, payload: np.ndarray,
                     before_commit=None) -> Path:
    """Write one rank's checkpoint durably; the commit marker goes last.

    `payload` is the packed byte buffer the manifest describes. Every tensor is re-hashed
    from the bytes being written, so a buffer that changed under the writer is refused
    instead of being committed. `before_commit` (chaos) runs after the data and manifest
    are durable and before the marker.
    """
    for e in manifest.entries:
        got = hash_bytes(payload[e.offset:e.offset + e.nbytes])
        if got != e.xxh3:
            raise CheckpointError(f"refusing to persist step {manifest.step} rank "
                                  f"{manifest.rank}: tensor {e.name!r} changed while writing "
                                  f"(hash {got} != {e.xxh3})")
    d = step_dir(root, manifest.step)
    d.mkdir(parents=True, exist_ok=True)
    bin_name, man_name, commit_name = _names(manifest.rank)
    _write_durable(d / bin_name, memoryview(payload[:manifest.total_bytes]))
    _write_durable(d / man_name, manifest.to_json().encode())
    _fsync_dir(d)
    if before_commit is not None:
        before_commit()
    _write_durable(d / commit_name, json.dumps({"step": manifest.step}).encode())
    _fsync_dir(d)
    _fsync_dir(root)
    return d


def read_checkpoint(root: Path, step: int, rank: int) -> tuple[Manifest, np.ndarray]:
    """Read and fully verify one rank's checkpoint, or raise CheckpointError naming the fault."""
    d = step_dir(root, step)
    bin_name, man_name, commit_name = _names(rank)
    if not (d / commit_name).exists():
        raise CheckpointError(f"{d / commit_name}: commit marker missing (checkpoint torn or "
                              "still being written)")
    try:
        manifest = Manifest.from_json((d / man_name).read_bytes())
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{d / man_name}: unreadable manifest ({exc})") from exc
    path = d / bin_name
    try:
        payload = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from exc
    if payload.size != manifest.total_bytes:
        raise CheckpointError(f"{path}: truncated or padded, {payload.size} bytes but the "
                              f"manifest describes {manifest.total_bytes}")
    for e in manifest.entries:
        got = hash_bytes(payload[e.offset:e.offset + e.nbytes])
        if got != e.xxh3:
            raise CheckpointError(f"{path}: tensor {e.name!r} (bytes {e.offset}..."
                                  f"{e.offset + e.nbytes}) hash {got} != manifest {e.xxh3}")
    return manifest, payload


_STEP_RE = re.compile(r"^step_(\d{8})$")


def committed_steps(root: Path) -> list[int]:
    """Steps with at least one commit marker, newest first."""
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := _STEP_RE.match(p.name))
             and any(p.glob("rank_*.commit"))]
    return sorted(steps, reverse=True)


def complete_steps(root: Path) -> list[int]:
    """Steps every rank of their checkpoint has committed, newest first (commit markers
    counted against the world size in rank 0's manifest; no data is read)."""
    out = []
    for step in committed_steps(root):
        d = step_dir(root, step)
        try:
            world = Manifest.from_json((d / _names(0)[1]).read_bytes()).world_size
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if len(list(d.glob("rank_*.commit"))) >= world:
            out.append(step)
    return out


def latest_verified(root: Path, log: list[str] | None = None,
                    newer_than: int = -1, at_most: int | None = None) -> tuple[int, int] | None:
    """(step, world_size) of the newest checkpoint whose every rank verifies, else None.

    Only steps after `newer_than` are read (a caller holding that step elsewhere need
    not pay for reading older checkpoints), and none after `at_most` (a rollback). Every
    skipped candidate is explained in `log` (file and tensor at fault).
    """
    for step in committed_steps(root):
        if step <= newer_than:
            break
        if at_most is not None and step > at_most:
            continue
        try:
            manifest, _ = read_checkpoint(root, step, 0)
            for rank in range(1, manifest.world_size):
                read_checkpoint(root, step, rank)
        except CheckpointError as exc:
            if log is not None:
                log.append(f"skipping checkpoint step {step}: {exc}")
            continue
        return step, manifest.world_size
    return None


def prune(root: Path, rank: int, keep: int) -> None:
    """Delete this rank's files of all but the `keep` newest committed steps."""
    steps = committed_steps(root)
    for step in steps[keep:]:
        d = step_dir(root, step)
        for name in _names(rank):
            (d / name).unlink(missing_ok=True)
        if d.exists() and not any(d.glob("rank_*")):
            shutil.rmtree(d, ignore_errors=True)
