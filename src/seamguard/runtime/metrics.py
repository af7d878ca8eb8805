"""The runtime reports itself: per-rank and per-job progress as Prometheus text.

`seamguard launch --metrics-port P` (node 0) serves what its coordinator sees in the
workers' heartbeats, under the names the control plane reads (seamguard.observe.signals):
each rank's compute time of its last step on its GPU (``Hostname``, ``gpu`` labels, one
rank per GPU), the job's wall time per step and its progress, recoveries and losses
(``job_name`` label). These are the live inputs of useful throughput (a rank computing
slower than its peers) and rollback exposure (steps since the last persisted one).
Pure: :func:`render` turns a :class:`JobView` into text; :class:`MetricsServer` serves it
(the launcher's, and rank 0's of a job started without it: runtime/jobhook.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankView:
    """One training rank as its last heartbeat showed it."""

    rank: int
    wid: int
    host: str
    local: int  # local slot on its node: its GPU index
    step: int
    compute_s: float  # the last step: compute before its gradient collective
    phase: str
    comm_s: float = 0.0  # the last step's gradient collective
    stall_s: float = 0.0  # the last step's wait for its snapshot copy
    snapshot_step: int = -1  # newest step whose snapshot is complete in host memory
    persisted_step: int = -1  # newest step this rank committed to storage


@dataclass(frozen=True)
class JobView:
    job: str
    ranks: tuple[RankView, ...]
    generation: int
    furthest_step: int
    step_seconds: float | None  # wall seconds per step, over the recent steps
    recoveries: int
    lost: int
    hints_refused: tuple[tuple[str, int], ...] = ()
    """(reason, count) of the control-plane hints the job refused (runtime/hintauth.py)."""

    @property
    def persisted_step(self) -> int:
        """The newest step every rank committed, as the ranks report it (-1: none yet).

        A replacement that has not persisted yet reports -1; its predecessor's commits
        are in the checkpoint, so such ranks are left out while any rank reports one."""
        done = [r.persisted_step for r in self.ranks if r.persisted_step >= 0]
        return min(done) if done else -1

    @property
    def snapshot_step(self) -> int:
        """The newest step whose snapshot every rank holds in host memory (-1: none)."""
        return min((r.snapshot_step for r in self.ranks), default=-1)

    @property
    def uncommitted_s(self) -> float | None:
        """Wall seconds of training a restart from storage would redo: the steps after the
        newest persisted one at the job's current seconds per step (rollback exposure)."""
        if self.step_seconds is None:
            return None
        return max(self.furthest_step - max(self.persisted_step, 0), 0) * self.step_seconds


@dataclass
class StepClock:
    """Wall seconds per step from when the furthest step advanced (the last ``window`` advances)."""

    window: int = 16
    _seen: deque = field(default_factory=lambda: deque(maxlen=17))

    def advance(self, step: int, t_s: float) -> None:
        if not self._seen or step > self._seen[-1][0]:
            self._seen.append((step, t_s))

    def seconds_per_step(self) -> float | None:
        if len(self._seen) < 2:
            return None
        (s0, t0), (s1, t1) = self._seen[0], self._seen[-1]
        return (t1 - t0) / (s1 - s0)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(v: JobView) -> str:
    """Prometheus text exposition (version 0.0.4) of one job."""
    job = f'job_name="{_esc(v.job)}"'
    out = ["# HELP seamguard_rank_compute_seconds compute time of the rank's last step before its collective",
           "# TYPE seamguard_rank_compute_seconds gauge"]
    for r in sorted(v.ranks, key=lambda r: r.rank):
        out.append(f'seamguard_rank_compute_seconds{{Hostname="{_esc(r.host)}",gpu="{r.local}",{job},'
                   f'rank="{r.rank}",worker="{r.wid}"}} {r.compute_s:.6g}')
    ranks = sorted(v.ranks, key=lambda r: r.rank)
    for name, help_, attr in (("seamguard_rank_comm_seconds", "the rank's gradient collective in its last step", "comm_s"),
                              ("seamguard_rank_checkpoint_stall_seconds",
                               "time the rank's last step waited for its snapshot copy", "stall_s")):
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        out += [f'{name}{{{job},rank="{r.rank}"}} {getattr(r, attr):.6g}' for r in ranks]
    out += ["# HELP seamguard_rank_step the step each rank is on", "# TYPE seamguard_rank_step gauge"]
    out += [f'seamguard_rank_step{{{job},rank="{r.rank}"}} {r.step}' for r in ranks]
    if v.step_seconds is not None:
        out += ["# HELP seamguard_job_step_seconds wall time of the job's last steps, per step",
                "# TYPE seamguard_job_step_seconds gauge", f"seamguard_job_step_seconds{{{job}}} {v.step_seconds:.6g}",
                "# HELP seamguard_job_uncommitted_seconds training a restart from storage would redo "
                "(steps after the newest persisted one x seconds per step)",
                "# TYPE seamguard_job_uncommitted_seconds gauge",
                f"seamguard_job_uncommitted_seconds{{{job}}} {v.uncommitted_s:.6g}"]
    out += ["# HELP seamguard_job_step the furthest step any rank has reached", "# TYPE seamguard_job_step gauge",
            f"seamguard_job_step{{{job}}} {v.furthest_step}",
            "# HELP seamguard_job_snapshot_step the newest step every rank holds a snapshot of in host memory",
            "# TYPE seamguard_job_snapshot_step gauge", f"seamguard_job_snapshot_step{{{job}}} {v.snapshot_step}",
            "# HELP seamguard_job_persisted_step the newest step every rank committed to storage (-1: none)",
            "# TYPE seamguard_job_persisted_step gauge", f"seamguard_job_persisted_step{{{job}}} {v.persisted_step}",
            "# HELP seamguard_job_generation the membership generation (one per recovery)",
            "# TYPE seamguard_job_generation gauge", f"seamguard_job_generation{{{job}}} {v.generation}",
            "# HELP seamguard_job_recoveries_total recoveries without restarting the survivors",
            "# TYPE seamguard_job_recoveries_total counter", f"seamguard_job_recoveries_total{{{job}}} {v.recoveries}",
            "# HELP seamguard_job_workers_lost_total worker processes lost (killed, hung, evacuated)",
            "# TYPE seamguard_job_workers_lost_total counter", f"seamguard_job_workers_lost_total{{{job}}} {v.lost}"]
    if v.hints_refused:
        out += ["# HELP seamguard_job_hints_refused_total control-plane hints refused (unsigned, forged, "
                "replayed, stale, outside the checkpoint roots)",
                "# TYPE seamguard_job_hints_refused_total counter"]
        out += [f'seamguard_job_hints_refused_total{{{job},reason="{_esc(r)}"}} {n}' for r, n in v.hints_refused]
    return "\n".join(out) + "\n"


class MetricsServer:
    """``GET /metrics`` on a daemon thread; the supervising loop publishes the text at most
    twice a second, so a scrape never touches the coordinator's state."""

    def __init__(self, port: int, every_s: float = 0.5) -> None:
        import http.server
        import threading

        body = {"text": b""}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                data = body["text"]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self._body, self._every_s, self._last = body, every_s, -1e9
        self._server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="seamguard-metrics", daemon=True).start()

    def publish(self, text) -> None:
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._body["text"], self._last = text().encode(), now

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
