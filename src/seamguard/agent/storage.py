"""Storage probe: a timed file create + small write + fsync, then a read, on each checkpoint path.

What a checkpoint writer feels, sampled: each path gets its own thread, so a hung file
system (an NFS server gone, a Lustre OST stuck) stalls only its own probe. The write clock
starts before the file is created (open with O_CREAT): a checkpoint writer creates its
files, and a slow metadata server (Lustre MDS, an NFS server's directory operations) shows
up in the create, not in the data path. At most one
probe per path is in flight; one running past ``timeout_s`` is reported as failed at once
(the scrape never waits for it) and the next probe starts only after it returns.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("seamguard.agent.storage")


def probe_path(path: Path, size: int, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(create+write+fsync seconds, read seconds) of a ``size``-byte temp file under ``path``, removed after.

    Raises OSError when the path cannot be created, written or read.
    """
    payload = os.urandom(size)
    t0 = clock()
    fd, name = tempfile.mkstemp(prefix=".seamguard-probe-", dir=path)  # open(O_CREAT | O_EXCL)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        t1 = clock()
        os.lseek(fd, 0, os.SEEK_SET)
        got = b""
        while len(got) < size:
            chunk = os.read(fd, size - len(got))
            if not chunk:
                break
            got += chunk
        t2 = clock()
        if got != payload:
            raise OSError(f"read back {len(got)} bytes that differ from what was written")
        return t1 - t0, t2 - t1
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass


@dataclass
class PathState:
    """What the scrape reads about one path (written by its probe thread under the lock)."""

    name: str
    path: Path
    up: float = float("nan")  # 1 last probe ok, 0 failed or stuck, NaN before the first
    writes: deque = field(default_factory=deque)  # recent create+write+fsync seconds
    in_flight_since: float | None = None
    stuck_reported: bool = False
    last_error: str = ""
    logged_error: str = ""  # the error last logged: a path failing the same way logs once


class StorageProber:
    """One thread per path; ``observe(name, op, seconds)`` and ``fail(name, reason)`` feed the exporter."""

    def __init__(self, paths: list[tuple[str, Path]], interval_s: float, timeout_s: float, size: int, window: int,
                 observe: Callable[[str, str, float], None], fail: Callable[[str, str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.timeout_s, self.size = interval_s, timeout_s, size
        self.observe, self.fail_cb, self.clock = observe, fail, clock
        self.states = {n: PathState(n, p, writes=deque(maxlen=window)) for n, p in paths}
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(n,), name=f"storage-probe-{n}", daemon=True)
                        for n in self.states]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            if t.is_alive():  # never started (`agent --check`) or already ended: nothing to wait for
                t.join(timeout=0.2)  # a probe stuck in fsync cannot be interrupted; it is a daemon thread

    def _loop(self, name: str) -> None:
        st = self.states[name]
        while not self.stop_event.is_set():
            with self.lock:
                st.in_flight_since, st.stuck_reported = self.clock(), False
            try:
                w, r = probe_path(st.path, self.size)
                err = ""
            except OSError as e:
                w = r = float("nan")
                err = f"{type(e).__name__}: {e.strerror or e}"
            with self.lock:
                stuck = st.stuck_reported
                st.in_flight_since = None
                if err:
                    st.up, st.last_error = 0.0, err
                else:
                    st.writes.append(w)
                    st.up = 1.0 if w + r <= self.timeout_s else 0.0
            if err:
                if err != st.logged_error:
                    log.warning("storage probe %s (%s): %s", name, st.path, err)
                    st.logged_error = err
                self.fail_cb(name, "error")
            else:
                self.observe(name, "write", w)
                self.observe(name, "read", r)
                if w + r > self.timeout_s and not stuck:
                    self.fail_cb(name, "timeout")
            self.stop_event.wait(self.interval_s)

    def snapshot(self) -> list[tuple[str, str, float, float]]:
        """(name, path, up, p99 write ms) per path; a probe in flight past the timeout reads as down."""
        now = self.clock()
        out = []
        with self.lock:
            for st in self.states.values():
                up = st.up
                if st.in_flight_since is not None and now - st.in_flight_since > self.timeout_s:
                    up = 0.0
                    if not st.stuck_reported:
                        st.stuck_reported = True
                        self.fail_cb(st.name, "timeout")
                p99 = float(np.percentile(np.fromiter(st.writes, float), 99)) * 1e3 if st.writes else float("nan")
                if up == 0.0 and st.in_flight_since is not None:
                    # still waiting on a write: the latency it shows is at least how long it has waited
                    p99 = max(0.0 if math.isnan(p99) else p99, (now - st.in_flight_since) * 1e3)
                out.append((st.name, str(st.path), up, p99))
        return out
