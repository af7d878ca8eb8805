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

The same link carries the node's record every node beat (its ranks' latest heartbeats,
the record keys.node_beats holds), so the job-wide store is not written once per node
per beat: the coordinator reads the records off the links (`LinkServer.records`), and a
node writes its record to the store only while it has no link (at start, or after its
link broke). A node whose record stands still is judged by its timeout as before.

Protocol: the lines of runtime/liveness.py, each signed with the job's link key
(`liveness.link_key`) for this server's hub id, numbered and timed: ``hello`` once
connected, the record (JSON) every node beat, ``bye`` before an orderly exit; the
coordinator sends nothing. The hub id is part of the address node 0 publishes
(keys.LINK, ``host:port#hub``). A line the gate refuses (forged, misdirected, replayed,
stale, malformed, oversize) is counted and reported in one line (`on_refused`, at most
one a second); on a link no admitted line has bound to a node it ends that link, which
is then nobody's loss, so a host that can reach this port but lacks the key can neither
keep a dead node alive nor get a live one declared lost. Links no admitted line has bound
are bounded in number and time (`linkwire.PendingLinks`): idle sockets cannot exhaust
node 0's descriptors or lock a launcher out.
`LinkServer` (node 0) and `LinkClient` (the other nodes) are called from the launcher's
loop; neither blocks it (non-blocking sockets on the server, a short bounded connect and
send on the client).
"""

from __future__ import annotations

import errno
import json
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from seamguard.runtime.linkwire import BYE, HELLO, MAX_LINE_BYTES, BeatRefused, LinkGate, PendingLinks, hub_address
from seamguard.runtime.linkwire import new_hub_id, parse_hub_address, pending_limit, seal

CONNECT_TIMEOUT_S = 0.2
RETRY_S = 1.0


@dataclass
class _Link:
    node: int | None = None   # bound by its first admitted line
    buf: bytes = b""


class LinkServer:
    """Node 0's end: accepts the other nodes' links, keeps each node's newest record and
    reports the links that close uncleanly.

    The sockets sit in one selector (epoll on Linux), so a pass reads only the links that
    have something to say and the launcher waits on one descriptor (`fileno`), however
    many nodes there are."""

    def __init__(self, run_id: str, key: bytes, bind_host: str = "0.0.0.0",
                 on_refused: Callable[[BeatRefused], None] | None = None, pending: PendingLinks | None = None,
                 clock: Callable[[], float] = time.monotonic, nodes: int = 0) -> None:
        self.run_id = run_id
        # links not bound to a node yet: bounded (beyond the job's ``nodes``), timed
        self.pending = PendingLinks(pending_limit(nodes)) if pending is None else pending
        self.clock = clock
        self.hub = new_hub_id()
        self.gate = LinkGate(key, run_id, self.hub, report=on_refused)
        self._listen = socket.create_server((bind_host, 0))
        self._listen.setblocking(False)
        self.port = self._listen.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listen, selectors.EVENT_READ)
        self._conns: dict[socket.socket, _Link] = {}
        self._current: dict[int, socket.socket] = {}   # node -> its newest link
        self._said_bye: set[int] = set()
        self.records: dict[int, dict] = {}   # node -> its newest record received over its link

    def address(self, host: str) -> str:
        """What node 0 publishes (keys.LINK): where to connect and which hub to sign for."""
        return hub_address(host, self.port, self.hub)

    def fileno(self) -> int:
        """Readable when a node connects, says something or closes its link (wait on it)."""
        return self._sel.fileno()

    def open_links(self) -> int:
        """Other nodes whose launcher is still linked and has not said bye."""
        return sum(node not in self._said_bye for node in self._current)

    def poll(self) -> list[tuple[int, str]]:
        """Accept and read whatever arrived; returns (node, what happened) for each link
        that closed without saying bye since the last call."""
        closed = []
        for key, _ in self._sel.select(0):
            sock = key.fileobj
            if sock is self._listen:
                self._accept()
            elif sock in self._conns:
                lost = self._read_link(sock)
                if lost is not None:
                    closed.append(lost)
        for sock in self.pending.expired(self.clock()):
            self._forget(sock)
        return closed

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listen.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._conns[sock] = _Link()
            self._sel.register(sock, selectors.EVENT_READ)
            for crowded in self.pending.opened(sock, self.clock()):
                self._forget(crowded)

    def _forget(self, sock: socket.socket) -> None:
        """Close a link and stop reading it (whether that is a loss is the caller's to say)."""
        if self._conns.pop(sock, None) is not None:
            self.pending.settled(sock)
            self._drop(sock)

    def _read_link(self, sock: socket.socket) -> tuple[int, str] | None:
        link = self._conns[sock]
        data, why = _read(sock)
        link.buf += data
        *lines, link.buf = link.buf.split(b"\n")
        for line in lines:
            if not self._take(sock, link, line + b"\n"):
                why = why or "refused"   # a stranger's line: end its link, nobody's loss
                break
        if why is None and len(link.buf) > MAX_LINE_BYTES:
            self.gate.refuse(BeatRefused("oversize", f"a line over {MAX_LINE_BYTES} bytes"))
            why = "oversize"
        if why is None:
            return None
        node = link.node
        self._forget(sock)
        if node is None or self._current.get(node) is not sock:
            return None
        del self._current[node]
        return None if node in self._said_bye or why in ("refused", "oversize") else (node, why)

    def _take(self, sock: socket.socket, link: _Link, line: bytes) -> bool:
        """Admit one line; False when it ends a link no admitted line has bound yet."""
        try:
            msg = self.gate.admit(line)   # counts and reports its own refusals
        except BeatRefused:
            return link.node is not None
        try:
            if link.node is not None and msg.node != link.node:
                raise BeatRefused("misdirected", f"node {msg.node} on node {link.node}'s link")
            record = None if msg.body in (HELLO, BYE) else _record(msg.node, msg.body)
        except BeatRefused as exc:
            self.gate.refuse(exc)
            return link.node is not None
        link.node = msg.node
        self.pending.settled(sock)
        superseded = self._current.get(msg.node)
        if superseded is not None and superseded is not sock:
            self._forget(superseded)   # the node's launcher reconnected: its old link is no loss
        self._current[msg.node] = sock
        if msg.body == BYE:
            self._said_bye.add(msg.node)
        elif record is not None:
            last = self.records.get(msg.node)
            if last is None or record["n"] >= last["n"]:
                self.records[msg.node] = record
        return True

    def _drop(self, sock: socket.socket) -> None:
        self._sel.unregister(sock)
        sock.close()

    def close(self) -> None:
        for sock in list(self._conns):
            self._drop(sock)
        self._conns, self._current = {}, {}
        self._sel.close()
        self._listen.close()


def _record(node: int, body: bytes) -> dict:
    """A node record ({"n": counter, "beats": {wid: heartbeat}}); BeatRefused("malformed")."""
    try:
        rec = json.loads(body)
        if isinstance(rec, dict) and isinstance(rec.get("n"), int) and isinstance(rec.get("beats"), dict):
            return rec
    except ValueError:
        pass
    raise BeatRefused("malformed", f"node {node}: not a node record")


class LinkClient:
    """A node's end: connects to the coordinator's link once its address (and the job's
    link key, ``key``) is known, and sends its records over it."""

    def __init__(self, run_id: str, node: int, key: bytes | None = None) -> None:
        self.run_id, self.node, self.key = run_id, node, key
        self.sock: socket.socket | None = None
        self.seq = 0   # rises across links: no line is ever sent twice under one number
        self._hub = ""
        self._next_try_s = 0.0

    @property
    def connected(self) -> bool:
        return self.sock is not None

    def ensure(self, address: str | None, now_s: float) -> None:
        """Connect to ``host:port#hub`` (the coordinator's link key) unless connected; a
        failed attempt is retried after RETRY_S (node 0's launcher may start later)."""
        if self.sock is not None or not address or self.key is None or now_s < self._next_try_s:
            return
        try:
            host, port, self._hub = parse_hub_address(address)
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except (OSError, ValueError):
            self._next_try_s = now_s + RETRY_S
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        if not self.send(HELLO):
            self._next_try_s = now_s + RETRY_S

    def send(self, body: bytes) -> bool:
        """One signed line (bounded by the connect timeout); False, and the link dropped,
        when it cannot be sent (the caller writes its record to the store instead)."""
        if self.sock is None:
            return False
        self.seq += 1
        try:
            self.sock.sendall(seal(self.key, self.run_id, self._hub, self.node, self.seq, body, time.time_ns()))
            return True
        except OSError:
            self.sock.close()
            self.sock = None
            return False

    def close(self, orderly: bool) -> None:
        """``orderly``: this node's part of the job ended as planned (say bye first), so
        closing the link is no loss."""
        if self.sock is None:
            return
        if orderly:
            self.send(BYE)
        if self.sock is not None:
            self.sock.close()
        self.sock = None


def _read(sock: socket.socket) -> tuple[bytes, str | None]:
    """What the socket holds now, and why it closed (None: still open)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return data, None
        except OSError as exc:
            return data, errno.errorcode.get(exc.errno or 0, str(exc))
        if not chunk:
            return data, "closed by the node"
        data += chunk
        if len(data) > 4 * MAX_LINE_BYTES:
            return data, None   # the rest on the next pass: one link cannot hold the loop
