"""Runs the rail-failover training job across a testbed's hosts and plays a fault schedule.

Why this exists: tests, `benchmarks/rail_failover.py` and `seamguard testbed demo` all
need the same thing — start one `seamguard/testbed/rails_job.py` per host namespace, inject
faults on a schedule once training runs, sample every switch port's byte counters (the
hosts' inbound traffic per rail), bound everything in time, and always stop the
processes. Fault injection is product code (`Fault`, `FaultPlayer`), reused everywhere.
"""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from seamguard.testbed.net import Testbed

SRC = str(Path(__file__).resolve().parents[2])  # .../src, for PYTHONPATH inside namespaces


@dataclass(frozen=True)
class Fault:
    """One scheduled fault, relative to the moment every rank has started training."""

    at_s: float
    kind: Literal["flap", "switch", "gray"]
    host: int = 0
    rail: int = 0
    duration_s: float = 2.0
    rate_mbit: float = 50.0  # gray only: the tbf rate of the collapsed link

    def describe(self) -> str:
        if self.kind == "switch":
            return f"rail{self.rail} switch down {self.duration_s:g}s"
        what = "flap" if self.kind == "flap" else f"gray {self.rate_mbit:g} Mbit/s"
        return f"h{self.host} rail{self.rail} {what} {self.duration_s:g}s"


@dataclass
class FaultRecord:
    fault: Fault
    begun_t: float = 0.0  # wall clock when applying began: the fault may act from here on
    applied_t: float = 0.0  # wall clock when applying ended (a gray fault is four tc calls,
    # which took up to 2 s on the loaded 2-core testbed): it is fully on from here on
    reverted_t: float = 0.0


class FaultPlayer:
    """Applies faults at their times (wall clock from `start(t0)`) and reverts each one
    `duration_s` after it was fully applied: applying can take seconds on a loaded host, and a
    revert timed from the scheduled start left a 2 s gray fault fully on for 0.06 s."""

    def __init__(self, tb: Testbed, faults: list[Fault]) -> None:
        self.tb = tb
        self.records = [FaultRecord(f) for f in sorted(faults, key=lambda f: f.at_s)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _apply(self, f: Fault, on: bool) -> None:
        if f.kind == "flap":
            self.tb.set_link(f.host, f.rail, not on)
        elif f.kind == "switch":
            self.tb.set_switch(f.rail, not on)
        else:
            self.tb.set_gray(f.host, f.rail, f.rate_mbit if on else None)

    def start(self, t0: float) -> None:
        events = [(t0 + r.fault.at_s, 0, i) for i, r in enumerate(self.records)]  # (when, revert, fault)
        heapq.heapify(events)

        def run() -> None:
            while events:
                when, revert, i = heapq.heappop(events)
                while (wait_s := when - time.time()) > 0:  # not a moment early on the wall clock
                    if self._stop.wait(wait_s):
                        return
                if self._stop.is_set():
                    return
                rec = self.records[i]
                if revert:
                    self._apply(rec.fault, on=False)
                    rec.reverted_t = time.time()
                    continue
                rec.begun_t = time.time()
                self._apply(rec.fault, on=True)
                rec.applied_t = time.time()
                heapq.heappush(events, (rec.applied_t + rec.fault.duration_s, 1, i))

        self._thread = threading.Thread(target=run, name="fault-player", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop playing and revert whatever is still applied."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        for rec in self.records:
            if rec.applied_t and not rec.reverted_t:
                try:
                    self._apply(rec.fault, on=False)
                except Exception:  # noqa: BLE001 - the testbed may already be down
                    pass
                rec.reverted_t = time.time()


# The rail job lives with the examples (it is a user's training script, not library code);
# a source checkout has it here, an installed package passes its own with --script.
EXAMPLE_JOB = Path(__file__).with_name("rails_job.py")  # shipped in the package: `testbed demo` works after pip install


@dataclass(frozen=True)
class JobSpec:
    script: Path = EXAMPLE_JOB  # the training process, one per host
    steps: int = 150
    seed: int = 0
    hidden: int = 1024
    port: int = 29650
    timeout_s: float = 240.0
    settings: dict = field(default_factory=dict)  # RailSettings overrides


@dataclass
class JobResult:
    returncodes: list[int]
    checksums: list[str | None]
    steps: list[dict]  # rank 0's per-step log
    rail_events: list[dict]  # rank 0's rail transitions
    faults: list[FaultRecord]
    samples: list[tuple[float, dict[tuple[int, int], float]]]  # (wall t, port tx bytes)
    t_start: float  # wall clock when every rank was training
    t_end: float
    stderr_tail: str = ""
    causes: list[list[dict]] = field(default_factory=list)  # per rank: why chunks were abandoned

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.returncodes) and len(set(self.checksums)) == 1 and None not in self.checksums

    def to_json(self) -> dict:
        return {"returncodes": self.returncodes, "checksums": self.checksums, "steps": self.steps,
                "rail_events": self.rail_events, "causes": self.causes, "t_start": self.t_start, "t_end": self.t_end,
                "faults": [{**asdict(r.fault), "begun_t": r.begun_t, "applied_t": r.applied_t,
                            "reverted_t": r.reverted_t} for r in self.faults]}


def _env() -> dict[str, str]:
    pp = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": SRC + (os.pathsep + pp if pp else ""), "OMP_NUM_THREADS": "1"}


def run_rail_job(tb: Testbed, spec: JobSpec, faults: list[Fault], out: Path,
                 sample_s: float = 0.1) -> JobResult:
    """Start the job on every host, play the faults, sample traffic; always stops the job."""
    if not spec.script.is_file():
        raise FileNotFoundError(f"job script {spec.script} not found: run from a source checkout or pass --script")
    out.mkdir(parents=True, exist_ok=True)
    hosts, rails = tb.spec.hosts, tb.spec.rails
    procs: list[subprocess.Popen] = []
    errs = []
    player = FaultPlayer(tb, faults)
    samples: list[tuple[float, dict[tuple[int, int], float]]] = []
    t_start = 0.0
    try:
        for h in range(hosts):
            err = (out / f"stderr.{h}.txt").open("w")
            errs.append(err)
            cmd = [*tb.exec_prefix(h), sys.executable, str(spec.script),
                   "--rank", str(h), "--world", str(hosts), "--store", f"{tb.addr(0, None)}:{spec.port}",
                   "--rails", ",".join(tb.rail_if(r) for r in range(rails)), "--steps", str(spec.steps),
                   "--seed", str(spec.seed), "--hidden", str(spec.hidden), "--out", str(out),
                   "--settings", json.dumps(spec.settings)]
            procs.append(subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=err))
        deadline = time.time() + spec.timeout_s
        while time.time() < deadline and not all((out / f"ready.{h}").exists() for h in range(hosts)):
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.02)
        t_start = time.time()
        player.start(t_start)
        while time.time() < deadline and any(p.poll() is None for p in procs):
            samples.append((time.time(), tb.fabric_tx_bytes()))
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(sample_s)
        t_end = time.time()
    finally:
        player.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        for e in errs:
            e.close()
    checks = []
    for h in range(hosts):
        f = out / f"final.{h}.json"
        checks.append(json.loads(f.read_text())["checksum"] if f.exists() else None)
    steps_f = out / "steps.0.jsonl"
    steps = [json.loads(x) for x in steps_f.read_text().splitlines()] if steps_f.exists() else []
    evs = [json.loads((out / f"rail_events.{h}.json").read_text()) if (out / f"rail_events.{h}.json").exists()
           else {"events": [], "causes": []} for h in range(hosts)]
    tail = "".join((out / f"stderr.{h}.txt").read_text()[-1500:] for h in range(hosts))
    return JobResult([p.returncode for p in procs], checks, steps,
                     evs[0]["events"], player.records, samples, t_start, t_end, tail,
                     [e["causes"] for e in evs])
