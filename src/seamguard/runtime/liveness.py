"""Liveness over the launchers' links: one message per node per beat, judged in memory.

Why this exists: with per-node aggregation on etcd every node's launcher wrote its record
(its ranks' beats) into etcd every node beat, so etcd's load grew with the job and
saturated near 3k ranks (docs/benchmarks.md, ``membership_load``). Liveness is not
membership: it changes every beat and nobody needs it after the coordinator has judged
it. So each node's launcher sends its ranks' beats as one line over a TCP link it holds
to the coordinator (the link `runtime/nodelink.py` already opened for fast loss), the
coordinator judges nodes in memory (`detect.NodeTracker`), and etcd keeps only the
membership, written when it changes (`runtime/roster.py`).

Wire (text lines, launcher -> coordinator), every line signed (`seal`, `LinkGate`):
``sg-live-v1 <hub> <node> <seq> <t_ns> <hmac> <body>`` where the HMAC-SHA256 covers the
run id, the hub id, the node, the sequence number, the sender's wall clock in ns and the
body. The key is `link_key` of the job's hint key (seamguard/hintauth.py), never the hint
key itself: a launcher holding it can vouch for its node but cannot sign hints. The hub
id is random per hub and is part of the address the coordinator advertises
(``host:port#hub``), so a line captured on one hub is refused by the next one after a
failover; on one hub a line whose sequence number is not newer than its node's last is a
replay, and one sent more than ``MAX_SKEW_S`` from the hub's wall clock is stale. A
refused line is counted by reason and logged in one line (at most one a second); it
never binds a link to a node, so a forged link that closes costs nobody their place.
Bodies: ``{"beats": {wid: [counter, step]}}`` every beat here (the launcher's link,
runtime/nodelink.py, carries its node record instead); ``hello`` when a link opens;
``bye`` before an orderly exit. The coordinator sends nothing. A link that closes
without a goodbye loses its node at once (as nodelink); a node silent for
``hang_timeout_s`` is lost too.

`LivenessHub` (the coordinator's end) and `NodeReporter` (a launcher's end) run on an
asyncio loop; every wait is bounded (connect, reconnect tries, reads are per line and
at most ``MAX_LINE_BYTES``). Links that no admitted line has bound to a node are at most
``MAX_PENDING_LINKS`` at once, each for at most ``FIRST_LINE_S`` (`PendingLinks`), so idle
sockets opened by anyone who can reach the port neither exhaust the hub nor lock a
launcher out. The wire itself (signing, admission, that bound) is `runtime/linkwire.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from seamguard.runtime.detect import NodeTracker
from seamguard.runtime.linkwire import (  # noqa: F401 - re-exported: the links' wire, used here and by callers
    MAX_LINE_BYTES,
    CONNECT_TIMEOUT_S,
    WIRE_TAG,
    MAX_SKEW_S,
    REFUSALS,
    MAX_PENDING_LINKS,
    FIRST_LINE_S,
    HELLO,
    BYE,
    BeatRefused,
    link_key,
    new_hub_id,
    hub_address,
    parse_hub_address,
    seal,
    Sealed,
    unseal,
    LinkGate,
    pending_limit,
    PendingLinks,
    NodeReport,
    encode_report,
    decode_report,
)

READ_BYTES = 256 * 1024
"""One read of a link takes at most this much (asyncio's own default); a read that fills it
may have left bytes in the socket."""


class LivenessHub:
    """The coordinator's end: every node's link, one `NodeTracker` judging them.

    `judge_now()` (on the hub's loop) returns the nodes newly lost (silent past the hang
    timeout, or whose link closed without a goodbye), each once, with the workers their
    last report listed. A link is bound to a node by its first admitted line; a refused
    line on an unbound link drops it, on a bound one (its node's own launcher, e.g. a
    clock that jumped) it is only skipped. Links not bound yet are bounded in number and
    in time (`PendingLinks`); a node that reconnects supersedes its old link, which is
    closed and is no loss.

    A verdict never comes from the hub's own lateness. A node is judged as of a moment
    taken before reading (``as_of_s``), and only once every byte that had arrived in its
    sockets by then has been read (`read_through`): a hub short of CPU judges late, never
    on a line still queued. A pass gap longer than the timeout is forgiven in full: the
    whole host was frozen (suspended, paused), its network stack with it, so a line sent
    meanwhile may not have reached the sockets yet."""

    def __init__(self, run_id: str, hang_timeout_s: float, key: bytes, own_node: int | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_ns: Callable[[], int] = time.time_ns,
                 pending: PendingLinks | None = None, read_bytes: int = READ_BYTES) -> None:
        self.run_id = run_id
        self.pending = PendingLinks() if pending is None else pending   # links not bound to a node yet: bounded, timed
        self.clock = clock
        self.hub = new_hub_id()
        self.gate = LinkGate(key, run_id, self.hub, wall_ns)
        self.tracker = NodeTracker(hang_timeout_s, own_node=own_node)
        self.reports = 0
        self.refused: deque[str] = deque(maxlen=100)  # the newest refusals (a peer may send garbage forever)
        self.address = ""
        self._closed: list[int] = []
        self._links: dict[int, _Link] = {}   # node -> its current link
        self._last_judge_s: float | None = None
        self.forgiven_s = 0.0   # the last pass's gap forgiven (a freeze longer than the timeout)
        self.read_through_s = 0.0   # the last `judge_now`'s reading, from its moment to its verdicts
        self._iteration = 0   # counts `read_through`'s loop iterations
        self._passing = asyncio.Lock()   # one `read_through` at a time: they share the count
        self._cut_short: dict[_Link, int] = {}   # link -> the iteration whose read filled the buffer
        self._read_into = memoryview(bytearray(read_bytes))   # every link's reads land here, one at a time
        self._server: asyncio.base_events.Server | None = None
        self._open: set[_Link] = set()   # every link open now, bound or not

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        self._server = await asyncio.get_running_loop().create_server(lambda: _Link(self), host, port,
                                                                      backlog=4096)
        bound = self._server.sockets[0].getsockname()[:2]
        self.address = hub_address(bound[0], bound[1], self.hub)
        return bound

    async def close(self) -> None:
        """Stop listening and drop every link (their launchers look for the coordinator again)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in list(self._open):
            link.transport.close()

    def open_links(self) -> int:
        """Links open now, bound to a node or not."""
        return len(self._open)

    def observe(self, report: NodeReport, now_s: float) -> None:
        self.reports += 1
        self.tracker.observe(report.node, report.seq, set(report.beats), now_s)

    def members(self) -> dict[int, set[int]]:
        """Nodes heard and not lost: node -> the workers its last report listed."""
        return {n: set(w) for n, w in self.tracker.members.items() if n not in self.tracker.lost}

    async def judge_now(self, cap_s: float | None = None) -> list[tuple[int, set[int], str]]:
        """`judge` as of now, once everything that had arrived by now is read (`read_through`,
        at most ``cap_s``: a quarter of the timeout unless given). Passes run one at a time."""
        async with self._passing:
            as_of_s = self.clock()
            spared = await self.read_through(self.tracker.hang_timeout_s / 4 if cap_s is None else cap_s)
            self.read_through_s = self.clock() - as_of_s
            return self.judge(as_of_s, spared)

    async def read_through(self, cap_s: float) -> set[int]:
        """Return once every byte in the links' sockets when it was called has been read;
        the nodes whose links still had bytes left when ``cap_s`` ran out (spared this pass).

        The selector loop polls every socket once an iteration and reads each readable one
        once, at most a buffer's worth (`_Link.get_buffer`), after the callbacks already
        scheduled (this coroutine's resumption among them). So after two yields every
        socket readable at the call has been read once; one whose read filled the buffer
        may hold more (a backlog; a line split across reads) and gets another iteration,
        until no read of the last iteration was cut short or the cap is reached."""
        deadline_s = self.clock() + cap_s
        await asyncio.sleep(0)   # into an iteration whose poll comes after the call
        while True:
            self._iteration += 1
            await asyncio.sleep(0)   # that iteration's reads have run
            self._cut_short = {link: i for link, i in self._cut_short.items() if i == self._iteration}
            if not self._cut_short:
                return set()
            if self.clock() >= deadline_s:
                return {link.node for link in self._cut_short if link.node is not None}

    def judge(self, as_of_s: float, spared: set[int] = frozenset()) -> list[tuple[int, set[int], str]]:
        """The nodes newly lost as of ``as_of_s`` (see the class docstring), ``spared`` not
        judged silent this pass. Call it once every line that arrived by ``as_of_s`` is
        read (`judge_now` does)."""
        timeout_s = self.tracker.hang_timeout_s
        gap_s = 0.0 if self._last_judge_s is None else as_of_s - self._last_judge_s
        self.forgiven_s = gap_s if gap_s > timeout_s else 0.0
        if self.forgiven_s:
            self.tracker.observer_paused(self.forgiven_s)
        self._last_judge_s = as_of_s
        out = []
        for node in self._closed:
            workers = self.tracker.link_closed(node, set())
            if workers is not None:
                out.append((node, workers, "its launcher's link closed without a goodbye"))
        self._closed.clear()
        out += [(n, w, f"no report for {silent:.2f} s")
                for n, w, silent in self.tracker.verdicts(as_of_s, spared)]
        return out

    def _admit(self, line: bytes, bound: int | None) -> tuple[int | None, bool]:
        """(the link's node, whether it said goodbye) after ``line``; BeatRefused for a
        line that must end an unbound link."""
        try:
            msg = self.gate.admit(line)
            if bound is not None and msg.node != bound:
                raise self.gate.refuse(BeatRefused("misdirected", f"node {msg.node} on node {bound}'s link"))
            try:
                report = decode_report(msg)
            except BeatRefused as exc:
                raise self.gate.refuse(exc) from None
        except BeatRefused as exc:
            self.refused.append(str(exc))
            if bound is None:
                raise
            return bound, False
        if msg.body == BYE:
            return msg.node, True
        if report is not None:
            self.observe(report, self.clock())
        return msg.node, False

    # ---- the links' events (`_Link` calls these from the loop) ------------------------------
    def _opened(self, link: _Link) -> None:
        self._open.add(link)
        for crowded in self.pending.opened(link, self.clock()):
            crowded.transport.abort()
        link.timer = asyncio.get_running_loop().call_later(self.pending.first_line_s, self._first_line_due, link)

    def _first_line_due(self, link: _Link) -> None:
        deadline_s = self.pending.deadline_s(link)
        if deadline_s is not None:   # still pending: it, and any pending longer, are dropped
            for silent in self.pending.expired(max(self.clock(), deadline_s)):
                silent.transport.abort()

    def _line(self, link: _Link, line: bytes) -> bool:
        """Take one line of ``link``; False when the link is to end (a stranger's line, or a goodbye)."""
        try:
            node, bye = self._admit(line, link.node)
        except BeatRefused:
            return False   # an unknown peer: dropped, nobody's loss
        if link.node is None:
            self.pending.settled(link)
            link.timer.cancel()
            superseded = self._links.get(node)
            if superseded is not None:
                superseded.transport.close()   # the node's launcher reconnected: its old link is no loss
            link.node = node
        self._links[node] = link
        if bye:
            del self._links[node]
            link.node = None   # an orderly goodbye: not a loss
            return False
        return True

    def _read(self, link: _Link, cut_short: bool) -> None:
        """A read of ``link``: ``cut_short`` when it filled the buffer (more may be queued)."""
        if cut_short:
            self._cut_short[link] = self._iteration
        else:
            self._cut_short.pop(link, None)

    def _lost(self, link: _Link) -> None:
        self._open.discard(link)
        self._cut_short.pop(link, None)
        self.pending.settled(link)
        if link.timer is not None:
            link.timer.cancel()
        node = link.node
        if node is not None and self._links.get(node) is link:
            del self._links[node]
            if self._server is not None:
                self._closed.append(node)


class _Link(asyncio.BufferedProtocol):
    """One launcher's link as the hub reads it: whole lines out of the byte stream, each
    handed to the hub as it arrives (no task or stream per link: at thousands of links the
    hub's CPU goes to the lines, not to waking a reader per line). It reads into its own
    buffer, so it knows when a read filled it (`LivenessHub.read_through`)."""

    def __init__(self, hub: LivenessHub) -> None:
        self.hub = hub   # its buffer: the selector loop copies each read out (buffer_updated) before the next
        self.node: int | None = None   # bound by its first admitted line
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None   # its first line's deadline
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.hub._opened(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.hub._read_into   # one for all links: each read is copied out before the next

    def buffer_updated(self, nbytes: int) -> None:
        self.hub._read(self, nbytes == len(self.hub._read_into))
        *lines, self._buf = (self._buf + bytes(self.hub._read_into[:nbytes])).split(b"\n")
        for line in lines:
            if not self.hub._line(self, line + b"\n"):
                self.transport.close()
                return
        if len(self._buf) > MAX_LINE_BYTES:
            self.hub.gate.refuse(BeatRefused("oversize", f"a line over {MAX_LINE_BYTES} bytes"))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.hub._lost(self)


class NodeReporter:
    """A launcher's end: sends its node's beats every ``beat_s`` to the coordinator that
    ``locate()`` names (the election key's value, ``host:port#hub``), reconnecting when
    the link breaks (a new coordinator was elected): every ``retry_s`` for up to
    ``give_up_s`` (a failover takes the lease's length), each try bounded, then
    `ConnectionError` for the launcher to end the node's part of the job. Its sequence
    numbers rise across links, so no hub ever sees one twice."""

    def __init__(self, run_id: str, node: int, beat_s: float, key: bytes,
                 locate: Callable[[], Awaitable[str | None]],
                 beats: Callable[[], dict[int, tuple[int, int]]], give_up_s: float = 60.0,
                 retry_s: float = 0.25) -> None:
        self.run_id, self.node, self.beat_s, self.key = run_id, node, beat_s, key
        self.locate, self.beats = locate, beats
        self.give_up_s, self.retry_s = give_up_s, retry_s
        self.seq = 0
        self.connects = 0
        self._hub = ""
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.StreamReader | None = None   # the hub sends nothing: its end of file is all it says

    def _line(self, body: bytes | None = None) -> bytes:
        self.seq += 1
        if body is None:
            return encode_report(self.key, self.run_id, self._hub, self.node, self.seq, self.beats())
        return seal(self.key, self.run_id, self._hub, self.node, self.seq, body, time.time_ns())

    async def run(self, stop: asyncio.Event) -> None:
        """Beat until ``stop`` is set; then say goodbye. A beat costs a line and a timer:
        no task per wait, and no drain while the kernel takes the line whole."""
        stopped = asyncio.ensure_future(stop.wait())
        loop = asyncio.get_running_loop()
        due_s = loop.time()
        try:
            while not stop.is_set():
                if self._writer is None:
                    await self._connect(stop)
                    continue
                if not await self._send_beat():
                    self._drop()
                    continue
                # on a fixed schedule: the time a beat takes does not stretch the period;
                # one more than a period late starts the schedule again (no burst to catch up)
                due_s += self.beat_s
                if due_s <= loop.time():
                    due_s = loop.time() + self.beat_s
                await asyncio.wait([stopped], timeout=due_s - loop.time())
        finally:
            stopped.cancel()
        if self._writer is not None:
            self._writer.write(self._line(BYE))
            try:
                await asyncio.wait_for(self._writer.drain(), self.beat_s)
            except (OSError, asyncio.TimeoutError):
                pass
            self._drop()

    async def _send_beat(self) -> bool:
        """False when the link is gone (the hub closed it: its coordinator stepped down)."""
        if self._writer.is_closing() or self._reader.at_eof():
            return False
        try:
            self._writer.write(self._line())
            if self._writer.transport.get_write_buffer_size():
                await asyncio.wait_for(self._writer.drain(), self.beat_s)
        except (OSError, asyncio.TimeoutError):
            return False
        return True

    async def _connect(self, stop: asyncio.Event) -> None:
        deadline_s = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline_s:
            if stop.is_set():
                return
            try:
                where = await self.locate()   # bounded by its etcd client's call timeout; not cut short
                if where is not None:
                    host, port, self._hub = parse_hub_address(where)
                    self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                                        CONNECT_TIMEOUT_S)
                    self.connects += 1
                    return
            except Exception:  # noqa: BLE001 - etcd or the network failing: try again until give_up_s
                pass
            await asyncio.sleep(self.retry_s)
        raise ConnectionError(f"node {self.node}: no coordinator answered for {self.give_up_s:g} s")

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
