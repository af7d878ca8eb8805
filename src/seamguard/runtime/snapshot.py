"""Snapshots of a training process's state into preallocated, reused host buffers.

`SlotStore` owns N shared-memory slots (files in /dev/shm, so the persister process reads
them without a copy), allocated once for the state's layout (runtime/packing.py) and
reused for every snapshot; the layout is rebuilt only if the set of tensors changes (e.g.
once, when the optimizer creates its state at the first step). What is captured and how
it is put back is the training state's (runtime/state.py, `TrainingState`); how the
tensors are copied into a slot, runtime/capture.py's. This module decides which slot a
snapshot goes into and what may not be overwritten: the latest snapshot, the newest one
with a published manifest, the newest persisted one, and any slot a reader (the
pipeline, the replica server, the persister) or a copy still holds. Slots are made as
captures need them, or ahead on a thread where making one takes seconds (page-locked
memory for CUDA copies, runtime/hostmem.py).

A capture can overlap the step it starts (`SlotStore.begin(..., overlap=True)`):
`Capture.wait` must return before the optimizer step changes what it copies.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seamguard.runtime.capture import Capture, start_copy  # noqa: F401 (Capture: importable here as before)
from seamguard.runtime.checksum import state_checksum  # noqa: F401 (importable here as before)
from seamguard.runtime.hostmem import (  # noqa: F401 (host_register, host_unregister, populate: importable here as before)
    free_shm_buffer,
    host_register,
    host_unregister,
    populate,
    shm_buffer,
)
from seamguard.runtime.manifest import Manifest, TensorEntry, hash_bytes
# find_orphans, read_orphan, tensors_of, typed, with_rank_private: importable from here as before
from seamguard.runtime.packing import (  # noqa: F401
    Layout,
    find_orphans,
    hash_spans,
    read_orphan,
    sidecar,
    tensors_of,
    typed,
)
from seamguard.runtime.state import META, TrainingState, raw_bytes, with_rank_private  # noqa: F401 (re-exported)


@dataclass
class Slot:
    index: int
    path: Path
    array: np.ndarray
    step: int = -1
    meta_len: int = 0
    manifest: Manifest | None = None
    readers: int = 0  # pipeline / replica server reading it: do not overwrite
    pinned: bool = False  # persister reading it
    filling: bool = False  # a capture is still copying into it
    registered: bool = False  # page-locked for CUDA copies (cudaHostRegister succeeded)


@dataclass
class SlotStore:
    """Rotating shared-memory snapshot slots of one worker (see module docstring)."""

    prefix: str
    n_slots: int
    rank_fn: Any = None
    slots: list[Slot] = field(default_factory=list)
    layout: Layout | None = None
    allocations: int = 0
    latest: int = -1
    retained: int = -1   # slot of the newest persisted step, kept for rollbacks
    cond: threading.Condition = field(default_factory=threading.Condition)
    clock: Any = None   # a profile.PhaseClock the worker hands over (times the background copy)
    grow_ahead: bool | None = None
    """Create slots off the training thread (None: when the state is on a GPU). Creating a
    page-locked slot takes seconds for gigabytes (3.5 s for 4.8 GB on an H100 host:
    reserving the pages, then pinning them); made on demand, each of the first
    ``n_slots`` snapshots of a layout, and a recovered spare's first one, stalled the
    step that long. Ahead, the first slot of a layout is still made when it is needed
    (the snapshot taken when the optimizer creates its state must exist), the next ones
    on a thread, and a periodic capture that finds none of them ready yet is skipped
    (the newest earlier snapshot stays the one to recover from) instead of waiting."""
    _stream: Any = None
    _growing: bool = False
    _prepared: Slot | None = None   # slot 0 made ahead of any layout (`prepare`)
    _preparing: bool = False
    _lent: bool = False   # the prepared slot holds a restore's bytes (`staging`): keep it
    _closed: bool = False
    _epoch: int = 0   # bumped when the slots are dropped: a slot grown for an older epoch is freed
    _made: int = 0   # slots made so far (`made`)

    def _allocate(self, layout: Layout) -> None:
        """Adopt a new layout: the old slots go; new ones are created as captures need
        them (:meth:`_new_slot`), so a fresh process pays for one slot before its first
        snapshot, not for all of them."""
        for s in self.slots:
            self._free(s)
            del s.array
        self.slots = []
        self.layout = layout
        self.latest = self.retained = -1
        self.allocations += 1
        self._epoch += 1

    def _new_slot(self) -> Slot:
        """One more slot of the current layout. Its host memory is reserved at once
        (``posix_fallocate`` on /dev/shm, so a full tmpfs is an error here rather than a
        SIGBUS in the middle of a copy); its pages are mapped by the first copy into it,
        which runs off the training thread when snapshots overlap. The first one is the
        slot `prepare` made, if it has the layout's size."""
        assert self.layout is not None
        nbytes, slot = self.layout.total_bytes, None
        if not self.slots:   # (called with cond held) the file is slot 0's: not twice at once
            self.cond.wait_for(lambda: not self._preparing)
        if not self.slots and self._prepared is not None:
            slot, self._prepared, self._lent = self._prepared, None, False
            if slot.array.size != nbytes:
                self._free(slot)
                slot = None
        if slot is None:
            slot = self._make_slot(nbytes, len(self.slots), map_pages=False)
            self._made += 1
        self.slots.append(slot)
        return slot

    def prepare(self, nbytes: int) -> None:
        """Make slot 0 of ``nbytes`` on a thread before any layout exists, for the first
        snapshot of a layout of that size to use: a hot spare does this while it waits,
        with the size of its node's ranks' slots, so that the first snapshot after it takes
        a rank over does not stall the step while seconds of host memory are page-locked
        (3.5 s for 4.8 GB on an H100 host). A slot of another size is replaced; one whose
        size no layout takes is freed when the first slot is made, or at `close`."""
        with self.cond:
            if self.slots or self._preparing or self._lent or (
                    self._prepared is not None and self._prepared.array.size == nbytes):
                return
            old, self._prepared, self._preparing = self._prepared, None, True

        def make() -> None:
            slot = None
            try:
                if old is not None:
                    self._free(old)
                slot = self._make_slot(nbytes, 0)
            except OSError:
                pass   # no host memory for it: the first snapshot makes its slot as before
            with self.cond:
                if slot is not None and not (self._closed or self.slots):
                    self._prepared = slot
                elif slot is not None:
                    self._free(slot)
                self._preparing = False
                self.cond.notify_all()
        threading.Thread(target=make, name="sg-slot-prepare", daemon=True).start()

    def _make_slot(self, nbytes: int, index: int, map_pages: bool = True) -> Slot:
        """Reserve, map and page-lock slot ``index``'s file (no lock held: seconds); a
        slot not page-locked has its pages mapped now if ``map_pages`` (`populate`: made
        on a thread), else by the first copy into it (off the training thread too)."""
        path = Path(f"/dev/shm/{self.prefix}-slot{index}")
        arr, registered = shm_buffer(path, nbytes, map_pages)
        return Slot(index, path, arr, registered=registered)

    def _ahead(self, cuda_state: bool) -> bool:
        return cuda_state if self.grow_ahead is None else self.grow_ahead

    @property
    def growing(self) -> bool:
        """A slot is being made on a thread (read by the training thread)."""
        with self.cond:
            return self._growing

    @property
    def made(self) -> int:
        """Slots made so far, on any thread: a one-time cost per slot, which
        --snapshot-every auto leaves out of a snapshot's recurring cost."""
        with self.cond:
            return self._made

    def grow_one(self) -> None:
        """Make one more slot of the current layout on a thread, unless ``n_slots`` exist or
        one is there that no capture has used yet: the next capture then takes a slot made
        and mapped before it, off the training thread, while slots are still made only as
        captures come (``--snapshot-every auto`` measures a snapshot's cost on them)."""
        with self.cond:
            if self.layout is None or any(s.step < 0 and not s.filling for s in self.slots):
                return
            self._grow_in_background(chain=False)

    def _grow_in_background(self, chain: bool = True) -> None:
        """Start creating the next slot on a thread (called with ``cond`` held); when it
        is in (and ``chain``), the one after it, up to ``n_slots``."""
        if self._growing or self.layout is None or len(self.slots) >= self.n_slots:
            return
        self._growing = True
        epoch, nbytes, index = self._epoch, self.layout.total_bytes, len(self.slots)

        def grow() -> None:
            slot = None
            try:
                slot = self._make_slot(nbytes, index)
            except OSError:
                pass   # no host memory for it: the captures go on with the slots there are
            with self.cond:
                kept = slot is not None and epoch == self._epoch and len(self.slots) == index
                if kept:
                    self.slots.append(slot)
                elif slot is not None:
                    self._free(slot)
                self._growing = False   # after the free: a slot grown too late is gone by then
                self._made += kept
                if kept and chain:
                    self._grow_in_background()
                self.cond.notify_all()
        threading.Thread(target=grow, name="sg-slot-grow", daemon=True).start()

    def _free(self, slot: Slot) -> None:
        """Unpin and unmap a slot (the driver would keep registered pages pinned past the
        unlink) and delete its file and manifest."""
        free_shm_buffer(slot.path, slot.array, slot.registered)
        slot.registered = False
        sidecar(slot.path).unlink(missing_ok=True)

    def staging(self, nbytes: int) -> np.ndarray | None:
        """The prepared slot's page-locked memory, if it is ready and holds ``nbytes``: a
        spare restoring a dead rank's snapshot copies it there first, so that the copy to
        the GPU is a DMA from page-locked memory instead of going through the driver's
        staging buffers from the dead rank's (pageable) mapping. The first snapshot then
        takes the slot as usual."""
        with self.cond:
            slot = self._prepared
            if slot is None or not slot.registered or slot.array.size < nbytes:
                return None
            self._lent = True
            return slot.array

    def close(self) -> None:
        with self.cond:
            for s in self.slots:
                self._free(s)
            if self._prepared is not None:
                self._free(self._prepared)
            self.slots, self._prepared, self._closed = [], None, True
            self.latest = self.retained = -1
            self._epoch += 1

    def publish_manifest(self, slot: Slot, manifest: Manifest, role: int) -> None:
        """Attach a slot's manifest and write it beside the slot in shared memory (tmp +
        rename), so the slot can be adopted if this process dies (`adopt_orphans`)."""
        with self.cond:
            if slot.step != manifest.step or slot.manifest is not None:
                return
            slot.manifest = manifest
            side = sidecar(slot.path)
            tmp = side.with_name(side.name + ".tmp")
            tmp.write_text(json.dumps({"role": role, "manifest": manifest.to_json()}))
            tmp.rename(side)
            self.cond.notify_all()

    def _pick(self, timeout_s: float, wait_for_slot: bool = True, cuda_state: bool = False) -> Slot | None:
        with self.cond:
            def free() -> list[Slot]:
                keep = (self.latest, self.retained, self._newest_published())
                return [s for s in self.slots if s.index not in keep
                        and not (s.readers or s.pinned or s.filling)]
            # the first slot of a layout is made here and waited for: the snapshot taken
            # when the optimizer creates its state must exist (docs/runtime.md)
            if self._ahead(cuda_state) and not wait_for_slot and self.slots:
                if not free() and len(self.slots) < self.n_slots:
                    self._grow_in_background()   # no waiting for it: this capture is skipped
                    return None
                if not self.cond.wait_for(free, timeout=timeout_s):
                    return None
                slot = min(free(), key=lambda s: s.step)
                self._grow_in_background()
            else:
                if not self.cond.wait_for(lambda: free() or (len(self.slots) < self.n_slots
                                                             and not self._growing),
                                          timeout=timeout_s):
                    return None
                # a slot made ahead (`grow_one`) first, then grow to n_slots: as much history
                # as configured, as before
                unused = [s for s in free() if s.step < 0]
                slot = (unused[0] if unused else self._new_slot() if len(self.slots) < self.n_slots
                        else min(free(), key=lambda s: s.step))
            slot.step, slot.manifest, slot.filling = -1, None, True
            sidecar(slot.path).unlink(missing_ok=True)   # before its bytes change
            return slot

    def _newest_published(self) -> int:
        """The slot of the newest snapshot whose manifest is published (-1: none). It is
        never overwritten before a newer one is published: when hashing lags behind the
        captures (a GPU copies faster than one thread hashes), the latest slot is still
        unhashed and the newest hashed one was otherwise the next to be reused, leaving a
        moment with no adoptable snapshot at all (a rank killed then could not be
        recovered from memory: seen on an H100 in benchmarks/gpu_runtime.py)."""
        published = [s for s in self.slots if s.manifest is not None and s.step >= 0]
        return max(published, key=lambda s: s.step).index if published else -1

    def capture(self, state: TrainingState, step: int, timeout_s: float,
                midway=None) -> Slot | None:
        """Copy the state at `step` into a free slot; None if no slot freed in time."""
        cap = self.begin(state, step, timeout_s, midway, wait_for_slot=True)
        return None if cap is None else cap.wait()

    def begin(self, state: TrainingState, step: int, timeout_s: float, midway=None,
              overlap: bool = False, wait_for_slot: bool = False) -> Capture | None:
        """Start copying the state at `step` into a free slot; None if none freed in time.

        Model buffers and the meta blob (what the next forward pass changes) are copied
        before this returns. With `overlap`, parameters and optimizer state are copied in
        the background (a thread on CPU, the side stream on CUDA): the caller must
        `wait()` before anything changes them. Without it, `wait()` returns at once.
        """
        named = state.named_tensors()
        meta = state.meta(step)
        self._ensure_layout(Layout.build(named, len(meta)), len(meta), timeout_s)
        cuda = any(t.is_cuda for _, t in named)
        slot = self._pick(timeout_s, wait_for_slot, cuda)
        if slot is None:
            return None
        cap = Capture(slot, step, len(meta), self._settle)
        lo = self.layout.meta_offset
        slot.array[lo:lo + len(meta)] = np.frombuffer(meta, dtype=np.uint8)
        if cuda and self._stream is None:
            self._stream = torch.cuda.Stream()
        start_copy(cap, list(zip(named, self.layout.items)), set(state.buffer_names()),
                   torch.from_numpy(slot.array), self._stream if cuda else None, overlap, midway, self.clock)
        return cap

    def _settle(self, cap: Capture) -> None:
        """A capture's copy is over (`Capture.wait`): its slot is the latest snapshot, or
        free again if the copy failed."""
        with self.cond:
            cap.slot.filling = False
            if cap.error is None:
                cap.slot.meta_len, cap.slot.step = cap.meta_len, cap.step
                self.latest = cap.slot.index
            self.cond.notify_all()

    def _ensure_layout(self, layout: Layout, meta_len: int, timeout_s: float) -> None:
        """Lay the slots out as ``layout`` if the tensors or the meta blob no longer fit them."""
        if self.layout is None or layout.signature() != self.layout.signature() \
                or meta_len > self.layout.meta_capacity:
            with self.cond:
                self.cond.wait_for(lambda: not any(s.readers or s.pinned or s.filling
                                                   for s in self.slots), timeout=timeout_s)
                self._allocate(layout)

    def receiving(self, manifest: Manifest, timeout_s: float) -> Slot | None:
        """A free slot laid out as ``manifest`` for a replica about to be fetched into it:
        once verified and restored, `kept` makes it this worker's snapshot of that step (a
        spare's first step then takes no snapshot of its own, and the survivor
        re-replicating that step to it deduplicates against it), with no copy beyond the
        fetch's. None if no slot frees in time; `release` it if the fetch fails."""
        meta = next(e for e in manifest.entries if e.name == META)
        self._ensure_layout(Layout.of(manifest), meta.nbytes, timeout_s)
        return self._pick(timeout_s)

    def kept(self, slot: Slot, manifest: Manifest, role: int, rank: int, world_size: int) -> None:
        """The replica fetched into ``slot`` (`receiving`) is verified and restored: it is
        the latest snapshot, published like a captured one."""
        meta = next(e for e in manifest.entries if e.name == META)
        with self.cond:
            slot.filling, slot.meta_len, slot.step = False, meta.nbytes, manifest.step
            self.latest = slot.index
            self.cond.notify_all()
        self.publish_manifest(slot, Manifest(manifest.step, rank, world_size, manifest.entries), role)

    def release(self, slot: Slot) -> None:
        """A `receiving` slot whose fetch failed goes back to the free ones."""
        with self.cond:
            slot.filling, slot.step, slot.manifest = False, -1, None
            self.cond.notify_all()

    def build_manifest(self, slot: Slot, rank: int, world_size: int) -> Manifest:
        """Hash every tensor of a captured slot (called off the training thread)."""
        assert self.layout is not None
        digests = hash_spans(slot.array, [(off, nb) for _, _, _, off, nb in self.layout.items])
        entries = [TensorEntry(n, d, list(s), off, nb, digest)
                   for (n, d, s, off, nb), digest in zip(self.layout.items, digests)]
        lo = self.layout.meta_offset
        entries.append(TensorEntry(META, "uint8", [slot.meta_len], lo, slot.meta_len,
                                   hash_bytes(slot.array[lo:lo + slot.meta_len])))
        return Manifest(slot.step, rank, world_size, entries)

    def overwrite(self, slot: Slot, private: dict[str, bytes]) -> None:
        """Replace a captured slot's meta and buffer bytes (same layout) before hashing."""
        assert self.layout is not None
        where = {n: (off, nb) for n, _, _, off, nb in self.layout.items}
        for name, data in private.items():
            if name == META:
                if len(data) > self.layout.meta_capacity:
                    raise ValueError("meta blob larger than the slot's meta capacity")
                lo = self.layout.meta_offset
                slot.array[lo:lo + len(data)] = np.frombuffer(data, dtype=np.uint8)
                slot.meta_len = len(data)
                continue
            off, nb = where[name]
            if nb != len(data):
                raise ValueError(f"buffer {name!r}: {len(data)} bytes, slot holds {nb}")
            slot.array[off:off + nb] = np.frombuffer(data, dtype=np.uint8)

    def retain(self, index: int, step: int) -> None:
        """Keep slot ``index`` (holding the newest persisted ``step``) out of rotation until
        a newer persist replaces it, so a rollback to that step reads memory. Needs a
        fourth slot: with three, the next capture could wait for the persister."""
        with self.cond:
            if self.n_slots >= 4 and 0 <= index < len(self.slots) \
                    and self.slots[index].step == step:
                self.retained = index
                self.cond.notify_all()

    def find(self, step: int) -> Slot | None:
        """The slot holding ``step`` (None: none). Any thread: under the condition lock
        (re-entrant), as slots are added by the grow thread and change hands."""
        with self.cond:
            return next((s for s in self.slots if s.step == step), None)

    def published(self, step: int) -> tuple[Slot, Manifest] | None:
        """This worker's snapshot of ``step`` and its manifest, once published (None:
        none, or not hashed yet); read together, under the lock."""
        with self.cond:
            slot = self.find(step)
            return None if slot is None or slot.manifest is None else (slot, slot.manifest)

    def published_steps(self) -> set[int]:
        """Steps of this worker's snapshots whose manifests are published."""
        with self.cond:
            return {s.step for s in self.slots if s.step >= 0 and s.manifest is not None}

    def latest_step(self) -> int:
        """The step of the latest snapshot (-1: none)."""
        with self.cond:
            return self.slots[self.latest].step if 0 <= self.latest < len(self.slots) else -1

    def in_use(self) -> bool:
        """A slot is still read (pipeline, replica server) or written by the persister."""
        with self.cond:
            return any(s.readers or s.pinned for s in self.slots)

    def steps(self) -> list[int]:
        with self.cond:
            return sorted(s.step for s in self.slots if s.step >= 0)

    def forget_after(self, step: int) -> None:
        """Drop snapshots newer than a rollback step (they belong to a cancelled future)."""
        with self.cond:
            for s in self.slots:
                if s.step > step and not s.readers and not s.pinned:
                    s.step, s.manifest = -1, None
            if self.retained >= 0 and not 0 <= self.slots[self.retained].step <= step:
                self.retained = -1   # it belonged to the future being thrown away
            keep = self.find(step)
            self.latest = keep.index if keep else -1
