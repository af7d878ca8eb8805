"""One fault injected on a named entity of an existing topology (tests/production/test_walk.py,
docs/production.md): the pure part of the fault exporter.

`seamguard twin serve` builds its own synthetic fleet; an operator's walk starts from a
topology imported from Slurm, whose node and GPU names are the cluster's. The shell's
driver (``python -m seamguard.app.fault_twin fault``) serves the twin's telemetry for
*that* topology, so every series Prometheus scrapes is labelled with a real Slurm node, and
a fault on one of them (``gpu_ecc_escalation`` on ``gpu002/gpu2``), which
:func:`fault_spec` turns into the twin's record, is what the controller must act on:

    python -m seamguard.app.fault_twin fault --topology T --fault gpu_ecc_escalation:gpu002/gpu2 \
        --start-s 10 --port 9400
"""

from __future__ import annotations

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
