"""Fabric probe, Pingmesh-style: TCP round trips from each rail's address to peers on that rail.

Every agent runs a tiny echo responder and probes a bounded set of peers (at most
``MAX_PEERS_PER_RAIL`` per rail, validated in the config) from the source address of each
of its rails, so the series say which (source NIC, destination NIC) pairs are slow or lossy.
A gray NIC or NIC-to-leaf link shows on every pair from (or to) that NIC; a gray leaf or
spine uplink on the pairs that cross it — the controller localizes from the pattern
(C. Guo et al., "Pingmesh", SIGCOMM 2015; docs/agent.md).

A probe is a fresh TCP connection bound to the rail's source address, one payload echoed
back; its RTT is the echo's round trip, and a failed connect, a reset or an answer later
than ``timeout_s`` is a loss. A round visits every pair once, sequentially, so one round
costs at most ``pairs x timeout_s`` and the agent never holds more than one probe socket.

The echo responder answers configured peers only: a connection from any other source
address is closed at accept, and one source holds at most ``MAX_ECHO_PER_SOURCE`` of the
``MAX_ECHO_CONNECTIONS`` slots, for at most ``timeout_s`` each (a probe is one echo), so a
client that connects and idles — peer or not — cannot starve the peers' probes. Every
refusal is counted by reason (``seamguard_fabric_echo_refused_total``). A peer is trusted
only as far as its source address: a hostile peer can make probes to this node slow or
lost for its own four slots, and nothing else (docs/agent.md, "Threat model").
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("seamguard.agent.fabric")

MAX_ECHO_CONNECTIONS = 64
MAX_ECHO_PER_SOURCE = 4  # a prober holds one at a time; a few more cover a closing one and retries
NOT_A_PEER, SOURCE_BUSY, FULL = "not_a_peer", "source_busy", "full"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def source_ip(addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The peer's address as the allow list sees it: an IPv4-mapped IPv6 address (a dual-stack
    listener) as IPv4, a zone (``%eth0``) dropped; None for what is not an address."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def admit(addr: str, allowed: tuple[Network, ...], held: dict[str, int], in_use: int) -> str | None:
    """Why a connection from ``addr`` is refused (a reason), or None to take a slot. Pure."""
    ip = source_ip(addr)
    if ip is None or not any(ip.version == n.version and ip in n for n in allowed):
        return NOT_A_PEER
    if held.get(str(ip), 0) >= MAX_ECHO_PER_SOURCE:
        return SOURCE_BUSY
    if in_use >= MAX_ECHO_CONNECTIONS:
        return FULL
    return None


@dataclass(frozen=True)
class Pair:
    """One probed path: this node's NIC on a rail to a peer's NIC on the same rail."""

    src_nic: str
    src_addr: str
    dst_nic: str
    dst_addr: str
    port: int
    rail: int
    link: str | None = None  # the source NIC's link in the topology, when configured


def probe_once(pair: Pair, payload_bytes: int, timeout_s: float, seq: int = 0) -> float | None:
    """The echo round trip in seconds, or None when the probe was lost (refused, reset, timed out)."""
    payload = struct.pack("!Q", seq) + b"\x00" * max(0, payload_bytes - 8)
    payload = payload[:payload_bytes]
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((pair.dst_addr, pair.port), timeout=timeout_s,
                                      source_address=(pair.src_addr, 0)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t0 = time.perf_counter()
            s.sendall(payload)
            got = 0
            while got < len(payload):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                s.settimeout(left)
                chunk = s.recv(65536)
                if not chunk:
                    return None
                got += len(chunk)
            return time.perf_counter() - t0
    except OSError:  # refused, unreachable, reset, timeout
        return None


class EchoServer:
    """Echoes one probe per connection to allowed sources; bounded in slots, per source and in time."""

    def __init__(self, host: str, port: int, timeout_s: float, allowed: tuple[Network, ...]) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(128)
        self.sock.settimeout(0.2)  # so stop() is noticed
        self.port = int(self.sock.getsockname()[1])
        self.timeout_s, self.allowed = timeout_s, allowed
        self.lock = threading.Lock()
        self.held: dict[str, int] = {}  # source address -> slots it holds
        self.refused: dict[str, int] = {NOT_A_PEER: 0, SOURCE_BUSY: 0, FULL: 0}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="fabric-echo", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=1.0)
        self.sock.close()

    def refusals(self) -> dict[str, int]:
        with self.lock:
            return dict(self.refused)

    def _accept(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            src = str(source_ip(peer[0]) or peer[0])
            with self.lock:
                why = admit(peer[0], self.allowed, self.held, sum(self.held.values()))
                if why is None:
                    self.held[src] = self.held.get(src, 0) + 1
                else:
                    self.refused[why] += 1
            if why is not None:
                conn.close()  # the prober counts it as lost, which it is
                continue
            threading.Thread(target=self._echo, args=(conn, src), daemon=True).start()

    def _echo(self, conn: socket.socket, src: str) -> None:
        """Echo until the prober closes, for at most ``timeout_s`` in all: a probe is one round trip."""
        deadline = time.monotonic() + self.timeout_s
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)
        except OSError:
            return
        finally:
            conn.close()
            with self.lock:
                self.held[src] -= 1
                if not self.held[src]:
                    del self.held[src]


class FabricProber:
    """Probe rounds on a thread; ``record(pair, rtt_or_None)`` feeds the exporter after each probe."""

    def __init__(self, pairs: list[Pair], interval_s: float, timeout_s: float, payload_bytes: int,
                 record: Callable[[Pair, float | None], None]) -> None:
        self.pairs, self.interval_s, self.timeout_s = pairs, interval_s, timeout_s
        self.payload_bytes, self.record = payload_bytes, record
        self.lock = threading.Lock()
        self.link_us: dict[str, float] = {}
        self.rounds = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="fabric-probe", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():  # never started (`agent --check`): nothing to wait for
            self.thread.join(timeout=self.timeout_s + 1.0)

    def run_round(self) -> dict[Pair, float | None]:
        out: dict[Pair, float | None] = {}
        for pair in self.pairs:
            if self.stop_event.is_set():
                break
            rtt = probe_once(pair, self.payload_bytes, self.timeout_s, seq=self.rounds)
            out[pair] = rtt
            self.record(pair, rtt)
        with self.lock:
            self.link_us = link_latency_us(out)
            self.rounds += 1
        return out

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            self.run_round()
            self.stop_event.wait(self.interval_s)

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return dict(self.link_us)


def link_latency_us(round_rtts: dict[Pair, float | None]) -> dict[str, float]:
    """Per configured source link: the fastest answered RTT (µs) over its peers in one round.

    A gray NIC or NIC-to-leaf link slows every path through it, so even its fastest pair is
    slow; a gray peer (or a peer's busy host) slows only the pairs to that peer, and the
    fastest pair stays fast. The minimum therefore blames only the NIC whose own link is
    slow. A median does not: with two peers on a rail it is the mean of one slow and one
    fast pair, so a single gray peer raises every source's gauge (seen on the three-host
    seam drill, where h1's and h2's links read as gray when only h0's was). Queueing and
    scheduling noise only add time, so the minimum is also the least noisy estimate of the
    link's own contribution. With one peer on a rail the gauge cannot tell the two ends
    apart; the per-pair series can, across agents. A link whose probes were all lost has
    no value this round (loss is in the counters).
    """
    by_link: dict[str, float] = {}
    for pair, rtt in round_rtts.items():
        if pair.link is not None and rtt is not None:
            by_link[pair.link] = min(rtt, by_link.get(pair.link, rtt))
    return {link: rtt * 1e6 for link, rtt in by_link.items()}
