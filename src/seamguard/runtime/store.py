"""The job-wide store on etcd, and the choice between it and the TCPStore.

`seamguard launch --store etcd://host:port[,host:port…]` puts every key of keys.py in an
etcd cluster instead of the TCPStore that node 0's launcher hosts, so the job's
membership survives the loss of any one node (etcd replicates it by Raft; we add no
consensus of our own). TorchElastic's etcd rendezvous made the same choice.

Client: aetcd, a maintained client of etcd's v3 gRPC API (runtime/etcd_client.py: on an
event loop of its own thread, every call bounded, the next endpoint tried when one is
unavailable); the requests are etcd's own KV, Lease and Watch messages. Why not torch's
``EtcdStore``: it needs python-etcd, a client of the v2 API that is unmaintained since
2018 and whose API etcd 3.6 removed. Before aetcd this module spoke etcd's JSON gateway
by hand-written HTTP; the messages are the same.

`EtcdStore` is a ``torch.distributed.Store``, so gloo can rendezvous through it
(wrapped in a PrefixStore, as every generation's group does). `wait` and `get` block on
an etcd watch, not a polling loop: an idle spare costs the store nothing while it waits.
Importing this module needs torch (the launcher and workers have it).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import socket
import threading
import time

import torch.distributed as dist

from seamguard.runtime.etcd_client import Endpoints, StoreError  # noqa: F401 (StoreError re-exported)
from seamguard.runtime.settings import StoreUrl, parse_store_url  # noqa: F401 (re-exported)

DEFAULT_TIMEOUT_S = 300.0
LOST = (StoreError, dist.DistError)
"""What a launcher's store call raises when the job-wide store is gone: etcd unreachable,
or node 0's TCPStore closed with node 0 (a broken pipe, a reset connection)."""
REQUEST_TIMEOUT_S = 10.0


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for "every key starting with prefix"."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _rpc():
    from aetcd import rpc   # etcd's v3 protobuf messages and stubs, as aetcd ships them

    return rpc


def _range(key: bytes, prefix: bool = False, **opts):
    return _rpc().RangeRequest(key=key, range_end=_prefix_end(key) if prefix else b"", **opts)


def _put(key: bytes, value: bytes, lease: int | None = None):
    return _rpc().PutRequest(key=key, value=value, lease=lease or 0)


def _absent(key: bytes):
    """The comparison 'key was never created' (create_revision == 0)."""
    rpc = _rpc()
    return rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)


async def _range_prefix(client, full: bytes):
    return await client.kvstub.Range(_range(full, prefix=True), timeout=client._timeout, metadata=client.metadata)


class EtcdStore(dist.Store):
    """A c10d Store whose keys live in etcd under ``prefix`` (see module docstring)."""

    def __init__(self, endpoints: tuple[tuple[str, int], ...], prefix: str,
                 timeout: datetime.timedelta = datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)) -> None:
        super().__init__()
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self.prefix = _bytes(prefix)
        self._timeout = timeout
        self._etcd = Endpoints(self.endpoints, request_timeout_s=REQUEST_TIMEOUT_S)

    @property
    def requests(self) -> collections.Counter[str]:
        """Requests this handle sent, by kind (watch streams not counted): what a pass or a
        node beat costs etcd, for tests and profiling."""
        return self._etcd.requests

    def _full(self, key: str | bytes) -> bytes:
        return self.prefix + _bytes(key)

    def _kv(self, name: str, method: str, request):
        """One KV request (``method`` of etcd's KV service) and its reply."""
        return self._etcd.call(name, lambda c: getattr(c.kvstub, method)(request, timeout=c._timeout,
                                                                         metadata=c.metadata))

    def _txn(self, compare: list, success: list, failure: list = ()):
        rpc = _rpc()
        return self._kv("txn", "Txn", rpc.TxnRequest(compare=compare, success=success, failure=list(failure)))

    # --------------------------------------------------------------- c10d Store API
    def set(self, key: str, value: str | bytes) -> None:
        self.put(key, value)

    def get(self, key: str) -> bytes:
        """The value, waiting (up to the store's timeout) for the key to be set."""
        found = self._get_or_revision(key)
        if isinstance(found, bytes):
            return found
        self._wait_one(key, found, self._timeout.total_seconds())
        found = self._get_or_revision(key)
        if not isinstance(found, bytes):
            raise dist.DistStoreError(f"etcd: key {key!r} was deleted while being waited for")
        return found

    def add(self, key: str, num: int) -> int:
        """Atomic add by compare-and-swap on the key's revision (etcd has no counters)."""
        rpc = _rpc()
        full = self._full(key)
        for _ in range(1000):
            kvs = self._kv("range", "Range", _range(full)).kvs
            if kvs:
                current = int(kvs[0].value)
                cmp = rpc.Compare(key=full, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                                  mod_revision=kvs[0].mod_revision)
            else:
                current, cmp = 0, _absent(full)
            value = current + num
            if self._txn([cmp], [rpc.RequestOp(request_put=_put(full, str(value).encode()))]).succeeded:
                return value
        raise StoreError(f"etcd add {key!r}: 1000 compare-and-swap conflicts in a row")

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        rpc = _rpc()
        full, exp = self._full(key), _bytes(expected)
        cmp = _absent(full) if not exp else rpc.Compare(key=full, target=rpc.Compare.VALUE,
                                                         result=rpc.Compare.EQUAL, value=exp)
        reply = self._txn([cmp], [rpc.RequestOp(request_put=_put(full, _bytes(desired)))],
                          [rpc.RequestOp(request_range=_range(full))])
        if reply.succeeded:
            return _bytes(desired)
        kvs = reply.responses[0].response_range.kvs
        return bytes(kvs[0].value) if kvs else exp

    def check(self, keys: list[str]) -> bool:
        return all(isinstance(self._get_or_revision(k), bytes) for k in keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        """Block until every key exists (an etcd watch per missing key, no polling)."""
        budget_s = (timeout or self._timeout).total_seconds()
        deadline = time.monotonic() + budget_s
        for key in keys:
            found = self._get_or_revision(key)
            if not isinstance(found, bytes):
                self._wait_one(key, found, deadline - time.monotonic())

    def delete_key(self, key: str) -> bool:
        return self._kv("deleterange", "DeleteRange", _rpc().DeleteRangeRequest(key=self._full(key))).deleted > 0

    def num_keys(self) -> int:
        return int(self._kv("range", "Range", _range(self.prefix, prefix=True, count_only=True)).count)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout

    # --------------------------------------------------------------- beyond c10d
    def put(self, key: str, value: str | bytes, lease: int | None = None) -> int:
        """Set a key (optionally bound to a lease); returns the store's revision after it,
        which is the key's mod_revision (a PrefixMirror shows the write once it has it)."""
        return int(self._kv("put", "Put", _put(self._full(key), _bytes(value), lease)).header.revision)

    def peek(self, key: str) -> bytes | None:
        """The key's value, or None when it is not set (one request, no waiting)."""
        found = self._get_or_revision(key)
        return found if isinstance(found, bytes) else None

    def put_and_read(self, key: str | None, value: str | bytes, singles: list[str], prefixes: list[str],
                     versions: tuple[str, ...] = ()) -> tuple[dict[str, bytes | None], dict[str, dict[str, bytes]]]:
        """Write one key (none when ``key`` is None: a node whose record went over its link)
        and read others in one request (one etcd transaction): a node
        beat's record, and the generation, kill requests and job end it must notice.
        Returns ({key: value or None}, {prefix: {key: value}}); a key of ``versions`` is
        read without its value and answered with its revision (b"<mod_revision>"): enough
        to see it change, without shipping node 0's record to every node every beat."""
        rpc = _rpc()
        ops = [] if key is None else [rpc.RequestOp(request_put=_put(self._full(key), _bytes(value)))]
        ops += [rpc.RequestOp(request_range=_range(self._full(k))) for k in singles]
        ops += [rpc.RequestOp(request_range=_range(self._full(k), keys_only=True)) for k in versions]
        ops += [rpc.RequestOp(request_range=_range(self._full(p), prefix=True)) for p in prefixes]
        replies = [r.response_range for r in self._txn([], ops).responses[0 if key is None else 1:]]
        cut = len(self.prefix)

        def kvs(reply) -> dict[str, bytes]:
            return {bytes(kv.key)[cut:].decode(): bytes(kv.value) for kv in reply.kvs}

        one = {k: kvs(r).get(k) for k, r in zip(singles, replies)}
        for k, r in zip(versions, replies[len(singles):]):
            one[k] = str(r.kvs[0].mod_revision).encode() if r.kvs else None
        many = {p: kvs(r) for p, r in zip(prefixes, replies[len(singles) + len(versions):])}
        return one, many

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every key under ``prefix`` (relative names) and its value, in one request."""
        return self._range_prefix_revisions(prefix)[0]

    def _range_prefix_revisions(self, prefix: str) -> tuple[dict[str, bytes], dict[str, int], int]:
        """({key: value}, {key: its mod_revision}, the store's revision) under ``prefix``."""
        return self._unpack(self._kv("range", "Range", _range(self._full(prefix), prefix=True)))

    def _unpack(self, reply) -> tuple[dict[str, bytes], dict[str, int], int]:
        cut = len(self.prefix)
        kvs = [(bytes(kv.key)[cut:].decode(), kv) for kv in reply.kvs]
        return ({k: bytes(kv.value) for k, kv in kvs}, {k: int(kv.mod_revision) for k, kv in kvs},
                int(reply.header.revision))

    def mirror(self, prefix: str) -> PrefixMirror:
        """A local copy of every key under ``prefix``, kept current by one watch stream."""
        return PrefixMirror(self, prefix)

    def grant_lease(self, ttl_s: int) -> int:
        """A lease that expires ``ttl_s`` seconds (etcd's minimum applies) after its last keep-alive."""
        return int(self._etcd.call("lease_grant", lambda c: c.lease(ttl_s)).id)

    def keep_alive(self, lease: int, timeout_s: float | None = None) -> float:
        """Renew a lease; returns its remaining TTL in seconds (0: it had already expired).
        ``timeout_s`` bounds the call (default: the store's request timeout)."""
        reply = self._etcd.call("lease_keepalive", lambda c: c.refresh_lease(lease), timeout_s)
        return float(reply.TTL) if reply is not None else 0.0

    def revoke(self, lease: int) -> None:
        self._etcd.call("lease_revoke", lambda c: c.revoke_lease(lease))

    def put_if_absent(self, key: str, value: str | bytes, lease: int | None = None) -> int:
        """Create ``key`` only if nobody has: the primitive of an election. The key's create
        revision if we did (an election's fencing token), else 0."""
        full = self._full(key)
        reply = self._txn([_absent(full)], [_rpc().RequestOp(request_put=_put(full, _bytes(value), lease))])
        return int(reply.header.revision) if reply.succeeded else 0

    def put_fenced(self, key: str, value: str | bytes, guard: str, token: int) -> int:
        """Set ``key`` only while ``guard`` is the key created at revision ``token`` (an
        elected coordinator's write, runtime/election.py), in one transaction: the store's
        revision after it (as `put`), or 0, and nothing written, once another holds
        ``guard`` or nobody does."""
        rpc = _rpc()
        cmp = rpc.Compare(key=self._full(guard), target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                          create_revision=token)
        reply = self._txn([cmp], [rpc.RequestOp(request_put=_put(self._full(key), _bytes(value)))])
        return int(reply.header.revision) if reply.succeeded else 0

    def close(self) -> None:
        self._etcd.close()

    # --------------------------------------------------------------- internals
    def _get_or_revision(self, key: str) -> bytes | int:
        """The key's value, or (absent) the store revision to start watching after."""
        reply = self._kv("range", "Range", _range(self._full(key)))
        return bytes(reply.kvs[0].value) if reply.kvs else int(reply.header.revision)

    def _wait_one(self, key: str, revision: int, timeout_s: float) -> None:
        """Block on a watch until ``key`` is created after ``revision``, or time out."""
        if timeout_s <= 0:
            raise dist.DistStoreError(f"etcd: timed out waiting for key {key!r}")
        full = self._full(key)

        async def created(client) -> bool:
            watch = await client.watch(full, start_revision=revision + 1)
            try:
                async def first_put() -> bool:
                    async for event in watch:
                        if event.kind == "PUT":
                            return True
                    return False
                return await asyncio.wait_for(first_put(), timeout_s)
            except asyncio.TimeoutError:
                return False
            finally:
                await watch.cancel()
        if not self._etcd.call("watch", created, timeout_s=timeout_s + REQUEST_TIMEOUT_S):
            raise dist.DistStoreError(f"etcd: timed out after {timeout_s:.1f}s waiting for key {key!r}")


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``host`` only (port 0: any free one), for a
    TCPStore server to take over (``master_listen_fd``): torch's own server listens on
    every interface, whatever host it is given."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def connect(url: StoreUrl, host: str, port: int, timeout_s: float, is_master: bool = False,
            listen_fd: int | None = None) -> dist.Store:
    """The job-wide store a process of the job talks to: etcd, or node 0's TCPStore
    (``listen_fd``: the server listens on that socket, see listen_socket)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if url.kind == "etcd":
        return EtcdStore(url.endpoints, url.prefix, timeout)
    return dist.TCPStore(host, port, None, is_master, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=listen_fd)


class PrefixMirror:
    """The latest value of every key under a prefix, kept by one etcd watch stream.

    The coordinator reads the node records, exit codes and done marks of the whole job
    every tick; reading them from this copy costs etcd nothing per tick (each change
    arrives once, when written) where a range read per tick would send every record again
    every 5 ms. A broken stream (or a compaction past the copy's revision) is followed by
    reading the prefix afresh and watching again from there, on the next endpoint when
    the stream's failed. ``get_prefix`` answers like EtcdStore's; ``revision_of`` tells
    how new the copy of a key is (a writer that must not act on its own overwritten value
    again compares it with the revision its write returned). The stream runs on the
    store's etcd thread; readers take the copy's lock.
    """

    def __init__(self, store: EtcdStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix
        self._values, self._revisions, self._revision = store._range_prefix_revisions(prefix)
        self._lock = threading.Lock()
        self._task = store._etcd.io.submit(self._follow())

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        with self._lock:
            return {k: v for k, v in self._values.items() if k.startswith(prefix)}

    def get(self, key: str) -> bytes | None:
        """The copy's value of ``key`` (None: it does not hold it)."""
        with self._lock:
            return self._values.get(key)

    def revision_of(self, key: str) -> int:
        """The mod_revision of the copy's value of ``key`` (0: the copy does not hold it)."""
        with self._lock:
            return self._revisions.get(key, 0)

    def close(self) -> None:
        """Stop following (the stream is cancelled on the etcd thread)."""
        self._task.cancel()

    async def _follow(self) -> None:
        etcd, fresh = self.store._etcd, False
        while True:
            at = etcd._at
            client = etcd.client(at)
            try:
                await client.connect()
                if fresh:
                    values, revisions, revision = self.store._unpack(
                        await _range_prefix(client, self.store._full(self.prefix)))
                    with self._lock:
                        self._values, self._revisions, self._revision = values, revisions, revision
                await self._stream(client)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a broken stream, a compaction, an endpoint down: read afresh
                etcd._next(at)
            fresh = True
            await asyncio.sleep(0.05)

    async def _stream(self, client) -> None:
        start = self.store._full(self.prefix)
        watch = await client.watch(start, range_end=_prefix_end(start), start_revision=self._revision + 1)
        cut = len(self.store.prefix)
        try:
            async for event in watch:
                kv = event.kv
                key = bytes(kv.key)[cut:].decode()
                with self._lock:
                    if event.kind == "DELETE":
                        self._values.pop(key, None)
                        self._revisions.pop(key, None)
                    else:
                        self._values[key] = bytes(kv.value)
                        self._revisions[key] = int(kv.mod_revision)
                    self._revision = max(self._revision, int(kv.mod_revision))
        finally:
            await watch.cancel()
