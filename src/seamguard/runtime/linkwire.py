"""The liveness links' wire: signed lines, their admission, and the bound on links not yet bound.

Why this exists apart from `runtime/liveness.py`: the wire format and its checks are used
by both ends and by the launcher's own link (`runtime/nodelink.py`), and hold no socket
or loop; the hub and the reporter that run on them are in liveness.py, whose docstring
describes the wire (``sg-live-v1 <hub> <node> <seq> <t_ns> <hmac> <body>``), the key
(`link_key`), replay and staleness (`LinkGate`), and the bound on links that no admitted
line has bound to a node (`PendingLinks`).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field


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

