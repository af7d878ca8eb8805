"""The snapshot pipeline: a snapshot's way from host memory to its replica holder and storage.

Off the training thread (runtime/worker.py) a snapshot copied into a host slot is hashed
(its manifest published beside the slot), pushed to the rank's replica holder and, at a
persist point, handed to the persister process (runtime/persist.py), which writes it to
the checkpoint directory and answers on a thread of its own. The training thread hands
each snapshot over as one immutable :class:`Handoff` that carries everything the pipeline
needs (step, generation, rank, role, holder, persist target); the pipeline reads nothing
of the training thread but the generation in the published Progress record
(runtime/records.py), and publishes the newest persisted step there. It also keeps an
idle hot spare's one page-locked slot made ahead (``prepare_spare_slot``, called by the
heartbeat thread).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch.distributed as dist

from seamguard.runtime import keys, replica
from seamguard.runtime.capture import Capture
from seamguard.runtime.chaos import Injector
from seamguard.runtime.profile import PhaseClock
from seamguard.runtime.records import Board, Progress
from seamguard.runtime.settings import RuntimeSettings
from seamguard.runtime.snapshot import SlotStore


@dataclass(frozen=True)
class Handoff:
    """One snapshot handed to the pipeline: its slot (or a capture still copying), the
    step it must still hold, and where the rank stood when it was taken."""

    source: object
    """A snapshot.Slot, or a capture.Capture still copying (the pipeline waits for it)."""
    step: int
    gen: int
    rank: int
    role: int
    world_size: int
    holder: int = -1
    """The worker holding this rank's replica (-1: none, a world of one)."""
    persist: Path | None = None
    """The directory to persist it to (None: replicate only)."""


class SnapshotPipeline:
    """The pipeline thread, the persister process and its reply thread (module docstring)."""

    def __init__(self, slots: SlotStore, settings: RuntimeSettings, progress: Board[Progress],
                 side_store: Callable[[], dist.Store], local_host: str, injector: Injector,
                 note: Callable[..., None], phases: PhaseClock, run_id: str) -> None:
        """``side_store`` opens the pipeline thread's own store connection (when first
        needed); ``local_host``: this process's advertised host (a holder on it reads the
        slot's file); ``note`` records an event; ``run_id`` names the job's slots in /dev/shm."""
        self.slots, self.settings, self.progress = slots, settings, progress
        self._connect, self._host = side_store, local_host
        self._injector, self._note, self._phases = injector, note, phases
        self._run_id = run_id
        self._queue: queue.Queue = queue.Queue()
        self._store: dist.Store | None = None
        self._push_target: tuple[int, int, str] = (-1, -1, "")  # (gen, holder, its address)
        self._persister: subprocess.Popen | None = None   # under _proc_lock: started by two threads
        self._proc_lock = threading.Lock()
        self._pending: dict[int, int] = {}  # slot index -> step, while the persister writes it (under slots.cond)
        self._counts_lock = threading.Lock()
        self._counts = {"replica_bytes_sent": 0, "persisted": 0, "persist_errors": 0}
        self.spare_model_on_gpu = threading.Event()   # set by the training thread at register()
        threading.Thread(target=self._loop, name="sg-snapshot-pipeline", daemon=True).start()

    # ---------------------------------------------------------------- the training thread's side
    def put(self, handoff: Handoff) -> None:
        """Hand a snapshot over; its slot must already count the pipeline as a reader."""
        self._queue.put(handoff)

    def busy(self) -> bool:
        """Snapshots handed over and not yet through the pipeline."""
        with self._queue.mutex:
            return bool(self._queue.unfinished_tasks)

    def unsettled(self) -> bool:
        """Snapshots still on their way to the holder or to storage; False once the
        persister died (its failure is noted, training goes on)."""
        with self._proc_lock:
            if self._persister is not None and self._persister.poll() is not None:
                return False
        with self.slots.cond:
            pending = bool(self._pending)
        return self.busy() or pending

    def counts(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self._counts)

    def close(self, timeout_s: float) -> None:
        """Stop the pipeline thread and let the persister finish (bounded)."""
        self._queue.put(None)
        with self._proc_lock:
            proc = self._persister
        if proc is not None and proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()

    # ---------------------------------------------------------------- the pipeline thread
    def _loop(self) -> None:
        """Off the training thread: hash, replicate to the holder, hand to the persister."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            slot, cap = item.source, None
            if isinstance(slot, Capture):   # handed over while still copying
                cap, slot = slot, slot.slot
            try:
                if cap is not None:
                    cap.wait()
                if not self._holds(slot, item.step):
                    continue
                with self._phases.phase("bg_hash"):
                    manifest = self.slots.build_manifest(slot, item.rank, item.world_size)
                self.slots.publish_manifest(slot, manifest, item.role)
                with self._phases.phase("bg_push"):
                    self._replicate(slot, manifest, item)
                if item.persist is not None and self._holds(slot, item.step):
                    self._persist(slot, manifest, item.persist)
            except (OSError, replica.ReplicaError, ValueError, RuntimeError) as exc:
                self._note("replication_failed", step=item.step, error=str(exc)[:200])
            finally:
                with self.slots.cond:
                    slot.readers -= 1
                    self.slots.cond.notify_all()
                self._queue.task_done()

    def _holds(self, slot, step: int) -> bool:
        """The slot still holds ``step`` (read under the store's lock: the training
        thread's rollbacks and captures change slots' steps)."""
        with self.slots.cond:
            return slot.step == step

    def _replicate(self, slot, manifest, item: Handoff) -> None:
        if item.holder < 0 or item.gen != self.progress.current.gen or item.world_size < 2:
            return
        if self._push_target[:2] != (item.gen, item.holder):   # looked up once per generation, not per push
            self._store = self._store or self._connect()
            self._push_target = (item.gen, item.holder, self._store.get(keys.worker_addr(item.holder)).decode())
        sent = replica.push(self._push_target[2], item.role, manifest, slot.array, self.settings.replica_timeout_s,
                            midway=lambda: self._injector.maybe_fire("replicate", item.rank, manifest.step),
                            local=(self._host, str(slot.path)))
        with self._counts_lock:
            self._counts["replica_bytes_sent"] += sent

    # ---------------------------------------------------------------- the persister
    def start_persister(self) -> subprocess.Popen:
        """The persister process, started (again, if it died) now: by the training thread
        at register(), by the pipeline thread at a persist."""
        with self._proc_lock:
            if self._persister is None or self._persister.poll() is not None:
                if self._persister is not None:
                    self._note("persister_restarted", code=self._persister.returncode)
                    with self.slots.cond:
                        for idx in self._pending:
                            self.slots.slots[idx].pinned = False
                        self._pending.clear()
                        self.slots.cond.notify_all()
                self._persister = subprocess.Popen(
                    [sys.executable, "-m", "seamguard.runtime.persist"], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, text=True, bufsize=1)
                threading.Thread(target=self._replies, args=(self._persister,), daemon=True).start()
            return self._persister

    def _persist(self, slot, manifest, root: Path) -> None:
        proc = self.start_persister()
        with self.slots.cond:
            slot.pinned = True
            self._pending[slot.index] = manifest.step
        req = {"slot": slot.index, "slot_path": str(slot.path), "manifest": manifest.to_json(),
               "dir": str(root), "keep": self.settings.keep_checkpoints}
        try:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            with self.slots.cond:
                slot.pinned = False
                self._pending.pop(slot.index, None)

    def _replies(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            reply = json.loads(line)
            with self.slots.cond:   # retained before a capture can pick the unpinned slot
                self.slots.slots[reply["slot"]].pinned = False
                self._pending.pop(reply["slot"], None)
                if reply["ok"]:
                    self.slots.retain(reply["slot"], reply["step"])
                self.slots.cond.notify_all()
            with self._counts_lock:
                self._counts["persisted" if reply["ok"] else "persist_errors"] += 1
            if reply["ok"]:
                step = int(reply["step"])
                self.progress.swap(lambda p: dataclasses.replace(p, persisted_step=max(p.persisted_step, step)))
            else:
                self._note("persist_failed", step=reply["step"], error=reply["error"])

    # ---------------------------------------------------------------- an idle spare (heartbeat thread)
    def prepare_spare_slot(self) -> None:
        """An idle hot spare whose model is on a GPU keeps one page-locked snapshot slot of
        the size of its node's ranks' snapshots made ahead (`SlotStore.prepare`): the
        first snapshot after it takes over a rank then does not stall that step for the
        seconds page-locking takes. The sizes are read from the ranks' published slots in
        /dev/shm (a file with a manifest beside it); a spare without a model yet (FSDP2's
        spares build theirs once they know their rank) or on the CPU makes none."""
        if not self.spare_model_on_gpu.is_set():
            return
        own = self.slots.prefix + "-slot"
        sizes = []
        for side in Path("/dev/shm").glob(f"seamguard-{self._run_id}-*-slot*.json"):
            slot = side.with_name(side.name[:-len(".json")])
            if not slot.name.startswith(own):
                try:
                    sizes.append(slot.stat().st_size)
                except OSError:
                    continue   # freed meanwhile
        if sizes:
            self.slots.prepare(max(sizes))
