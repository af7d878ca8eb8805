"""The twin as a stand-in exporter for a fleet described by an existing topology file, with one
fault injected on a named entity (tests/production/test_walk.py, docs/production.md).

`seamguard twin serve` builds its own synthetic fleet; an operator's walk starts from a
topology imported from Slurm, whose node and GPU names are the cluster's. This serves the
twin's telemetry for *that* topology, so every series Prometheus scrapes is labelled with a
real Slurm node, and a fault on one of them (``gpu_ecc_escalation`` on ``gpu002/gpu2``) is
what the controller must act on. Run as a process until SIGTERM:

    python -m seamguard.testbed.fault_exporter --topology T --fault gpu_ecc_escalation:gpu002/gpu2 \
        --start-s 10 --port 9400
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from seamguard.fleet.model import Fleet
from seamguard.twin.faults import ENTITY_KIND, FaultKind, FaultSpec


def fault_spec(fleet: Fleet, kind_entity: str, start_s: float, magnitude: float | None, ramp_s: float) -> FaultSpec:
    """``KIND:ENTITY`` -> a FaultSpec on that entity of ``fleet``; one-line ValueError if unknown."""
    kind_name, sep, entity = kind_entity.partition(":")
    if not sep or not entity:
        raise ValueError(f"--fault {kind_entity!r}: expected KIND:ENTITY (gpu_ecc_escalation:gpu002/gpu2)")
    try:
        kind = FaultKind(kind_name)
    except ValueError:
        raise ValueError(f"--fault {kind_entity!r}: unknown kind {kind_name!r} "
                         f"(one of {', '.join(k.value for k in FaultKind)})") from None
    try:
        index = fleet.index_of(ENTITY_KIND[kind], entity)
    except KeyError:
        raise ValueError(f"--fault {kind_entity!r}: no {ENTITY_KIND[kind].label} {entity!r} in the topology") from None
    if magnitude is None:
        return FaultSpec(kind, index, start_s, ramp_s=ramp_s)
    return FaultSpec(kind, index, start_s, magnitude=magnitude, ramp_s=ramp_s)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m seamguard.testbed.fault_exporter")
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

    from seamguard.app.config import load_topology
    from seamguard.app.twin_exporter import ServeOptions, TwinExporter
    from seamguard.twin.telemetry import TwinConfig

    fleet = load_topology(a.topology)
    try:
        spec = fault_spec(fleet, a.fault, a.start_s, a.magnitude, a.ramp_s)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    exp = TwinExporter(fleet, [spec], TwinConfig(tick_s=a.tick_s), 0,
                       ServeOptions(host=a.host, port=a.port, speed=a.speed, truth_out=a.truth_out))
    signal.signal(signal.SIGTERM, lambda *_: exp.stop())
    exp.run()


if __name__ == "__main__":
    main(sys.argv[1:])
