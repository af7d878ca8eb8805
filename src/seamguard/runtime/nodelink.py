"""Each node launcher's TCP link to the coordinator: a node whose processes die is lost at once.

Why this exists: with per-node aggregation (several nodes, or an etcd store) a node is
judged lost when its launcher's record stands still for ``hang_timeout_s`` (1 s by
default, detect.NodeTracker); that wait was most of a host loss's resume time
(docs/benchmarks.md, "--fsdp --hosts 2"). When a node's processes die but its kernel
lives on (the OOM killer, the node's container or agent killed, a scheduler ending the
node's job step, every process of the node SIGKILLed), the kernel closes the launcher's
sockets and the peer reads end-of-file or a reset within a round trip. So every node
launcher but node 0's holds one TCP connection to node 0's launcher (which runs the
coordinator) and the coordinator takes that connection closing without a goodbye as
the node's loss. A powered-off host or a cut cable closes nothing: the record's timeout
still judges those; the link only makes the common case fast.

Protocol (one line each way, text): the node sends ``seamguard-link <run id> <node>``
once connected and ``bye`` before an orderly exit; the coordinator sends nothing.
`LinkServer` (node 0) and `LinkClient` (the other nodes) are called from the launcher's
loop; neither blocks it (non-blocking sockets, a short bounded connect).
"""

from __future__ import annotations

import errno
import selectors
import socket

HELLO = "seamguard-link"
BYE = b"bye\n"
CONNECT_TIMEOUT_S = 0.2
RETRY_S = 1.0


class LinkServer:
    """Node 0's end: accepts the other nodes' links and reports those that close uncleanly.

    The sockets sit in one selector (epoll on Linux), so a pass reads only the links that
    have something to say and the launcher waits on one descriptor (`fileno`), however
    many nodes there are."""

    def __init__(self, run_id: str, bind_host: str = "0.0.0.0") -> None:
        self.run_id = run_id
        self._listen = socket.create_server((bind_host, 0))
        self._listen.setblocking(False)
        self.port = self._listen.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listen, selectors.EVENT_READ)
        self._pending: dict[socket.socket, bytes] = {}        # accepted, hello not read yet
        self._links: dict[socket.socket, tuple[int, bytes]] = {}   # node, its last bytes
        self._said_bye: set[int] = set()

    def fileno(self) -> int:
        """Readable when a node connects, says something or closes its link (wait on it)."""
        return self._sel.fileno()

    def open_links(self) -> int:
        """Other nodes whose launcher is still linked and has not said bye."""
        return sum(node not in self._said_bye for node, _ in self._links.values())

    def poll(self) -> list[tuple[int, str]]:
        """Accept and read whatever arrived; returns (node, what happened) for each link
        that closed without saying bye since the last call."""
        closed = []
        for key, _ in self._sel.select(0):
            sock = key.fileobj
            if sock is self._listen:
                self._accept()
            elif sock in self._pending:
                self._read_hello(sock)
            elif sock in self._links:
                lost = self._read_link(sock)
                if lost is not None:
                    closed.append(lost)
        return closed

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listen.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._pending[sock] = b""
            self._sel.register(sock, selectors.EVENT_READ)

    def _read_hello(self, sock: socket.socket) -> None:
        data, why = _read(sock)
        buf = self._pending.pop(sock) + data
        if b"\n" in buf:
            line, rest = buf.split(b"\n", 1)
            node = _parse_hello(line.decode(errors="replace"), self.run_id)
            if node is not None:
                self._links[sock] = (node, rest)   # a close seen here stays readable: next pass
                if BYE in rest:
                    self._said_bye.add(node)
                return
        elif why is None:
            self._pending[sock] = buf
            return
        self._drop(sock)   # not one of this job's launchers, or gone before saying who it was

    def _read_link(self, sock: socket.socket) -> tuple[int, str] | None:
        node, last = self._links[sock]
        data, why = _read(sock)
        buf = last + data
        if BYE in buf:
            self._said_bye.add(node)
        self._links[sock] = (node, buf[-len(BYE):])
        if why is None:
            return None
        del self._links[sock]
        self._drop(sock)
        return None if node in self._said_bye else (node, why)

    def _drop(self, sock: socket.socket) -> None:
        self._sel.unregister(sock)
        sock.close()

    def close(self) -> None:
        for sock in [*self._pending, *self._links]:
            self._drop(sock)
        self._pending, self._links = {}, {}
        self._sel.close()
        self._listen.close()


class LinkClient:
    """A node's end: connects to the coordinator's link once its address is known."""

    def __init__(self, run_id: str, node: int) -> None:
        self.run_id, self.node = run_id, node
        self.sock: socket.socket | None = None
        self._next_try_s = 0.0

    @property
    def connected(self) -> bool:
        return self.sock is not None

    def ensure(self, address: str | None, now_s: float) -> None:
        """Connect to ``host:port`` (the coordinator's link key) unless connected; a failed
        attempt is retried after RETRY_S (node 0's launcher may start later)."""
        if self.sock is not None or not address or now_s < self._next_try_s:
            return
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
            sock.sendall(f"{HELLO} {self.run_id} {self.node}\n".encode())
        except (OSError, ValueError):
            self._next_try_s = now_s + RETRY_S
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock

    def close(self, orderly: bool) -> None:
        """``orderly``: this node's part of the job ended as planned (say bye first), so
        closing the link is no loss."""
        if self.sock is None:
            return
        if orderly:
            try:
                self.sock.sendall(BYE)
            except OSError:
                pass
        self.sock.close()
        self.sock = None


def _read(sock: socket.socket) -> tuple[bytes, str | None]:
    """What the socket holds now, and why it closed (None: still open)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return data, None
        except OSError as exc:
            return data, errno.errorcode.get(exc.errno or 0, str(exc))
        if not chunk:
            return data, "closed by the node"
        data += chunk


def _parse_hello(line: str, run_id: str) -> int | None:
    head, _, node = line.rpartition(" ")
    if head != f"{HELLO} {run_id}" or not node.isdigit():
        return None
    return int(node)
