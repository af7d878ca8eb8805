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
launcher out.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import secrets
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from seamguard.runtime.detect import NodeTracker

MAX_LINE_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 0.5
WIRE_TAG = b"sg-live-v1"
MAX_SKEW_S = 30.0
"""A line signed further than this from the hub's wall clock is stale: the job's hosts'
clocks are assumed within it of each other (NTP keeps them within milliseconds)."""
REFUSALS = ("malformed", "oversize", "forged", "misdirected", "replayed", "stale")
MAX_PENDING_LINKS = 1024
"""Links open at once that no admitted line has bound to a node yet, beyond the job's own
nodes (`pending_limit`). A genuine launcher signs its first line as it connects, so
only a stranger stays in this state for long; past the bound the oldest such link is
dropped to make room (`PendingLinks`)."""
FIRST_LINE_S = 5.0
"""A link that has not said one admitted line this long after it opened is dropped."""
HELLO, BYE = b"hello", b"bye"

log = logging.getLogger("seamguard.liveness")


class BeatRefused(ValueError):
    """A line the hub does not take; ``reason`` is one of REFUSALS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"liveness link: {reason}: {detail}")
        self.reason = reason


def link_key(job_key: bytes) -> bytes:
    """The key that signs liveness lines, derived from the job's hint key (one-way)."""
    return hmac.new(job_key, b"seamguard liveness link v1", hashlib.sha256).digest()


def new_hub_id() -> str:
    return secrets.token_hex(8)


def hub_address(host: str, port: int, hub: str) -> str:
    return f"{host}:{port}#{hub}"


def parse_hub_address(text: str) -> tuple[str, int, str]:
    """(host, port, hub id) of ``host:port#hub``; ValueError (one line) otherwise."""
    where, _, hub = text.partition("#")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit() or not hub:
        raise ValueError(f"liveness link: {text!r} is not host:port#hub")
    return host, int(port), hub


def _mac(key: bytes, run_id: str, hub: str, node: int, seq: int, t_ns: int, body: bytes) -> bytes:
    head = f"{run_id}\n{hub}\n{node}\n{seq}\n{t_ns}\n".encode()
    return hmac.new(key, head + body, hashlib.sha256).hexdigest().encode()


def seal(key: bytes, run_id: str, hub: str, node: int, seq: int, body: bytes, t_ns: int) -> bytes:
    """One signed line carrying ``body`` (no newline in it) from ``node`` to hub ``hub``."""
    mac = _mac(key, run_id, hub, node, seq, t_ns, body)
    return b" ".join([WIRE_TAG, hub.encode(), str(node).encode(), str(seq).encode(), str(t_ns).encode(),
                      mac, body]) + b"\n"


@dataclass(frozen=True)
class Sealed:
    node: int
    seq: int
    t_ns: int
    body: bytes


def unseal(key: bytes, run_id: str, hub: str, line: bytes) -> Sealed:
    """The genuine line addressed to ``hub``; BeatRefused (malformed, oversize, forged,
    misdirected) otherwise. Pure: replay and age are `LinkGate`'s."""
    if len(line) > MAX_LINE_BYTES:
        raise BeatRefused("oversize", f"{len(line)} bytes > {MAX_LINE_BYTES}")
    parts = line.rstrip(b"\n").split(b" ", 6)
    if len(parts) != 7 or parts[0] != WIRE_TAG or not all(p.isdigit() for p in parts[2:5]):
        raise BeatRefused("malformed", f"not a {WIRE_TAG.decode()} line ({line[:40]!r})")
    node, seq, t_ns = int(parts[2]), int(parts[3]), int(parts[4])
    try:
        to = parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise BeatRefused("malformed", "hub id is not ASCII") from None
    if not hmac.compare_digest(parts[5], _mac(key, run_id, to, node, seq, t_ns, parts[6])):
        raise BeatRefused("forged", f"node {node}: signature does not match the job's link key")
    if to != hub:
        raise BeatRefused("misdirected", f"node {node}: signed for hub {to}, this is hub {hub}")
    return Sealed(node, seq, t_ns, parts[6])


@dataclass
class LinkGate:
    """One hub's verifier: genuine, addressed to it, newer than its node's last, and fresh.
    ``refused`` counts refusals by reason; each is reported in one line, at most one a
    second (``report``, else this module's logger), so a flood cannot flood the log."""

    key: bytes
    run_id: str
    hub: str
    wall_ns: Callable[[], int] = time.time_ns
    max_skew_s: float = MAX_SKEW_S
    report: Callable[[BeatRefused], None] | None = None
    refused: collections.Counter = field(default_factory=collections.Counter)
    _last_seq: dict = field(default_factory=dict)   # node -> newest sequence number taken
    _reported_ns: int = 0

    def admit(self, line: bytes) -> Sealed:
        try:
            msg = unseal(self.key, self.run_id, self.hub, line)
        except BeatRefused as exc:
            raise self.refuse(exc) from None
        if msg.seq <= self._last_seq.get(msg.node, -1):
            raise self.refuse(BeatRefused("replayed", f"node {msg.node}: seq {msg.seq} is not newer than "
                                                      f"{self._last_seq[msg.node]}"))
        age_s = (self.wall_ns() - msg.t_ns) / 1e9
        if abs(age_s) > self.max_skew_s:
            raise self.refuse(BeatRefused("stale", f"node {msg.node}: signed {age_s:.1f} s ago "
                                                   f"(limit {self.max_skew_s:g} s)"))
        self._last_seq[msg.node] = msg.seq
        return msg

    def refuse(self, exc: BeatRefused) -> BeatRefused:
        """Count ``exc`` and report it (rate-limited); returns it for the caller to raise."""
        self.refused[exc.reason] += 1
        now_ns = self.wall_ns()
        if now_ns - self._reported_ns >= 1_000_000_000:
            self._reported_ns = now_ns
            if self.report is not None:
                self.report(exc)
            else:
                log.warning("%s (refusals so far: %s)", str(exc)[:300], dict(self.refused))
        return exc

    def refusals(self) -> dict[str, int]:
        return {**{r: 0 for r in REFUSALS}, **self.refused}


def pending_limit(nodes: int) -> int:
    """The pending links a hub of a job of ``nodes`` nodes holds: every node's launcher may
    connect in one burst (a job's start, a failover) before the hub has read one line,
    so the job's own nodes never crowd each other out; MAX_PENDING_LINKS more for
    strangers."""
    return MAX_PENDING_LINKS + max(0, nodes)


class PendingLinks:
    """The links no admitted line has bound to a node yet, oldest first: at most ``limit``
    of them, none older than ``first_line_s``. Pure bookkeeping (the caller's clock; any
    hashable link handle); the servers close the links it names.

    Why: each open link costs the hub a descriptor and a reader. Without a bound, anyone
    who can reach the port can open idle sockets until the process runs out of either
    and no launcher gets in. With it, a flood holds at most ``limit`` of them, each for
    at most ``first_line_s``, and a launcher that connects into a full pool still gets
    in: it is the newest, and says its first line at once, before its turn to be
    dropped comes. A bound link (its node's own launcher) is never counted here."""

    def __init__(self, limit: int = MAX_PENDING_LINKS, first_line_s: float = FIRST_LINE_S) -> None:
        if limit < 1 or not first_line_s > 0:
            raise ValueError(f"liveness links: limit {limit} and first_line_s {first_line_s} must be positive")
        self.limit, self.first_line_s = limit, first_line_s
        self.dropped: collections.Counter = collections.Counter()   # "crowded" | "silent" -> links dropped
        self._opened_s: dict = {}   # link -> when it opened; insertion order is age order

    def __len__(self) -> int:
        return len(self._opened_s)

    def opened(self, link, now_s: float) -> list:
        """Track a new link; returns the oldest pending links to drop to stay within the limit."""
        self._opened_s[link] = now_s
        crowded = []
        while len(self._opened_s) > self.limit:
            oldest = next(iter(self._opened_s))
            del self._opened_s[oldest]
            crowded.append(oldest)
        self.dropped["crowded"] += len(crowded)
        return crowded

    def settled(self, link) -> None:
        """The link was bound to a node, or closed: no longer pending."""
        self._opened_s.pop(link, None)

    def expired(self, now_s: float) -> list:
        """The pending links that said no admitted line within ``first_line_s``: to drop."""
        out = []
        for link, since_s in self._opened_s.items():
            if now_s - since_s < self.first_line_s:
                break   # the rest are younger
            out.append(link)
        for link in out:
            del self._opened_s[link]
        self.dropped["silent"] += len(out)
        return out

    def deadline_s(self, link) -> float | None:
        """When ``link`` must have said its first admitted line (None: not pending)."""
        since_s = self._opened_s.get(link)
        return None if since_s is None else since_s + self.first_line_s


@dataclass(frozen=True)
class NodeReport:
    """One node's beat as the coordinator received it."""

    node: int
    seq: int
    beats: dict[int, tuple[int, int]]   # worker id -> (heartbeat counter, step)


def encode_report(key: bytes, run_id: str, hub: str, node: int, seq: int,
                  beats: dict[int, tuple[int, int]], t_ns: int | None = None) -> bytes:
    body = json.dumps({"beats": {str(w): list(b) for w, b in beats.items()}}, separators=(",", ":")).encode()
    return seal(key, run_id, hub, node, seq, body, time.time_ns() if t_ns is None else t_ns)


def decode_report(msg: Sealed) -> NodeReport | None:
    """The report an admitted line carries; None for a goodbye or a hello without beats;
    BeatRefused("malformed") for a body that is not a report."""
    if msg.body in (BYE, HELLO):
        return None
    try:
        beats = json.loads(msg.body)["beats"]
        return NodeReport(msg.node, msg.seq, {int(w): (int(b[0]), int(b[1])) for w, b in beats.items()})
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise BeatRefused("malformed", f"node {msg.node}: not a report ({type(exc).__name__})") from None


class LivenessHub:
    """The coordinator's end: every node's link, one `NodeTracker` judging them.

    `judge(now_s)` returns the nodes newly lost (silent past the hang timeout, or whose
    link closed without a goodbye), each once, with the workers their last report listed.
    A pass that comes late (the coordinator got no CPU) is nobody's silence: the gap past
    a quarter of the timeout is forgiven, as the coordinator's tick does. A link is bound
    to a node by its first admitted line; a refused line on an unbound link drops it, on
    a bound one (its node's own launcher, e.g. a clock that jumped) it is only skipped.
    Links not bound yet are bounded in number and in time (`PendingLinks`); a node that
    reconnects supersedes its old link, which is closed and is no loss.

    A hub that reads late (its process short of CPU, lines queued in its sockets) is
    nobody's silence either: every line says when it was sent, so the hub knows how far
    behind its reading is — a line's delay beyond the least delay seen from its node
    (that floor absorbs clock offset and network latency) — and judges silences as of
    the moment its reading has reached (`behind_s`: the median of the last pass's excess
    delays), not as of now. A loss is then judged that much later, never on lines still
    queued."""

    def __init__(self, run_id: str, hang_timeout_s: float, key: bytes, own_node: int | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_ns: Callable[[], int] = time.time_ns,
                 pending: PendingLinks | None = None) -> None:
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
        self._floor_s: dict[int, float] = {}   # node -> least delay (receipt - send) seen
        self._excess_s: list[float] = []   # this pass's lines' delays beyond their node's floor
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

    def note_delay(self, node: int, sent_ns: int, received_ns: int) -> None:
        """Record how late a line of ``node`` was read (see the class docstring)."""
        delay_s = (received_ns - sent_ns) / 1e9
        floor_s = min(self._floor_s.get(node, delay_s), delay_s)
        self._floor_s[node] = floor_s
        if len(self._excess_s) < 100_000:   # a pass's worth; bounded should judge() not come
            self._excess_s.append(delay_s - floor_s)

    def behind_s(self) -> float:
        """How far the last pass's reading lagged the senders (0 when no line came)."""
        return statistics.median(self._excess_s) if self._excess_s else 0.0

    def judge(self, now_s: float) -> list[tuple[int, set[int], str]]:
        timeout_s = self.tracker.hang_timeout_s
        if self._last_judge_s is not None and now_s - self._last_judge_s > timeout_s / 4:
            self.tracker.observer_paused(now_s - self._last_judge_s - timeout_s / 4)
        self._last_judge_s = now_s
        as_of_s = now_s - self.behind_s()
        self._excess_s = []
        out = []
        for node in self._closed:
            workers = self.tracker.link_closed(node, set())
            if workers is not None:
                out.append((node, workers, "its launcher's link closed without a goodbye"))
        self._closed.clear()
        out += [(n, w, f"no report for {silent:.2f} s") for n, w, silent in self.tracker.verdicts(as_of_s)]
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
            self.note_delay(msg.node, msg.t_ns, self.gate.wall_ns())
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

    def _lost(self, link: _Link) -> None:
        self._open.discard(link)
        self.pending.settled(link)
        if link.timer is not None:
            link.timer.cancel()
        node = link.node
        if node is not None and self._links.get(node) is link:
            del self._links[node]
            if self._server is not None:
                self._closed.append(node)


class _Link(asyncio.Protocol):
    """One launcher's link as the hub reads it: whole lines out of the byte stream, each
    handed to the hub as it arrives (no task or stream per link: at thousands of links the
    hub's CPU goes to the lines, not to waking a reader per line)."""

    def __init__(self, hub: LivenessHub) -> None:
        self.hub = hub
        self.node: int | None = None   # bound by its first admitted line
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None   # its first line's deadline
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.hub._opened(self)

    def data_received(self, data: bytes) -> None:
        *lines, self._buf = (self._buf + data).split(b"\n")
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
