"""`seamguard fleet import`: a topology written from Slurm, Kubernetes and the InfiniBand fabric.

The edge of seamguard.fleet.discover: this module runs ``scontrol`` (``--slurm``) or
reads saved outputs, hands the text to the pure parsers, validates the merged document
as any topology file is validated, and only then writes ``--out``. Each conflict or
entity it could not place is one line on stderr; ``--strict`` makes any of them an error.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import typer

from seamguard.clikit import JSON_OPTION, OUTPUT_OPTION, Output, emit, fail, wants_json

SCONTROL_TIMEOUT_S = 30.0


def _read(path: Path, what: str) -> str:
    try:
        if str(path) == "-":
            return typer.get_text_stream("stdin").read()
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: cannot read {what}: {getattr(e, 'strerror', None) or e}")


def _scontrol(*args: str) -> str:
    cmd = ["scontrol", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except FileNotFoundError:
        fail("--slurm: scontrol is not on PATH (install slurm-client, or pass --scontrol-nodes FILE)")
    except subprocess.TimeoutExpired:
        fail(f"--slurm: `{' '.join(cmd)}` gave no answer in {SCONTROL_TIMEOUT_S:.0f} s (is slurmctld up?)")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"--slurm: `{' '.join(cmd)}` failed (exit {done.returncode}): {last}")
    return done.stdout


def fleet_import(
    out: Path = typer.Option(..., "--out", help="Topology YAML to write (only once everything validated)."),
    slurm: bool = typer.Option(False, "--slurm", help="Ask the running Slurm: scontrol show nodes, partitions, "
                                                      "topology."),
    scontrol_nodes: Path | None = typer.Option(None, "--scontrol-nodes", help="Saved `scontrol show nodes "
                                                                              "--oneliner` output."),
    scontrol_partitions: Path | None = typer.Option(None, "--scontrol-partitions",
                                                    help="Saved `scontrol show partitions --oneliner` output."),
    slurm_topology: Path | None = typer.Option(None, "--slurm-topology",
                                               help="topology.conf (topology/tree) or `scontrol show topology`."),
    kubectl_nodes: Path | None = typer.Option(None, "--kubectl-nodes", help="`kubectl get nodes -o json` "
                                                                            "output ('-': stdin)."),
    ibnetdiscover: Path | None = typer.Option(None, "--ibnetdiscover", help="`ibnetdiscover` output."),
    base: Path | None = typer.Option(None, "--base", help="A topology with what no source knows (cooling loops' "
                                                          "rated flow, racks, jobs); it wins over the sources."),
    storage: str | None = typer.Option(None, "--storage", help="Storage path for nodes no source names one for."),
    rated_flow_lpm: float | None = typer.Option(None, "--rated-flow-lpm", min=0.001,
                                                help="Rated flow for cooling loops the base does not rate."),
    spare_partition: list[str] = typer.Option([], "--spare-partition",
                                              help="Slurm partition(s) of hot spares (repeatable)."),
    name: str = typer.Option("fleet", "--name", help="The topology's name (the base's wins)."),
    strict: bool = typer.Option(False, "--strict", help="Any conflict or unplaced entity is an error."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Write the topology from what already knows the fleet; list what could not be placed."""
    import yaml

    from seamguard.app.config import read_yaml
    from seamguard.fleet import discover as d
    from seamguard.fleet.topology import TopologyError, parse_topology

    if out.is_dir() or not out.parent.is_dir():
        fail(f"--out: {out} is a directory or its directory does not exist")
    sightings: list[d.Sighting] = []
    try:
        if ibnetdiscover is not None:  # the fabric's own view of NICs first: it knows rails
            sightings.append(d.parse_ibnetdiscover(_read(ibnetdiscover, "ibnetdiscover output")))
        if slurm or scontrol_nodes is not None:
            nodes_text = _read(scontrol_nodes, "scontrol nodes") if scontrol_nodes else _scontrol(
                "show", "nodes", "--oneliner")
            parts_text = (_read(scontrol_partitions, "scontrol partitions") if scontrol_partitions
                          else _scontrol("show", "partitions", "--oneliner") if slurm else "")
            sightings.append(d.parse_slurm_nodes(nodes_text, parts_text, spare_partition))
        topo_text = (_read(slurm_topology, "Slurm topology") if slurm_topology
                     else _scontrol("show", "topology") if slurm else None)
        if topo_text is not None and topo_text.strip():
            sightings.append(d.parse_slurm_topology(topo_text))
        if kubectl_nodes is not None:
            sightings.append(d.parse_kubectl_nodes(_read(kubectl_nodes, "kubectl nodes")))
    except d.DiscoveryError as e:
        fail(str(e))
    if not sightings:
        fail("nothing to import: give --slurm, --scontrol-nodes, --slurm-topology, --kubectl-nodes or --ibnetdiscover")
    base_doc = None
    if base is not None:
        try:
            base_doc = read_yaml(base, "base topology", TopologyError)
        except TopologyError as e:
            fail(str(e))
        if not isinstance(base_doc, dict):
            fail(f"{base}: a base topology is a mapping (docs/topology.md)")
    doc, lines = d.merge(sightings, base_doc, d.MergeOptions(name=name, storage=storage, rated_flow_lpm=rated_flow_lpm))
    for line in lines:
        typer.echo(f"fleet import: {line}", err=True)
    if strict and lines:
        fail(f"--strict: {len(lines)} conflict(s) or unplaced entit(ies) above; {out} not written")
    if not doc["nodes"]:
        fail(f"no node could be placed ({len(lines)} line(s) above say why); {out} not written")
    try:
        fleet = parse_topology(doc, str(out))
    except TopologyError as e:
        fail(f"the merged topology does not validate: {e}")
    text = yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, width=120)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{out}: cannot write: {e.strerror or e}")
    emit({"out": str(out), "sources": [s.source for s in sightings], "unplaced_or_conflicts": len(lines),
          **fleet.summary()}, wants_json(output, json_flag))
