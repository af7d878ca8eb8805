"""Liveness over the launchers' links: one message per node per beat, judged in memory.

Why this exists: with per-node aggregation on etcd every node's launcher wrote its record
(its ranks' beats) into etcd every node beat, so etcd's load grew with the job and
saturated near 3k ranks (docs/benchmarks.md, ``membership_load``). Liveness is not
membership: it changes every beat and nobody needs it after the coordinator has judged
it. So each node's launcher sends its ranks' beats as one line over a TCP link it holds
to the coordinator (the link `runtime/nodelink.py` already opened for fast loss), the
coordinator judges nodes in memory (`detect.NodeTracker`), and etcd keeps only the
membership, written when it changes (`runtime/roster.py`).

Wire (text lines, one JSON object each, launcher -> coordinator): ``{"run": id, "node":
n, "seq": k, "beats": {wid: [counter, step]}}`` every beat; ``{"bye": true}`` before an
orderly exit. The coordinator sends nothing. A link that closes without a goodbye loses
its node at once (as nodelink); a node silent for ``hang_timeout_s`` is lost too.

`LivenessHub` (the coordinator's end) and `NodeReporter` (a launcher's end) run on an
asyncio loop; every wait is bounded (connect, reconnect tries, reads are per line).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from seamguard.runtime.detect import NodeTracker

MAX_LINE_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class NodeReport:
    """One node's beat as the coordinator received it."""

    node: int
    seq: int
    beats: dict[int, tuple[int, int]]   # worker id -> (heartbeat counter, step)


def encode_report(run_id: str, node: int, seq: int, beats: dict[int, tuple[int, int]]) -> bytes:
    return (json.dumps({"run": run_id, "node": node, "seq": seq,
                        "beats": {str(w): list(b) for w, b in beats.items()}}, separators=(",", ":")) + "\n").encode()


def decode_report(run_id: str, line: bytes) -> NodeReport | None:
    """The report in ``line``, None for a goodbye; ValueError (one line) for anything else."""
    try:
        msg = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"liveness link: not JSON ({exc})") from None
    if not isinstance(msg, dict):
        raise ValueError("liveness link: a message must be a JSON object")
    if msg.get("bye") is True:
        return None
    if msg.get("run") != run_id:
        raise ValueError(f"liveness link: run {msg.get('run')!r} is not this job's ({run_id!r})")
    try:
        beats = {int(w): (int(b[0]), int(b[1])) for w, b in msg["beats"].items()}
        return NodeReport(int(msg["node"]), int(msg["seq"]), beats)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ValueError(f"liveness link: malformed report ({type(exc).__name__}: {exc})") from None


class LivenessHub:
    """The coordinator's end: every node's link, one `NodeTracker` judging them.

    `judge(now_s)` returns the nodes newly lost (silent past the hang timeout, or whose
    link closed without a goodbye), each once, with the workers their last report listed.
    A pass that comes late (the coordinator got no CPU) is nobody's silence: the gap past
    a quarter of the timeout is forgiven, as the coordinator's tick does."""

    def __init__(self, run_id: str, hang_timeout_s: float, own_node: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_id = run_id
        self.clock = clock
        self.tracker = NodeTracker(hang_timeout_s, own_node=own_node)
        self.reports = 0
        self.refused: deque[str] = deque(maxlen=100)  # the newest refusals (a peer may send garbage forever)
        self._closed: list[int] = []
        self._last_judge_s: float | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_LINE_BYTES,
                                                  backlog=4096)
        return self._server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        """Stop listening and drop every link (their launchers look for the coordinator again)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    def observe(self, report: NodeReport, now_s: float) -> None:
        self.reports += 1
        self.tracker.observe(report.node, report.seq, set(report.beats), now_s)

    def members(self) -> dict[int, set[int]]:
        """Nodes heard and not lost: node -> the workers its last report listed."""
        return {n: set(w) for n, w in self.tracker.members.items() if n not in self.tracker.lost}

    def judge(self, now_s: float) -> list[tuple[int, set[int], str]]:
        timeout_s = self.tracker.hang_timeout_s
        if self._last_judge_s is not None and now_s - self._last_judge_s > timeout_s / 4:
            self.tracker.observer_paused(now_s - self._last_judge_s - timeout_s / 4)
        self._last_judge_s = now_s
        out = []
        for node in self._closed:
            workers = self.tracker.link_closed(node, set())
            if workers is not None:
                out.append((node, workers, "its launcher's link closed without a goodbye"))
        self._closed.clear()
        out += [(n, w, f"no report for {silent:.2f} s") for n, w, silent in self.tracker.verdicts(now_s)]
        return out

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        node: int | None = None
        self._writers.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line.endswith(b"\n"):
                    break   # end of file (or a cut line): the link closed
                report = decode_report(self.run_id, line)
                if report is None:
                    node = None   # an orderly goodbye: not a loss
                    break
                node = report.node
                self.observe(report, self.clock())
        except (ValueError, asyncio.LimitOverrunError) as exc:
            self.refused.append(str(exc))
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass   # the link broke, or the loop is ending
        finally:
            self._writers.discard(writer)
            if node is not None and self._server is not None:
                self._closed.append(node)
            writer.close()


class NodeReporter:
    """A launcher's end: sends its node's beats every ``beat_s`` to the coordinator that
    ``locate()`` names (the election key's value), reconnecting when the link breaks
    (a new coordinator was elected): every ``retry_s`` for up to ``give_up_s`` (a failover
    takes the lease's length), each try bounded, then `ConnectionError` for the launcher to
    end the node's part of the job."""

    def __init__(self, run_id: str, node: int, beat_s: float,
                 locate: Callable[[], Awaitable[tuple[str, int] | None]],
                 beats: Callable[[], dict[int, tuple[int, int]]], give_up_s: float = 60.0,
                 retry_s: float = 0.25) -> None:
        self.run_id, self.node, self.beat_s = run_id, node, beat_s
        self.locate, self.beats = locate, beats
        self.give_up_s, self.retry_s = give_up_s, retry_s
        self.seq = 0
        self.connects = 0
        self._writer: asyncio.StreamWriter | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Beat until ``stop`` is set; then say goodbye."""
        while not stop.is_set():
            if self._writer is None:
                await self._connect(stop)
                continue
            self.seq += 1
            try:
                self._writer.write(encode_report(self.run_id, self.node, self.seq, self.beats()))
                await asyncio.wait_for(self._writer.drain(), self.beat_s)
            except (OSError, asyncio.TimeoutError):
                self._drop()
                continue
            try:
                await asyncio.wait_for(stop.wait(), self.beat_s)
            except asyncio.TimeoutError:
                pass
        if self._writer is not None:
            self._writer.write(b'{"bye":true}\n')
            try:
                await asyncio.wait_for(self._writer.drain(), self.beat_s)
            except (OSError, asyncio.TimeoutError):
                pass
            self._drop()

    async def _connect(self, stop: asyncio.Event) -> None:
        deadline_s = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline_s:
            if stop.is_set():
                return
            try:
                where = await self.locate()   # bounded by its etcd client's call timeout; not cut short
                if where is not None:
                    _, self._writer = await asyncio.wait_for(asyncio.open_connection(*where), CONNECT_TIMEOUT_S)
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
