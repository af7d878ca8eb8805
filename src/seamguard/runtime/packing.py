"""How a snapshot's bytes lie in a slot, and how they are verified and read back.

A slot holds every tensor of the state at a fixed, aligned offset (`Layout`) and the meta
blob after them; its manifest (runtime/manifest.py) names each span with its xxh3. The
same reading serves every place a snapshot is read: its own worker restoring it, a
replica holder, the persister's checkpoint, and a spare adopting the slots a dead worker
left in /dev/shm (`find_orphans`, `read_orphan`: every span verified, since the process
may have died while overwriting one). `hash_spans` hashes large states on several threads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seamguard.runtime.manifest import Manifest, hash_bytes
from seamguard.runtime.state import META

_ALIGN = 64


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Layout:
    """Where each tensor of a snapshot lives in a slot: (name, dtype, shape, offset, nbytes)."""

    items: tuple[tuple[str, str, tuple[int, ...], int, int], ...]
    meta_offset: int
    meta_capacity: int

    @property
    def total_bytes(self) -> int:
        return self.meta_offset + self.meta_capacity

    @staticmethod
    def build(named: list[tuple[str, torch.Tensor]], meta_len: int) -> "Layout":
        items, off = [], 0
        for name, t in named:
            nbytes = t.numel() * t.element_size()
            items.append((name, _dtype_name(t.dtype), tuple(t.shape), off, nbytes))
            off += -(-nbytes // _ALIGN) * _ALIGN
        return Layout(tuple(items), off, max(1 << 16, 2 * meta_len))

    def signature(self) -> tuple:
        return tuple((n, d, s) for n, d, s, _, _ in self.items)

    @staticmethod
    def of(manifest: Manifest) -> "Layout":
        """The layout a snapshot's manifest describes (its tensors where `build` put them)."""
        meta = next(e for e in manifest.entries if e.name == META)
        items = tuple((e.name, e.dtype, tuple(e.shape), e.offset, e.nbytes)
                      for e in manifest.entries if e.name != META)
        return Layout(items, meta.offset, max(1 << 16, 2 * meta.nbytes))


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def find_orphans(prefix: str, role: int) -> dict[int, tuple[Manifest, Path]]:
    """Snapshots of ``role`` a dead process left in shared memory: step -> (manifest,
    slot path), from the manifests beside the slots (cheap: no slot is read here)."""
    out: dict[int, tuple[Manifest, Path]] = {}
    for side in sorted(Path("/dev/shm").glob(f"{prefix}-slot*.json")):
        try:
            doc = json.loads(side.read_text())
            if int(doc["role"]) == role:
                manifest = Manifest.from_json(doc["manifest"])
                out[manifest.step] = (manifest, side.with_name(side.name[:-len(".json")]))
        except (OSError, ValueError, KeyError):
            continue
    return out


def read_orphan(manifest: Manifest, path: Path, into: np.ndarray | None = None) -> np.ndarray:
    """An adopted slot's bytes, every tensor verified against its manifest (the process
    may have died while overwriting it). Mapped, not read: the restore copies from the
    mapping directly (private, so nothing written through it reaches the file), or, given
    ``into`` (page-locked memory, `SlotStore.staging`), from a copy there, hashed as it is
    made."""
    data = np.memmap(path, dtype=np.uint8, mode="c")
    if data.size < manifest.total_bytes:
        raise ValueError(f"{path}: {data.size} bytes, manifest needs {manifest.total_bytes}")
    spans = [(e.offset, e.nbytes) for e in manifest.entries]
    if into is not None:
        into = into[:manifest.total_bytes]
        digests, data = hash_spans(into, spans, copy_from=data), into
    else:
        digests = hash_spans(data, spans)
    for e, digest in zip(manifest.entries, digests):
        if digest != e.xxh3:
            raise ValueError(f"{path}: tensor {e.name!r} of step {manifest.step} fails its hash")
    return data


_HASH_POOL: Any = None
_PARALLEL_HASH_BYTES = 64 << 20


def hash_spans(arr: np.ndarray, spans: list[tuple[int, int]], copy_from: np.ndarray | None = None) -> list[str]:
    """xxh3 of every ``(offset, nbytes)`` span of ``arr``, in order; with ``copy_from``,
    each span is first copied there from the same span of it. Large states are hashed on
    several threads (xxhash and numpy's copy release the GIL): one thread hashes about
    10 GB/s, slower than a GPU's device-to-host copy, so with a snapshot every step the
    pipeline, not the copy, held a 4.8 GB state's training back (benchmarks/gpu_runtime.py)."""
    global _HASH_POOL

    def one(span: tuple[int, int]) -> str:
        o, n = span
        if copy_from is not None:
            np.copyto(arr[o:o + n], copy_from[o:o + n])
        return hash_bytes(arr[o:o + n])
    if sum(n for _, n in spans) < _PARALLEL_HASH_BYTES or len(spans) < 2:
        return [one(span) for span in spans]
    if _HASH_POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _HASH_POOL = ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1)),
                                        thread_name_prefix="sg-hash")
    return list(_HASH_POOL.map(one, spans))


def tensors_of(manifest: Manifest, payload: np.ndarray) -> tuple[dict[str, torch.Tensor], bytes]:
    """Split a packed payload into named typed tensors (views, no copy) and the meta bytes."""
    out, meta = {}, b""
    for e in manifest.entries:
        raw = payload[e.offset:e.offset + e.nbytes]
        if e.name == META:
            meta = raw.tobytes()
        else:
            out[e.name] = typed(raw, e.dtype, e.shape)
    return out, meta


def typed(arr: np.ndarray, dtype: str, shape: list[int]) -> torch.Tensor:
    t = torch.from_numpy(arr)
    return (t.view(getattr(torch, dtype)) if arr.size else
            torch.empty(0, dtype=getattr(torch, dtype))).view(shape)
