"""What the runtime says happened: one event record, for people on stderr, as JSON in a file.

The node launcher (its coordinator's events) and every worker (its notes) write through an
EventLog. By default stderr gets one line a person reads — wall-clock time, who (the
launcher, or a worker with its rank and pid), what happened and what it cost — and
``--log-format json`` prints the JSON records instead. ``--events-file`` always gets the
JSON records, one per line; workers append theirs to the same file as
``{"event": "worker", "kind": …}`` (one ``write`` of one whole
line on an ``O_APPEND`` file each, so lines never run together). Pure rendering
(:func:`describe`) is separate from writing (:class:`EventLog`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Literal

LogFormat = Literal["text", "json"]
LOG_FORMAT_ENV = "SEAMGUARD_LOG_FORMAT"
EVENTS_FILE_ENV = "SEAMGUARD_EVENTS_FILE"


def _workers(ws) -> str:
    return ", ".join(f"w{w}" for w in ws) if ws else "none"


def _generic(name: str, e: dict) -> str:
    skip = {"t", "event", "kind", "wid", "pid", "rank"}
    rest = ", ".join(f"{k}={v}" for k, v in e.items() if k not in skip)
    return name.replace("_", " ") + (f": {rest}" if rest else "")


def describe(e: dict) -> str:
    """The event in words (no time, no who)."""
    name = str(e.get("kind") if e.get("event") == "worker" else e.get("event") or "event")
    gen = e.get("gen")
    if name == "plan":
        if gen == 0:
            return f"starting {len(e['ranks'])} ranks on workers {_workers(e['ranks'])}; spares {_workers(e['spares'])}"
        return (f"generation {gen}: {e.get('reason') or 'replan'}; ranks on workers {_workers(e['ranks'])}; "
                f"spares {_workers(e['spares'])}" + ("; from storage" if e.get("force_disk") else ""))
    if name == "resumed":
        if gen == 0:
            return f"all ranks running from step {e['step']}"
        since = e.get("since_detection_s")
        redone = e.get("steps_redone")
        return (f"recovered: generation {gen} resumed at step {e['step']}, {e['recovery_s']:.2f} s"
                + (f" ({since:.2f} s since the loss was detected)" if since is not None else "")
                + (f", {redone} step{'s' if redone != 1 else ''} redone" if redone is not None else ""))
    if name == "detected":
        what = {"exited": f"exited with code {e.get('code')}", "unresponsive": "unresponsive (heartbeat stopped)",
                "stalled": "stalled (its step stands still while its peers wait)",
                "straggler": "is a straggler",
                "evacuate_hint": f"asked to evacuate (rank {e.get('rank')})"}.get(e.get("kind"), e.get("kind"))
        ev = e.get("evidence")
        return f"worker w{e['wid']} {what}" + (f" ({ev})" if ev else "")
    if name == "node_lost":
        return f"node {e['node']} lost with workers {_workers(e['wids'])} ({e.get('evidence')})"
    if name == "coordinator_lost":
        return (f"node 0 (the coordinator) silent for {e['silent_s']} s: ending this node's part of the job; "
                "restart the job (etcd kept its store; persisted checkpoints resume it)")
    if name == "took_over":
        return (f"node {e['node']}'s launcher coordinates now: node {e['from_node']}'s lease expired "
                f"(generation {gen}, {e['phase']})")
    if name == "coordinator_deposed":
        return f"this launcher coordinates no more ({e['reason']}): ending this node's part of the job"
    if name == "job_outcome_unknown":
        return (f"this node's workers ended but the job's end did not reach it within {e['waited_s']} s: "
                "its outcome is unknown here (exit 1); the coordinator's node logs it")
    if name == "resume_chosen":
        return f"generation {gen} restores from {e['source']} at step {e['step']}"
    if name == "job_done":
        return f"every rank finished (generation {gen})"
    if name == "waiting_for_spares":
        short = e.get("deficit")
        return (f"waiting for a replacement of {_workers(e.get('lost'))} ({short} rank{'s' if short != 1 else ''} "
                "short, no spare ready; bounded by spare_wait_s)")
    if name == "job_failed":
        return f"JOB FAILED: {e['reason']}"
    if name == "stale_slots_removed":
        return (f"removed {e['files']} snapshot slot file(s) ({e['mib']} MiB) from /dev/shm "
                "whose worker and launcher are gone (a launcher killed before it could clean up)")
    if name == "snapshot_interval":
        return (f"snapshots every {e['every_steps']} steps from step {e['from_step']} (Daly's interval: a snapshot "
                f"costs {e['cost_s']:.3f} s, a step {e['step_s']:.3f} s, {e['ranks']} ranks failing every "
                f"{e['rank_mttf_h']:.0f} h each)")
    if name == "spare_ready":
        return f"spare {_workers(e['wids'])} ready"
    if name == "started":
        return f"started as rank {e['rank']} at step {e['step']} ({e['seconds']:.2f} s)"
    if name == "recovered":
        return (f"joined generation {gen} as rank {e['rank']} at step {e['step']} "
                f"({e['seconds']:.2f} s)")
    if name == "finished":
        return (f"finished at step {e['step']}: {e.get('snapshots', 0)} snapshots "
                f"({e.get('snapshot_stall_s', 0.0):.2f} s of stall), "
                f"{e.get('replica_bytes_sent', 0) / 2**20:.1f} MiB sent to its replica holder, "
                f"{e.get('recoveries', 0)} recoveries")
    if name == "summary":
        return (f"{e['outcome']}: {e['wall_s']:.1f} s, {e['recoveries']} recover"
                f"{'y' if e['recoveries'] == 1 else 'ies'}, {e['lost']} worker(s) lost")
    return _generic(name, e)


def render_text(e: dict, who: str) -> str:
    t = e.get("t", time.time())
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"
    return f"{stamp} seamguard {who}: {describe(e)}"


def set_title(title: str) -> None:
    """Name this process in ``ps``/``top`` (``seamguard: rank 1/4 gen 2``): setproctitle
    where installed (the runtime extra), else the kernel's 15-character ``comm``."""
    try:
        import setproctitle
    except ImportError:
        try:
            import ctypes
            ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):
            pass
        return
    setproctitle.setproctitle(title)


def name_threads_in_os() -> None:
    """From now on, every thread this process starts gives the kernel its Python name
    (its first 15 bytes), as Python 3.14 does by itself: ``top -H``, ``perf`` and
    ``/proc/<pid>/task/*/comm`` then tell ``sg-heartbeat`` from the training thread and
    from gloo's threads (which keep the title of the thread that started them)."""
    import ctypes
    import threading

    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return
    if getattr(threading.Thread.run, "_names_os_thread", False):
        return
    run = threading.Thread.run

    def named_run(self: threading.Thread) -> None:
        prctl(15, self.name.encode(errors="replace")[:15], 0, 0, 0)  # PR_SET_NAME
        run(self)

    named_run._names_os_thread = True  # type: ignore[attr-defined]
    threading.Thread.run = named_run  # type: ignore[method-assign]


class EventLog:
    """Writes events: text or JSON on ``stream``, JSON lines to ``events_file`` (appended)."""

    def __init__(self, fmt: LogFormat = "text", events_file: Path | None = None,
                 stream: IO[str] | None = None) -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"log format must be text or json, got {fmt!r}")
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self._fd: int | None = None
        if events_file is not None:
            events_file.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(events_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @classmethod
    def from_environment(cls) -> EventLog:
        """A worker's log: the format and the events file its launcher set."""
        fmt = os.environ.get(LOG_FORMAT_ENV, "text")
        path = os.environ.get(EVENTS_FILE_ENV)
        return cls(fmt if fmt in ("text", "json") else "text", Path(path) if path else None)

    def emit(self, event: dict, who: str) -> dict:
        event = {"t": time.time(), **event}
        line = json.dumps(event, default=str)
        if self._fd is not None:
            os.write(self._fd, (line + "\n").encode())
        text = line if self.fmt == "json" else render_text(event, who)
        self.stream.write(text + "\n")  # one write: processes sharing stderr never interleave mid-line
        self.stream.flush()
        return event

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
