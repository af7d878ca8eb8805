"""SIGKILL a training job's ranks at planned points of their steps, from outside the job.

benchmarks/failover_training.py runs one ``Killer`` beside each faulted run, whatever the
system (seamguard, torchrun + DCP, torchft), so every system meets the same kills the
same way: the killer tails the job's step logs (``worker_*.log``: ``step time rank world
gen [pid]`` per committed step), and for a planned (step, rank, phase) waits for step - 2
to be committed after the previous kill, then sleeps until one step time later plus
``phase`` of a step (the job's own step time, measured from those logs) and SIGKILLs the
process holding that rank. Aiming from two steps back leaves a whole step of slack, so
early phases are reachable; where the kill really landed is read back from the logs
afterwards (``_kill_points.landed``). Every wait is bounded by the run's own deadline.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from _kill_points import KillPoint, Row, step_time_s

POLL_S = 0.003


class LogTail:
    """Rows of every ``worker_*.log`` under a directory, read incrementally."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self.rows: list[Row] = []
        self.pid_of_row: dict[Row, int | None] = {}
        self.source_of_row: dict[Row, str] = {}

    def poll(self) -> list[Row]:
        """Read what was appended since the last poll; returns the new rows."""
        new: list[Row] = []
        for f in self.out.glob("worker_*.log"):
            with open(f) as fh:
                fh.seek(self._offsets.get(f, 0))
                text = self._partial.pop(f, "") + fh.read()
                self._offsets[f] = fh.tell()
            lines = text.split("\n")
            if lines[-1]:
                self._partial[f] = lines[-1]   # a line still being written
            for line in lines[:-1]:
                p = line.split()
                if len(p) < 5:
                    continue
                row = Row(int(p[0]), float(p[1]), int(p[2]), int(p[4]))
                self.pid_of_row[row] = int(p[5]) if len(p) > 5 else None
                self.source_of_row[row] = f.stem
                new.append(row)
        self.rows.extend(new)
        return new

    def newest_of(self, rank: int, after_s: float) -> Row | None:
        mine = [r for r in self.rows if r.rank == rank and r.time_s > after_s]
        return max(mine, key=lambda r: r.time_s) if mine else None


#: pid_of(tail, rank, after_s): the process holding ``rank`` now, or None if not known yet.
PidOf = Callable[[LogTail, int, float], "int | None"]


def pid_from_rows(tail: LogTail, rank: int, after_s: float) -> int | None:
    """The pid the rank's newest row carries (torchrun_train.py, torchft_train.py log it)."""
    row = tail.newest_of(rank, after_s)
    return tail.pid_of_row.get(row) if row else None


class Killer:
    """One thread that carries out a kill plan against one run; ``records`` after ``stop``."""

    def __init__(self, out: Path, plan: tuple[KillPoint, ...], pid_of: PidOf,
                 step_s_hint: float, deadline_s: float) -> None:
        self.tail = LogTail(out)
        self.plan, self.pid_of, self.step_s_hint = plan, pid_of, step_s_hint
        self.deadline = time.monotonic() + deadline_s
        self.records: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="killer", daemon=True)

    def start(self) -> "Killer":
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.tail.poll()
        return self.records

    def _alive(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self.deadline

    def _run(self) -> None:
        prev_kill_s = 0.0
        for kp in sorted(self.plan, key=lambda k: k.step):
            ref = self._wait_commit(kp.step - 2, prev_kill_s)
            if ref is None:
                return
            step_s = step_time_s([r for r in self.tail.rows if r.time_s > prev_kill_s], ref.time_s) \
                or self.step_s_hint
            target = ref.time_s + (1.0 + kp.phase) * step_s
            while self._alive() and time.time() < target:
                time.sleep(min(POLL_S, max(0.0, target - time.time())))
            rec = self._kill(kp, prev_kill_s)
            if rec is None:
                return
            self.records.append({**rec, "aim_step_s": round(step_s, 4)})
            prev_kill_s = rec["time_s"]

    def _wait_commit(self, step: int, after_s: float) -> Row | None:
        """The first commit of ``step`` (any rank) logged after ``after_s``."""
        rows = self.tail.rows
        while self._alive():
            hits = [r for r in rows if r.step == step and r.time_s > after_s]
            if hits:
                return min(hits, key=lambda r: r.time_s)
            time.sleep(POLL_S)
            rows = self.tail.poll()   # only what is new needs a look
        return None

    def _kill(self, kp: KillPoint, after_s: float) -> dict | None:
        while self._alive():
            self.tail.poll()
            pid = self.pid_of(self.tail, kp.rank, after_s)
            if pid is not None:
                t = time.time()
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:   # it ended on its own; try the rank's next process
                    time.sleep(POLL_S)
                    continue
                return {"time_s": t, "step": kp.step, "rank": kp.rank, "aim_phase": round(kp.phase, 4),
                        "pid": pid}
            time.sleep(POLL_S)
        return None
