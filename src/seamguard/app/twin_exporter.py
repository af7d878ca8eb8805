"""`seamguard twin serve`: the twin as a Prometheus exporter.

Advances a Twin on a wall-clock schedule (one simulated tick of ``tick_s`` every
``tick_s / speed`` wall seconds) and serves its latest Frame on `/metrics` under the
real exporter names and labels, so a real Prometheus can scrape a simulated fleet and
the controller can be tested through Prometheus alone. Optionally writes the ground
truth of the injected faults as JSON (rewritten as faults play out) for scoring.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from seamguard.app.schedule import Schedule
from seamguard.fleet.model import Fleet
from seamguard.observe.exposition import label_strings, render_text
from seamguard.twin.faults import FaultSpec
from seamguard.twin.telemetry import Twin, TwinConfig

log = logging.getLogger("seamguard.app.twin_exporter")


def truth_json(twin: Twin, wall_start: float, speed: float) -> dict:
    """Ground truth of the faults, with the clock mapping (sim t = (wall - wall_start) * speed)."""
    return {
        "wall_start": wall_start, "speed": speed, "tick_s": twin.cfg.tick_s, "t_s": twin.t_s,
        "faults": [{"kind": tr.spec.kind.value, "entity_kind": tr.spec.entity_kind.label, "index": tr.spec.index,
                    "entity": tr.entity, "start_s": tr.spec.start_s,
                    "duration_s": tr.spec.duration_s if tr.spec.duration_s != float("inf") else None,
                    "magnitude": tr.spec.magnitude, "hard_failure_s": tr.hard_failure_s,
                    "throttle_s": tr.throttle_s} for tr in twin.truth],
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 9400
    speed: float = 1.0
    truth_out: Path | None = None
    max_ticks: int | None = None  # stop advancing after this many ticks (keeps serving the last)


class TwinExporter:
    """The twin behind an HTTP server; ``run()`` blocks until ``stop()``."""

    def __init__(self, fleet: Fleet, faults: list[FaultSpec], cfg: TwinConfig, seed: int,
                 opts: ServeOptions) -> None:
        if opts.speed <= 0:
            raise ValueError(f"speed must be > 0, got {opts.speed}")
        self.twin = Twin(fleet, faults, cfg, seed)
        self.opts = opts
        self.labels = label_strings(fleet)
        self._lock = threading.Lock()
        self._body = b"# no frame yet\n"
        self._stop = threading.Event()
        self.wall_start = time.time()
        self.ticks = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics here")
                    return
                with exporter._lock:
                    body = exporter._body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("http: " + fmt, *args)

        self.server = ThreadingHTTPServer((opts.host, opts.port), Handler)
        self.server.daemon_threads = True

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def _advance(self) -> None:
        frame = self.twin.step()
        self.ticks += 1
        meta = ["# TYPE seamguard_twin_time_seconds gauge", f"seamguard_twin_time_seconds {self.twin.t_s!r}"]
        body = render_text(frame, self.labels, meta).encode()
        with self._lock:
            self._body = body
        if self.opts.truth_out is not None and (self.ticks == 1 or self.ticks % 5 == 0):
            _write_atomic(self.opts.truth_out, json.dumps(truth_json(self.twin, self.wall_start, self.opts.speed)))

    def run(self) -> None:
        http = threading.Thread(target=self.server.serve_forever, name="twin-http", daemon=True)
        http.start()
        # Simulated time is wall time x speed, so a late step is caught up, never skipped.
        schedule = Schedule(self.twin.cfg.tick_s / self.opts.speed, first_at_start=False, late="catch_up")
        self.wall_start = schedule.start_s  # simulated t=0; the first step lands one period later
        try:
            while not self._stop.wait(schedule.wait_s()):
                if schedule.due() is not None and (self.opts.max_ticks is None or self.ticks < self.opts.max_ticks):
                    self._advance()
        finally:
            self.server.shutdown()
            self.server.server_close()
            if self.opts.truth_out is not None:
                _write_atomic(self.opts.truth_out,
                              json.dumps(truth_json(self.twin, self.wall_start, self.opts.speed)))

    def stop(self) -> None:
        self._stop.set()
