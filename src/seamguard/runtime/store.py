"""The job-wide store on etcd, and the choice between it and the TCPStore.

`seamguard launch --store etcd://host:port[,host:port…]` puts every key of keys.py in an
etcd cluster instead of the TCPStore that node 0's launcher hosts, so the job's
membership survives the loss of any one node (etcd replicates it by Raft; we add no
consensus of our own). TorchElastic's etcd rendezvous made the same choice.

Client: etcd's own v3 JSON gateway (``/v3/kv/*``, ``/v3/watch``, ``/v3/lease/*``,
served by every etcd >= 3.4 on its client port), spoken with the standard library's
http.client. Why not torch's ``EtcdStore``: it needs python-etcd, a client of the v2
API that is unmaintained since 2018 and whose API etcd 3.6 removed; a gRPC v3 client
(aetcd, etcd3) pins its own protobuf/grpcio next to torch's. The gateway is etcd's
documented v3 interface (https://etcd.io/docs/v3.4/dev-guide/api_grpc_gateway/).

`EtcdStore` is a ``torch.distributed.Store``, so gloo can rendezvous through it
(wrapped in a PrefixStore, as every generation's group does). `wait` and `get` block on
an etcd watch, not a polling loop: an idle spare costs the store nothing while it waits.
Importing this module needs torch (the launcher and workers have it).
"""

from __future__ import annotations

import base64
import collections
import datetime
import http.client
import json
import socket
import threading
import time

import torch.distributed as dist

from seamguard.runtime.settings import StoreUrl, parse_store_url  # noqa: F401 (re-exported)

DEFAULT_TIMEOUT_S = 300.0


class StoreError(RuntimeError):
    """The etcd cluster did not answer (every endpoint tried) or answered with an error."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


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


class _Gateway:
    """One keep-alive HTTP connection to the first etcd endpoint that answers."""

    def __init__(self, endpoints: tuple[tuple[str, int], ...], request_timeout_s: float) -> None:
        self.endpoints = endpoints
        self.request_timeout_s = request_timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._at = 0
        self._lock = threading.Lock()
        self.requests: collections.Counter[str] = collections.Counter()   # path -> requests sent

    def call(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        with self._lock:
            self.requests[path] += 1
            last: Exception | None = None
            for _ in range(2 * len(self.endpoints)):
                try:
                    if self._conn is None:
                        host, port = self.endpoints[self._at]
                        self._conn = http.client.HTTPConnection(host, port, timeout=self.request_timeout_s)
                    self._conn.request("POST", path, data, {"Content-Type": "application/json"})
                    resp = self._conn.getresponse()
                    payload = resp.read()
                except (OSError, http.client.HTTPException) as exc:
                    last = exc
                    self._drop()
                    continue
                reply = json.loads(payload or b"{}")
                if resp.status != 200:
                    raise StoreError(f"etcd {path}: HTTP {resp.status}: {reply.get('message', payload[:200])}")
                return reply
            raise StoreError(f"etcd {path}: no endpoint of {list(self.endpoints)} answered ({last})")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._at = (self._at + 1) % len(self.endpoints)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


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
        self._gw = _Gateway(self.endpoints, request_timeout_s=10.0)

    @property
    def requests(self) -> collections.Counter[str]:
        """Requests this handle sent, by gateway path (watch streams not counted): what a
        pass or a node beat costs etcd, for tests and profiling."""
        return self._gw.requests

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
        full = _b64(self.prefix + _bytes(key))
        for _ in range(1000):
            reply = self._gw.call("/v3/kv/range", {"key": full})
            kvs = reply.get("kvs", [])
            if kvs:
                current = int(base64.b64decode(kvs[0]["value"]))
                cmp = {"key": full, "target": "MOD", "result": "EQUAL", "mod_revision": kvs[0]["mod_revision"]}
            else:
                current = 0
                cmp = {"key": full, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
            value = current + num
            txn = {"compare": [cmp], "success": [{"request_put": {"key": full, "value": _b64(str(value).encode())}}]}
            if self._gw.call("/v3/kv/txn", txn).get("succeeded"):
                return value
        raise StoreError(f"etcd add {key!r}: 1000 compare-and-swap conflicts in a row")

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        full = _b64(self.prefix + _bytes(key))
        exp = _bytes(expected)
        cmp = ({"key": full, "target": "CREATE", "result": "EQUAL", "create_revision": "0"} if not exp
               else {"key": full, "target": "VALUE", "result": "EQUAL", "value": _b64(exp)})
        txn = {"compare": [cmp], "success": [{"request_put": {"key": full, "value": _b64(_bytes(desired))}}],
               "failure": [{"request_range": {"key": full}}]}
        reply = self._gw.call("/v3/kv/txn", txn)
        if reply.get("succeeded"):
            return _bytes(desired)
        kvs = reply["responses"][0]["response_range"].get("kvs", [])
        return base64.b64decode(kvs[0]["value"]) if kvs else exp

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
        reply = self._gw.call("/v3/kv/deleterange", {"key": _b64(self.prefix + _bytes(key))})
        return int(reply.get("deleted", 0)) > 0

    def num_keys(self) -> int:
        reply = self._gw.call("/v3/kv/range", {"key": _b64(self.prefix), "range_end": _b64(_prefix_end(self.prefix)),
                                               "count_only": True})
        return int(reply.get("count", 0))

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout

    # --------------------------------------------------------------- beyond c10d
    def put(self, key: str, value: str | bytes, lease: int | None = None) -> int:
        """Set a key (optionally bound to a lease); returns the store's revision after it,
        which is the key's mod_revision (a PrefixMirror shows the write once it has it)."""
        body = {"key": _b64(self.prefix + _bytes(key)), "value": _b64(_bytes(value))}
        if lease is not None:
            body["lease"] = str(lease)
        return int(self._gw.call("/v3/kv/put", body)["header"]["revision"])

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
        ops = [] if key is None else [{"request_put": {"key": _b64(self.prefix + _bytes(key)),
                                                       "value": _b64(_bytes(value))}}]
        ops += [{"request_range": {"key": _b64(self.prefix + _bytes(k))}} for k in singles]
        ops += [{"request_range": {"key": _b64(self.prefix + _bytes(k)), "keys_only": True}} for k in versions]
        for p in prefixes:
            start = self.prefix + _bytes(p)
            ops.append({"request_range": {"key": _b64(start), "range_end": _b64(_prefix_end(start))}})
        replies = self._gw.call("/v3/kv/txn", {"success": ops})["responses"][0 if key is None else 1:]
        cut = len(self.prefix)

        def kvs(reply: dict) -> dict[str, bytes]:
            return {base64.b64decode(kv["key"])[cut:].decode(): base64.b64decode(kv.get("value", ""))
                    for kv in reply["response_range"].get("kvs", [])}

        one = {k: kvs(r).get(k) for k, r in zip(singles, replies)}
        for k, r in zip(versions, replies[len(singles):]):
            found = r["response_range"].get("kvs", [])
            one[k] = str(found[0]["mod_revision"]).encode() if found else None
        many = {p: kvs(r) for p, r in zip(prefixes, replies[len(singles) + len(versions):])}
        return one, many

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every key under ``prefix`` (relative names) and its value, in one request."""
        return self._range_prefix(prefix)[0]

    def _range_prefix(self, prefix: str) -> tuple[dict[str, bytes], int]:
        values, _, revision = self._range_prefix_revisions(prefix)
        return values, revision

    def _range_prefix_revisions(self, prefix: str) -> tuple[dict[str, bytes], dict[str, int], int]:
        """({key: value}, {key: its mod_revision}, the store's revision) under ``prefix``."""
        start = self.prefix + _bytes(prefix)
        reply = self._gw.call("/v3/kv/range", {"key": _b64(start), "range_end": _b64(_prefix_end(start))})
        cut = len(self.prefix)
        kvs = [(base64.b64decode(kv["key"])[cut:].decode(), kv) for kv in reply.get("kvs", [])]
        values = {k: base64.b64decode(kv.get("value", "")) for k, kv in kvs}
        revisions = {k: int(kv["mod_revision"]) for k, kv in kvs}
        return values, revisions, int(reply["header"]["revision"])

    def mirror(self, prefix: str) -> PrefixMirror:
        """A local copy of every key under ``prefix``, kept current by one watch stream."""
        return PrefixMirror(self, prefix)

    def grant_lease(self, ttl_s: int) -> int:
        """A lease that expires ``ttl_s`` seconds (etcd's minimum applies) after its last keep-alive."""
        return int(self._gw.call("/v3/lease/grant", {"TTL": str(ttl_s)})["ID"])

    def keep_alive(self, lease: int) -> float:
        """Renew a lease; returns its remaining TTL in seconds (0: it had already expired)."""
        reply = self._gw.call("/v3/lease/keepalive", {"ID": str(lease)})
        return float(reply.get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        self._gw.call("/v3/lease/revoke", {"ID": str(lease)})

    def put_if_absent(self, key: str, value: str | bytes, lease: int | None = None) -> bool:
        """Create ``key`` only if nobody has: the primitive of an election. True if we did."""
        full = _b64(self.prefix + _bytes(key))
        put = {"key": full, "value": _b64(_bytes(value))}
        if lease is not None:
            put["lease"] = str(lease)
        txn = {"compare": [{"key": full, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
               "success": [{"request_put": put}]}
        return bool(self._gw.call("/v3/kv/txn", txn).get("succeeded"))

    def close(self) -> None:
        self._gw.close()

    # --------------------------------------------------------------- internals
    def _get_or_revision(self, key: str) -> bytes | int:
        """The key's value, or (absent) the store revision to start watching after."""
        reply = self._gw.call("/v3/kv/range", {"key": _b64(self.prefix + _bytes(key))})
        kvs = reply.get("kvs", [])
        if kvs:
            return base64.b64decode(kvs[0].get("value", ""))
        return int(reply["header"]["revision"])

    def _wait_one(self, key: str, revision: int, timeout_s: float) -> None:
        """Block on a watch until ``key`` is created after ``revision``, or time out."""
        if timeout_s <= 0:
            raise dist.DistStoreError(f"etcd: timed out waiting for key {key!r}")
        full = _b64(self.prefix + _bytes(key))
        body = json.dumps({"create_request": {"key": full, "start_revision": str(revision + 1),
                                              "filters": ["NODELETE"]}}).encode()
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        for host, port in self.endpoints * 2:
            conn = http.client.HTTPConnection(host, port, timeout=max(0.05, deadline - time.monotonic()))
            try:
                conn.request("POST", "/v3/watch", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                while True:
                    conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
                    line = resp.readline()
                    if not line:
                        break  # the server closed the stream: try again (next endpoint)
                    result = json.loads(line).get("result", {})
                    if result.get("events"):
                        return
            except TimeoutError:
                raise dist.DistStoreError(f"etcd: timed out after {timeout_s:.1f}s waiting for key {key!r}") from None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                last = exc
            finally:
                conn.close()
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"etcd: timed out after {timeout_s:.1f}s waiting for key {key!r}")
        raise StoreError(f"etcd watch {key!r}: no endpoint of {list(self.endpoints)} answered ({last})")


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
    every 5 ms. A broken stream is reopened from the last revision seen; after a
    compaction the prefix is read afresh. ``get_prefix`` answers like EtcdStore's;
    ``revision_of`` tells how new the copy of a key is (a writer that must not act on
    its own overwritten value again compares it with the revision its write returned).
    """

    def __init__(self, store: EtcdStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix
        self._values, self._revisions, self._revision = store._range_prefix_revisions(prefix)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        threading.Thread(target=self._follow, name=f"sg-mirror-{prefix}", daemon=True).start()

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
        """Stop following: shut the stream's socket down, which ends the reader's readline
        (closing the connection from here would wait for the reader's lock)."""
        self._closed.set()
        sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _follow(self) -> None:
        at = 0
        while not self._closed.is_set():
            host, port = self.store.endpoints[at % len(self.store.endpoints)]
            try:
                self._stream(host, port)
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                at += 1
            self._closed.wait(0.05)

    def _stream(self, host: str, port: int) -> None:
        start = self.store.prefix + _bytes(self.prefix)
        body = json.dumps({"create_request": {"key": _b64(start), "range_end": _b64(_prefix_end(start)),
                                              "start_revision": str(self._revision + 1)}}).encode()
        self._conn = http.client.HTTPConnection(host, port, timeout=None)
        try:
            self._conn.request("POST", "/v3/watch", body, {"Content-Type": "application/json"})
            resp = self._conn.getresponse()
            cut = len(self.store.prefix)
            while not self._closed.is_set():
                line = resp.readline()
                if not line:
                    return
                result = json.loads(line).get("result", {})
                if int(result.get("compact_revision", 0)) > 0:  # history gone: read it afresh
                    values, revisions, revision = self.store._range_prefix_revisions(self.prefix)
                    with self._lock:
                        self._values, self._revisions, self._revision = values, revisions, revision
                    return
                with self._lock:
                    for ev in result.get("events", []):
                        kv = ev["kv"]
                        key = base64.b64decode(kv["key"])[cut:].decode()
                        if ev.get("type") == "DELETE":
                            self._values.pop(key, None)
                            self._revisions.pop(key, None)
                        else:
                            self._values[key] = base64.b64decode(kv.get("value", ""))
                            self._revisions[key] = int(kv["mod_revision"])
                        self._revision = max(self._revision, int(kv["mod_revision"]))
        finally:
            self._conn.close()
