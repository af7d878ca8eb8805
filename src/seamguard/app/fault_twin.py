"""The twin with a scripted fault, served as a /metrics exporter for a topology file: the
stand-in telemetry of test-bed runs. Run as a process until SIGTERM:

    python -m seamguard.app.fault_twin fault --topology T --fault gpu_ecc_escalation:gpu002/gpu2 \
        --start-s 10 --port 9400
    python -m seamguard.app.fault_twin cooling --topology T --loop cdu-a --start-epoch E --duration-s D

``fault``: one fault on a named entity (testbed/fault_exporter.py's ``fault_spec``): an
operator's walk starts from a topology imported from Slurm, so every series Prometheus
scrapes is labelled with a real node (tests/production/test_walk.py, docs/production.md).
``cooling``: the seam drill's cooling-loop flow loss from a wall-clock time, optionally
with the loop's GPUs put into HW slowdown (testbed/hw_slowdown.py; benchmarks/seam_drill.py).

Why it is in the shell: it reads a topology file and runs the shell's twin exporter
(app/twin_exporter.py); the test bed keeps the pure parts it uses, and never imports the shell.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from seamguard.app.config import load_topology
from seamguard.app.twin_exporter import ServeOptions, TwinExporter
from seamguard.fleet.model import Kind
from seamguard.testbed.drill import TWIN_PORT
from seamguard.testbed.fault_exporter import fault_spec
from seamguard.twin.faults import FaultKind, FaultSpec
from seamguard.twin.telemetry import TwinConfig


def fault_main(argv: list[str]) -> None:
    """One fault, named on the command line, on the topology's own entity names."""
    ap = argparse.ArgumentParser(prog="python -m seamguard.app.fault_twin fault")
    ap.add_argument("--topology", type=Path, required=True)
    ap.add_argument("--fault", required=True, help="KIND:ENTITY, e.g. gpu_ecc_escalation:gpu002/gpu2")
    ap.add_argument("--start-s", type=float, default=10.0, help="simulated seconds from start to the fault")
    ap.add_argument("--magnitude", type=float, default=None, help="the kind's magnitude (twin/faults.py)")
    ap.add_argument("--ramp-s", type=float, default=60.0)
    ap.add_argument("--tick-s", type=float, default=1.0)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--truth-out", type=Path, default=None)
    a = ap.parse_args(argv)

    fleet = load_topology(a.topology)
    try:
        spec = fault_spec(fleet, a.fault, a.start_s, a.magnitude, a.ramp_s)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    exp = TwinExporter(fleet, [spec], TwinConfig(tick_s=a.tick_s), 0,
                       ServeOptions(host=a.host, port=a.port, speed=a.speed, truth_out=a.truth_out))
    signal.signal(signal.SIGTERM, lambda *_: exp.stop())
    exp.run()


def cooling_main(argv: list[str]) -> None:
    """Serve the twin for the drill's topology with one cooling-loop flow loss starting at a
    wall-clock time (the drill's schedule), until SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m seamguard.app.fault_twin cooling")
    ap.add_argument("--topology", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=TWIN_PORT)
    ap.add_argument("--loop", required=True)
    ap.add_argument("--start-epoch", type=float, required=True, help="wall time (s since epoch) the flow loss starts")
    ap.add_argument("--duration-s", type=float, required=True)
    ap.add_argument("--flow-fraction", type=float, default=0.5)
    ap.add_argument("--ramp-s", type=float, default=4.0)
    ap.add_argument("--tick-s", type=float, default=1.0)
    ap.add_argument("--slowdown-clock-dir", type=Path, default=None,
                    help="put the loop's GPUs into HW slowdown once they overheat (testbed/hw_slowdown.py) and "
                         "write each node's GPU clock fraction here (the job's emulated GPU reads it)")
    a = ap.parse_args(argv)

    fleet = load_topology(a.topology)
    loop = fleet.index_of(Kind.COOLING_LOOP, a.loop)
    if loop < 0:
        raise SystemExit(f"error: --loop {a.loop!r}: not a cooling loop of {a.topology}")
    start_s = max(0.0, a.start_epoch - time.time())  # simulated t=0 is now (speed 1)
    fault = FaultSpec(FaultKind.COOLING_FLOW_LOSS, loop, start_s, a.duration_s, a.flow_fraction, a.ramp_s)
    exp = TwinExporter(fleet, [fault], TwinConfig(tick_s=a.tick_s), 0, ServeOptions(host=a.host, port=a.port))
    if a.slowdown_clock_dir is not None:
        from seamguard.testbed.hw_slowdown import SlowdownTwin

        exp.twin = SlowdownTwin(exp.twin, loop, start_s, a.duration_s, a.flow_fraction, a.ramp_s,
                                a.slowdown_clock_dir)
    signal.signal(signal.SIGTERM, lambda *_: exp.stop())
    exp.run()


DRIVERS = {"fault": fault_main, "cooling": cooling_main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in DRIVERS:
        raise SystemExit("usage: python -m seamguard.app.fault_twin <fault|cooling> --topology F ... "
                         "(--help after the driver's name)")
    DRIVERS[sys.argv[1]](sys.argv[2:])
