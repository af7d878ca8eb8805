"""A loopback TCP proxy that can be cut: a network partition between one process and a server.

An HA controller replica talks to etcd through its own proxy; `block()` stops every byte
in both directions and holds new connections unanswered (no reset, no close: what a
partition looks like to the client, which only times out), `unblock()` lets them flow
again. Used by tests/ha and benchmarks/ha_failover.py; the proxy runs on threads of the
caller, every socket wait bounded so `stop()` returns promptly.
"""

from __future__ import annotations

import select
import socket
import threading

from seamguard.ports import free_port

_POLL_S = 0.05
_CHUNK_BYTES = 65536


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], listen_port: int | None = None) -> None:
        self.upstream = upstream
        self.port = listen_port or free_port()
        self._open = threading.Event()
        self._open.set()
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def blocked(self) -> bool:
        return not self._open.is_set()

    def block(self) -> None:
        """Partition: nothing passes either way until `unblock`."""
        self._open.clear()

    def unblock(self) -> None:
        self._open.set()

    def start(self) -> TcpProxy:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.port))
        srv.listen(64)
        srv.settimeout(_POLL_S)
        self._server = srv
        self._spawn(self._accept_loop)
        return self

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name="tcp-proxy")
        t.start()
        self._threads.append(t)

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self._socks.append(client)
        while not self._open.is_set():  # a new connection during a partition: held, unanswered
            if self._stop.wait(_POLL_S):
                client.close()
                return
        try:
            up = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._socks.append(up)
        peers = {client: up, up: client}
        try:
            while not self._stop.is_set():
                if not self._open.wait(_POLL_S):
                    continue  # partitioned: leave the bytes where they are
                ready, _, _ = select.select(list(peers), [], [], _POLL_S)
                for s in ready:
                    data = s.recv(_CHUNK_BYTES)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            up.close()

    def stop(self) -> None:
        self._stop.set()
        self._open.set()
        if self._server is not None:
            self._server.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(2)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
