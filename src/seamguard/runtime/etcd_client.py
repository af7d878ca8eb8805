"""The runtime's etcd client: aetcd (etcd's v3 gRPC API) on an event loop of its own thread.

Why this exists: two parts of the runtime talk to etcd. The job store (`store.py`) is a
``torch.distributed.Store``, synchronous, called from the launcher's loop, the workers'
threads and gloo's rendezvous; the roster and election (`roster.py`,
`node_membership.py`) are asyncio. Both use one maintained gRPC client, aetcd (the
project's HA controller uses it for its lease, app/leader.py, on a thread of its own
for the same reason as here), instead of hand-written HTTP to etcd's JSON gateway.

`EtcdThread` runs the client's loop on a thread: a caller's loop that is busy (a
coordinator reading thousands of queued liveness lines in one pass) cannot hold up a
lease renewal, and synchronous callers get a bounded blocking call (`Endpoints.call`).
`Endpoints` holds one client per etcd endpoint and moves to the next one when a call
finds its endpoint unavailable; every call is bounded by ``request_timeout_s``.
aetcd is imported when a client is first made (a process that forks workers never
starts gRPC before it forks).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class StoreError(RuntimeError):
    """The etcd cluster did not answer (every endpoint tried) or answered with an error."""


class EtcdThread:
    """An event loop on a thread of its own for etcd clients: `call` runs a coroutine
    there and awaits its result from the caller's loop; `submit` starts one apart;
    `run` blocks the calling thread until it is done (bounded)."""

    def __init__(self, name: str = "seamguard-etcd") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def call(self, coro: Coroutine):
        return await asyncio.wrap_future(self.submit(coro))

    def run(self, coro: Coroutine, timeout_s: float):
        """The coroutine's result; TimeoutError (the coroutine cancelled) past ``timeout_s``."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"etcd: no answer within {timeout_s:g} s") from None

    def close(self, timeout_s: float = 5.0) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)


def connect(endpoint: tuple[str, int], timeout_s: float = 2.0):
    """An aetcd client for ``endpoint`` (host, port); connected on first use, every call
    bounded by ``timeout_s``."""
    import aetcd

    return aetcd.Client(host=endpoint[0], port=endpoint[1], timeout=timeout_s)


def _unavailable(exc: BaseException) -> bool:
    """An error that another endpoint (or the same one later) may not give: retry there."""
    import aetcd
    import grpc

    if isinstance(exc, (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, TimeoutError, OSError)):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _one_line(exc: BaseException | None) -> str:
    """``Type: first line of the message`` (at most 200 characters; an empty message is fine)."""
    first = next(iter(str(exc).splitlines()), "")[:200]
    return f"{type(exc).__name__}: {first}"


class Endpoints:
    """Blocking calls into an etcd cluster for synchronous callers (the job store): one
    aetcd client per endpoint, all on one `EtcdThread`; a call that finds its endpoint
    unavailable is tried on the next, each endpoint at most twice, then StoreError.
    ``requests`` counts the calls by name (what a pass or a node beat costs etcd)."""

    def __init__(self, endpoints: tuple[tuple[str, int], ...], request_timeout_s: float = 10.0) -> None:
        if not endpoints:
            raise ValueError("etcd: at least one endpoint is needed")
        self.endpoints = tuple(endpoints)
        self.request_timeout_s = request_timeout_s
        self.io = EtcdThread()
        self.requests: collections.Counter[str] = collections.Counter()
        self._clients: dict[int, Any] = {}
        self._at = 0
        self._lock = threading.Lock()

    def client(self, at: int | None = None):
        """The client of endpoint ``at`` (the current one by default), made on first use."""
        at = self._at if at is None else at
        with self._lock:
            if at not in self._clients:
                self._clients[at] = connect(self.endpoints[at], self.request_timeout_s)
            return self._clients[at]

    def call(self, name: str, fn: Callable[[Any], Awaitable], timeout_s: float | None = None):
        """``await fn(client)`` on the etcd thread, bounded; another endpoint when this one
        is unavailable. Errors that retrying cannot help (a refused request) are StoreError."""
        self.requests[name] += 1
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        last: BaseException | None = None
        for _ in range(2 * len(self.endpoints)):
            at = self._at
            client = self.client(at)

            async def once():
                await client.connect()
                return await fn(client)
            try:
                return self.io.run(once(), timeout_s)
            except Exception as exc:  # noqa: BLE001 - sorted below: unavailable (retry) or refused
                if not _unavailable(exc):
                    raise StoreError(f"etcd {name}: {_one_line(exc)}") from None
                last = exc
                self._next(at)
        raise StoreError(f"etcd {name}: no endpoint of {list(self.endpoints)} answered ({_one_line(last)})")

    def _next(self, failed: int) -> None:
        with self._lock:
            if self._at == failed:
                self._at = (failed + 1) % len(self.endpoints)

    def close(self) -> None:
        async def close_all():
            for c in list(self._clients.values()):
                try:
                    await asyncio.wait_for(c.close(), 1.0)
                except Exception:  # noqa: BLE001 - closing a broken channel
                    pass
        try:
            self.io.run(close_all(), 2.0)
        except TimeoutError:
            pass
        self._clients = {}
        self.io.close()
