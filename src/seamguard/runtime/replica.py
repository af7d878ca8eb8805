"""Peer replicas over a side channel: each rank keeps its ring predecessor's snapshot.

A plain TCP channel, separate from the training process group, so replication runs on
a background thread without interleaving with the gradient collectives, and a dead
peer only breaks this socket. PUSH sends a snapshot's manifest; the holder answers
which tensors it needs: with deduplication, a tensor whose hash equals the holder's own
snapshot of the same step (all replicated data-parallel state) is kept by reference
and never sent, so only rank-private bytes (RNG, data position) cross the wire. FETCH
streams a held replica to a spare, which verifies every hash before using it.

Frames: 8-byte big-endian length + JSON header, followed by raw tensor bytes in
manifest order. Every socket operation has a timeout.

A holder on the same host as the pusher (both advertise the same address) reads the
tensors it needs from the pusher's shared-memory slot file instead of the socket: one
copy (``pread``) instead of loopback TCP's two and its per-segment work, ~60 % of the
push's CPU (docs/benchmarks.md, fsdp_overhead). The pusher keeps the slot unchanged until
the holder acknowledges, and the holder verifies every tensor's hash either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seamguard.runtime.manifest import Manifest, TensorEntry, hash_bytes
from seamguard.runtime.snapshot import SlotStore
from seamguard.runtime.state import META, with_rank_private


SHM = Path("/dev/shm")
_SLOT_NAME = re.compile(r"[A-Za-z0-9_.-]+-slot[0-9]+")   # SlotStore's slot files


class ReplicaError(Exception):
    """A replica push/fetch failed or a received tensor did not match its hash."""


def _send_json(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">Q", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, into: np.ndarray | None = None) -> bytes | None:
    if into is not None:
        view = memoryview(into)[:n]
        got = 0
        while got < n:
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ReplicaError("peer closed the replica channel")
            got += k
        return None
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ReplicaError("peer closed the replica channel")
        buf += chunk
    return bytes(buf)


def _pread_exact(fd: int, into: np.ndarray, n: int, offset: int) -> None:
    view = memoryview(into)[:n]
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            raise ReplicaError("pusher's slot file ended early")
        got += k


def _recv_json(sock: socket.socket) -> dict:
    (n,) = struct.unpack(">Q", _recv_exact(sock, 8))
    return json.loads(_recv_exact(sock, n))


@dataclass
class HeldReplica:
    step: int
    manifest: Manifest
    # name -> own bytes buffer, or None when kept by reference to the holder's own slot
    data: dict[str, np.ndarray | None]


@dataclass
class ReplicaStore:
    """Replicas this worker holds for other roles: the newest two steps per role.

    Besides full replicas it keeps each role's step-private bytes of every recent step
    (meta blob: RNG, optimizer scalars, data position; and model buffers), pushed at the
    start of each step. With replicated data-parallel parameters and optimizer state,
    those bytes plus the holder's *own* snapshot of the same step are the role's whole
    state at that step (a "live" replica): a spare can restore the step the survivors
    are at, even when the last full snapshot is many steps older.
    """

    slots: SlotStore
    keep: int = 2
    keep_meta: int = 4
    held: dict[int, list[HeldReplica]] = field(default_factory=dict)
    metas: dict[int, dict[int, dict[str, bytes]]] = field(default_factory=dict)
    parts: dict[int, dict[int, dict[str, bytes]]] = field(default_factory=dict)
    """Per role and step, the role's own part of the step's private bytes (RNG states,
    buffers), sent as soon as the step before had done its collectives; completed from
    our own meta blob of that step (`state.with_rank_private`)."""
    pool: dict[tuple[int, str], list[np.ndarray]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _buffer(self, role: int, name: str, nbytes: int, busy: set[int]) -> np.ndarray:
        """A reusable receive buffer (allocated once per role/tensor/position). A held
        replica whose buffer it was is dropped first: its bytes are about to change, and a
        push cut off midway would otherwise leave it listed, torn (a spare choosing it
        fails its hash check). The newest replica's buffers are in ``busy``: it stays."""
        bufs = self.pool.setdefault((role, name), [])
        with self.lock:
            b = next((b for b in bufs if id(b) not in busy and b.size >= nbytes), None)
            if b is None:
                b = np.empty(nbytes, dtype=np.uint8)
                bufs.append(b)
            else:
                self.held[role] = [r for r in self.held.get(role, [])
                                   if not any(d is b for d in r.data.values())]
        return b

    def valid_steps(self, live: bool = False) -> dict[str, list[int]]:
        """Per role, steps whose every by-reference tensor is still in our own slots;
        with ``live``, also steps for which we hold the role's meta and our own hashed
        snapshot of that step."""
        out: dict[str, list[int]] = {}
        own = self.slots.published_steps()
        with self.lock:
            for role, reps in self.held.items():
                out[str(role)] = [r.step for r in reps if self._refs_intact(r)]
            if live:
                for role in set(self.metas) | set(self.parts):
                    known = set(self.metas.get(role, {})) | set(self.parts.get(role, {}))
                    out[str(role)] = sorted(set(out.get(str(role), [])) | (own & known))
        return out

    def forget_after(self, step: int) -> None:
        """Drop replicas and step-private bytes newer than a resume step: after a
        rollback they describe a future that is being thrown away."""
        with self.lock:
            for role in list(self.held):
                self.held[role] = [r for r in self.held[role] if r.step <= step]
            for metas in [*self.metas.values(), *self.parts.values()]:
                for s in [s for s in metas if s > step]:
                    del metas[s]

    def put_meta(self, role: int, step: int, private: dict[str, bytes], part: bool = False) -> None:
        """Keep a role's private bytes of a step (``part``: only its own part of them)."""
        with self.lock:
            m = (self.parts if part else self.metas).setdefault(role, {})
            m[step] = private
            for old in sorted(m)[:-self.keep_meta]:
                del m[old]

    def live_replica(self, role: int, step: int) -> tuple[Manifest, dict[str, bytes]] | None:
        """The role's state at ``step``: our own snapshot's parameters and optimizer state
        with the role's step-private bytes (meta, buffers) in place of ours."""
        with self.lock:
            private = self.metas.get(role, {}).get(step)
            part = self.parts.get(role, {}).get(step)
        mine = self.slots.published(step)
        layout = self.slots.layout   # an immutable record, swapped whole
        if (private is None and part is None) or mine is None or layout is None:
            return None
        own, own_manifest = mine
        if private is None:
            e = next(e for e in own_manifest.entries if e.name == META)
            private = with_rank_private(bytes(own.array[e.offset:e.offset + e.nbytes]), part)
        entries = []
        for e in own_manifest.entries:
            data = private.get(e.name)
            if data is None:
                entries.append(e)
            elif e.name == META:
                if len(data) > layout.meta_capacity:
                    return None
                entries.append(TensorEntry(META, "uint8", [len(data)], e.offset, len(data),
                                           hash_bytes(data)))
            elif len(data) == e.nbytes:
                entries.append(TensorEntry(e.name, e.dtype, e.shape, e.offset, e.nbytes,
                                           hash_bytes(data)))
            else:
                return None   # layouts differ: not data-parallel replicas of one model
        return Manifest(step, own_manifest.rank, own_manifest.world_size, entries), private

    def _refs_intact(self, rep: HeldReplica) -> bool:
        refs = [e for e in rep.manifest.entries if rep.data.get(e.name) is None]
        if not refs:
            return True
        mine = self.slots.published(rep.step)
        if mine is None:
            return False
        own_hash = {e.name: e.xxh3 for e in mine[1].entries}
        return all(own_hash.get(e.name) == e.xxh3 for e in refs)

    def clear(self) -> None:
        with self.lock:
            self.held.clear()
            self.metas.clear()
            self.parts.clear()


class ReplicaServer:
    """Accepts PUSH and FETCH requests on a loopback/cluster address (one thread each)."""

    def __init__(self, store: ReplicaStore, host: str, timeout_s: float, dedup: bool,
                 phases=None) -> None:
        """``phases``: a profile.PhaseClock of the worker's (times receiving pushes)."""
        self.store = store
        self.timeout_s = timeout_s
        self._dedup = threading.Event()   # set by the training thread, read by the server's
        self.dedup = dedup
        self.clock = phases
        self.host = host
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.5)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="sg-replica-server", daemon=True)
        self.thread.start()

    @property
    def dedup(self) -> bool:
        """Pushes carry only what the holder does not hold itself (module docstring)."""
        return self._dedup.is_set()

    @dedup.setter
    def dedup(self, on: bool) -> None:
        (self._dedup.set if on else self._dedup.clear)()

    def _phase(self, name: str):
        """Time the body as ``name`` on the worker's PhaseClock, if it handed one over."""
        return self.clock.phase(name) if self.clock is not None else contextlib.nullcontext()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(self.timeout_s)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                req = _recv_json(conn)
                if req["op"] == "push":
                    with self._phase("bg_replica_receive"):
                        self._on_push(conn, req)
                elif req["op"] == "meta":
                    self._on_meta(conn, req)
                elif req["op"] == "fetch":
                    self._on_fetch(conn, req)
            except (OSError, ReplicaError, ValueError, KeyError):
                return  # the peer will see the broken channel and report it

    def _own_hashes(self, step: int) -> dict[str, str]:
        slots = self.store.slots
        with slots.cond:
            slots.cond.wait_for(lambda: (s := slots.find(step)) is not None
                                and s.manifest is not None, timeout=min(2.0, self.timeout_s))
            own = slots.find(step)
            return {e.name: e.xxh3 for e in own.manifest.entries} if own and own.manifest else {}

    def _open_local(self, local: dict | None) -> int | None:
        """The pusher's slot file, opened for reading, when the pusher is on this host and
        names a snapshot slot (a shared-memory file named like SlotStore's): never any
        other file a peer might name."""
        if not local or local.get("host") != self.host:
            return None
        path = Path(str(local.get("path", "")))
        if path.parent != SHM or not _SLOT_NAME.fullmatch(path.name):
            return None
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None   # gone (its node's memory lost): the socket then

    def _on_push(self, conn: socket.socket, req: dict) -> None:
        src = self._open_local(req.get("local"))
        try:
            self._take_push(conn, req, src)
        finally:
            if src is not None:
                os.close(src)

    def _take_push(self, conn: socket.socket, req: dict, src: int | None) -> None:
        role, manifest = int(req["role"]), Manifest.from_json(req["manifest"])
        own = self._own_hashes(manifest.step) if self.dedup else {}
        need = [e.name for e in manifest.entries if e.name == META or own.get(e.name) != e.xxh3]
        _send_json(conn, {"need": need, "read_locally": src is not None})
        with self.store.lock:
            reps = self.store.held.get(role, [])
            busy = {id(b) for r in reps[-(self.store.keep - 1):] for b in r.data.values()
                    if b is not None} if self.store.keep > 1 else set()
        data: dict[str, np.ndarray | None] = {}
        by_name = {e.name: e for e in manifest.entries}
        for name in need:
            e = by_name[name]
            buf = self.store._buffer(role, name, e.nbytes, busy)
            busy.add(id(buf))
            if src is not None:
                _pread_exact(src, buf, e.nbytes, e.offset)
            else:
                _recv_exact(conn, e.nbytes, into=buf)
            with self._phase("bg_replica_verify"):
                digest = hash_bytes(buf[:e.nbytes])
            if digest != e.xxh3:
                raise ReplicaError(f"replica of role {role} step {manifest.step}: tensor "
                                   f"{name!r} arrived corrupted")
            data[name] = buf
        for e in manifest.entries:
            data.setdefault(e.name, None)
        with self.store.lock:
            reps = [r for r in self.store.held.get(role, []) if r.step != manifest.step]
            reps.append(HeldReplica(manifest.step, manifest, data))
            self.store.held[role] = reps[-self.store.keep:]
        _send_json(conn, {"ok": True})

    def _on_meta(self, conn: socket.socket, req: dict) -> None:
        private: dict[str, bytes] = {}
        for name, nbytes, digest in req["parts"]:
            data = _recv_exact(conn, int(nbytes)) if nbytes else b""
            if hash_bytes(data) != digest:
                raise ReplicaError(f"step-private {name!r} of role {req['role']} step "
                                   f"{req['step']} arrived corrupted")
            private[name] = data
        self.store.put_meta(int(req["role"]), int(req["step"]), private, part=bool(req.get("part")))
        _send_json(conn, {"ok": True})

    def _on_fetch(self, conn: socket.socket, req: dict) -> None:
        role, step = int(req["role"]), int(req["step"])
        slots = self.store.slots
        with self.store.lock:
            rep = next((r for r in self.store.held.get(role, []) if r.step == step), None)
        with slots.cond:
            own = slots.find(step)
            if own is not None:
                own.readers += 1
        try:
            if rep is None:
                live = self.store.live_replica(role, step) if self.dedup else None
                if live is None:
                    _send_json(conn, {"error": f"no replica of role {role} at step {step}"})
                    return
                manifest, private = live
                _send_json(conn, {"manifest": manifest.to_json()})
                for e in manifest.entries:
                    data = private.get(e.name)
                    conn.sendall(data if data is not None else
                                 memoryview(own.array[e.offset:e.offset + e.nbytes]))
                return
            if not self.store._refs_intact(rep):
                _send_json(conn, {"error": f"replica of role {role} step {step} lost its "
                                  "by-reference tensors"})
                return
            _send_json(conn, {"manifest": rep.manifest.to_json()})
            for e in rep.manifest.entries:
                buf = rep.data.get(e.name)
                src = buf[:e.nbytes] if buf is not None else own.array[e.offset:e.offset + e.nbytes]
                conn.sendall(memoryview(src))
        finally:
            with slots.cond:
                if own is not None:
                    own.readers -= 1
                    slots.cond.notify_all()


def push(address: str, role: int, manifest: Manifest, payload: np.ndarray, timeout_s: float,
         midway=None, local: tuple[str, str] | None = None) -> int:
    """Send a snapshot to its holder; returns the bytes the holder took. ``local``: (this
    process's advertised host, the path of the slot file holding ``payload``), so that a
    holder on the same host reads the bytes from the file (module docstring)."""
    host, port = address.rsplit(":", 1)
    sent = 0
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        head = {"op": "push", "role": role, "manifest": manifest.to_json()}
        if local is not None:
            head["local"] = {"host": local[0], "path": local[1]}
        _send_json(sock, head)
        reply = _recv_json(sock)
        need = reply["need"]
        by_name = {e.name: e for e in manifest.entries}
        if reply.get("read_locally"):
            if midway is not None:
                midway()
            sent = sum(by_name[name].nbytes for name in need)
        for i, name in enumerate([] if reply.get("read_locally") else need):
            if midway is not None and i == len(need) // 2:
                midway()
            e = by_name[name]
            sock.sendall(memoryview(payload[e.offset:e.offset + e.nbytes]))
            sent += e.nbytes
        if not _recv_json(sock).get("ok"):
            raise ReplicaError(f"holder {address} refused replica of step {manifest.step}")
    return sent


def push_meta(address: str, role: int, step: int, private: dict[str, bytes],
              timeout_s: float, part: bool = False) -> None:
    """Send one step's private bytes of ``role`` (meta, buffers; small) to its holder;
    ``part``: only the role's own part of them (`TrainingState.rank_private`)."""
    host, port = address.rsplit(":", 1)
    parts = [(name, len(data), hash_bytes(data)) for name, data in private.items()]
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        _send_json(sock, {"op": "meta", "role": role, "step": step, "parts": parts, "part": part})
        for data in private.values():
            if data:
                sock.sendall(data)
        if not _recv_json(sock).get("ok"):
            raise ReplicaError(f"holder {address} refused step-private bytes of step {step}")


def fetch(address: str, role: int, step: int, timeout_s: float,
          into: Callable[[Manifest], np.ndarray | None] | None = None) -> tuple[Manifest, np.ndarray]:
    """Fetch role's replica at step from its holder, verifying every tensor's hash.
    ``into(manifest)``: where to receive it (at the manifest's offsets; None: a new array)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        _send_json(sock, {"op": "fetch", "role": role, "step": step})
        head = _recv_json(sock)
        if "error" in head:
            raise ReplicaError(f"holder {address}: {head['error']}")
        manifest = Manifest.from_json(head["manifest"])
        payload = into(manifest) if into is not None else None
        if payload is None:
            payload = np.empty(manifest.total_bytes, dtype=np.uint8)
        for e in manifest.entries:
            _recv_exact(sock, e.nbytes, into=payload[e.offset:e.offset + e.nbytes])
            if hash_bytes(payload[e.offset:e.offset + e.nbytes]) != e.xxh3:
                raise ReplicaError(f"replica of role {role} step {step} from {address}: "
                                   f"tensor {e.name!r} failed its hash check")
    return manifest, payload
