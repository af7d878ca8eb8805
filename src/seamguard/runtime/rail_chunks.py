"""One attempt of a multi-rail collective: its open chunks run once on the usable rails.

Why this exists: runtime/rails.py decides which chunks run where and what the ranks agree
on; this runs one attempt and says how it went: which chunks finished here, which rails
failed (an op's error, a peer's flag, a missed deadline: `overdue`), and the chunk times
and bandwidth each rail showed (what this rank votes). Each chunk runs on a private buffer
(runtime/rail_transport.py's `ChunkBuffers`) because an abandoned op may still write into
it; the training thread waits inside gloo (`nap`), woken by a completion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from seamguard.runtime.rail_decide import OpDeadline, RailSettings, overdue
from seamguard.runtime.rail_transport import ChunkBuffers, nap


@dataclass
class Attempt:
    """This rank's outcome of running the open chunks once; what it votes."""

    deadline: dict[int, OpDeadline]  # per usable rail: the agreed deadline this attempt uses
    ok: dict[int, bool] = field(default_factory=dict)  # chunk -> finished here
    failed: set[int] = field(default_factory=set)
    bw: dict[int, float] = field(default_factory=dict)
    chunk_s: dict[int, float] = field(default_factory=dict)  # as in Vote.chunk_s
    results: dict[int, torch.Tensor] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)  # chunks whose op finished or never ran
    todo: list[int] = field(default_factory=list)  # the chunks this attempt ran
    usable: list[int] = field(default_factory=list)  # the rails it ran them on (chunk c: c % len)



class ChunkRunner:
    """Runs attempts over a rail group's rails, told by the group what each rail is now.

    ``rail_now(r)``: the rail's group (None once parked), its agreed generation and the
    deadline its chunks get; ``flagged(r, gen)``: this rank has seen that generation of the
    rail fail; ``announce(r, gen)``: tell the peers this rank gave it up.
    """

    def __init__(self, settings: RailSettings, bufs: ChunkBuffers,
                 rail_now: Callable[[int], tuple[dist.ProcessGroup | None, int, OpDeadline]],
                 flagged: Callable[[int, int], bool], announce: Callable[[int, int], None]) -> None:
        self.s, self._bufs = settings, bufs
        self._rail_now, self._flagged, self._announce = rail_now, flagged, announce
        self.causes: list[dict] = []  # why this rank abandoned chunks (carrier, peer flag, timeout)

    @staticmethod
    def _issue(kind: str, pg: dist.ProcessGroup, buf: torch.Tensor, src: int) -> dist.Work:
        if kind == "allreduce":
            return pg.allreduce([buf])
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        return pg.broadcast([buf], opts)

    def run(self, kind: str, chunks: list[torch.Tensor], todo: list[int], usable: list[int],
            src: int) -> Attempt:
        """Run the chunks `todo` on the usable rails once; give up a rail on its first failure.

        A chunk's time counts from when the chunks issued before it on the same rail were
        done (a rail carrying two chunks gives each its own time). That time, and how long
        ago a chunk finished on another rail, decide whether it is overdue (`overdue`); the
        longest such time per rail is voted as the rail's chunk time (`Vote.chunk_s`).
        """
        now_of = {r: self._rail_now(r) for r in usable}
        res = Attempt({r: now_of[r][2] for r in usable})
        pending: dict[int, tuple[int, int, dist.Work, float]] = {}  # chunk -> rail, gen, work, issued
        queue: dict[int, list[int]] = {r: [] for r in usable}  # rail -> its unresolved chunks, in issue order
        clock: dict[int, float] = {}  # chunk -> when its own time began (it reached the head of its rail)
        elapsed: dict[int, list[tuple[int, float]]] = {}
        for c in todo:
            r = usable[c % len(usable)]
            pg, gen, _ = now_of[r]
            buf = self._bufs.copy_of(chunks[c])  # private: an abandoned op may still write into it
            res.results[c] = buf
            if pg is None or self._flagged(r, gen):
                res.settled.add(c)
                res.ok[c] = False
                res.failed.add(r)
                continue
            try:
                pending[c] = (r, gen, self._issue(kind, pg, buf, src), time.monotonic())
                queue[r].append(c)
            except Exception:  # noqa: BLE001
                res.ok[c] = False
                res.failed.add(r)

        clock.update({q[0]: pending[q[0]][3] for q in queue.values() if q})

        def took(r: int, dt: float) -> None:
            res.chunk_s[r] = max(res.chunk_s.get(r, 0.0), dt)

        done_t: dict[int, float] = {}  # rail -> when its first chunk of this attempt finished
        while pending:
            now = time.monotonic()
            for c, (r, gen, work, t0) in list(pending.items()):
                if work.is_completed():
                    try:
                        work.wait()
                        res.ok[c] = True
                        res.settled.add(c)
                        done_t.setdefault(r, now)
                        elapsed.setdefault(r, []).append((chunks[c].numel() * 4, now - t0))
                        if c in clock:
                            took(r, now - clock[c])
                    except Exception as e:  # noqa: BLE001 - peer gone / gloo timeout
                        self.causes.append({"rail": r, "gen": gen, "after_s": round(now - t0, 3),
                                            "cause": f"error: {str(e)[:80]}"})
                        res.ok[c] = False
                        res.failed.add(r)
                        self._announce(r, gen)
                else:
                    why = ""
                    if self._flagged(r, gen):
                        cause = "flagged"
                    elif r in res.failed:
                        cause = "sibling"
                    else:
                        others = [x for q, x in done_t.items() if q != r]
                        why = overdue(now - clock[c], now - min(others) if others else None,
                                      res.deadline[r], self.s) if c in clock else ""
                        if not why:
                            continue
                        cause = "timeout"
                        took(r, now - clock[c])  # it took at least this long
                    self.causes.append({"rail": r, "gen": gen, "after_s": round(now - t0, 3), "cause": cause,
                                        **({"why": why} if why else {})})
                    res.ok[c] = False  # abandoned: the buffer is private, the group gets parked
                    res.failed.add(r)
                    self._announce(r, gen)
                del pending[c]
                queue[r].remove(c)
                if queue[r] and queue[r][0] not in clock:
                    clock[queue[r][0]] = now  # the chunks ahead of it on this rail are done
            if pending:
                nap(pending[next(iter(pending))][2])
        for r, xs in elapsed.items():
            nbytes = sum(b for b, _ in xs)
            if r not in res.failed and min(b for b, _ in xs) >= self.s.min_gray_bytes:
                res.bw[r] = nbytes / max(max(t for _, t in xs), 1e-9)
        return res
