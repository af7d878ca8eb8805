"""The fleet described from what already knows it: Slurm, Kubernetes and the InfiniBand fabric.

`seamguard fleet import` (the shell) runs or reads each source and hands its text here.
Pure functions: text in, `Sighting`s out; `merge` turns sightings (and an optional base
topology an operator keeps for what no source knows, such as a loop's rated flow) into a
topology document plus one line for everything it could not place or that sources
disagree on. docs/topology.md "Importing a fleet" says which field comes from where.

Formats read (each a documented, stable text format):
- ``scontrol show nodes --oneliner`` / ``scontrol show partitions --oneliner`` (also the
  multi-line form): ``Key=Value`` records; GPUs from ``Gres=gpu[:type]:N``; rack, cooling
  loop and storage path from node features with a prefix (``rack_r01``).
- ``scontrol show topology`` or ``topology.conf`` (topology/tree): ``SwitchName=… Nodes=…
  Switches=…`` with Slurm hostlists; switches with nodes are leaves, their parents spines.
- ``kubectl get nodes -o json``: GPUs from ``status.capacity["nvidia.com/gpu"]`` or the GPU
  operator's ``nvidia.com/gpu.count`` label; rack, loop, storage and spare from labels.
- ``ibnetdiscover`` (infiniband-diags): ``Switch``/``Ca`` records and their ``[port]``
  lines; an HCA's node description names its host (rdma-ndd's default ``%h %d``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FEATURE_PREFIXES = {"rack": "rack_", "cooling_loop": "cdu_", "storage": "storage_"}
LABELS = {"rack": "seamguard.io/rack", "cooling_loop": "seamguard.io/cooling-loop",
          "storage": "seamguard.io/storage", "spare": "seamguard.io/spare"}
FACILITY_FIELDS = ("rack", "cooling_loop", "storage")


class DiscoveryError(ValueError):
    """A source's text that cannot be read at all; the message names the source and where."""


@dataclass
class NodeFacts:
    """What one source says about one node; None: it does not say."""
    gpus: int | None = None
    rack: str | None = None
    cooling_loop: str | None = None
    storage: str | None = None
    spare: bool | None = None
    nics: dict[str, tuple[int, str]] = field(default_factory=dict)  # NIC name -> (rail, leaf switch)


@dataclass
class Sighting:
    """Everything one source knows, and the lines it could not use."""
    source: str
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    switches: dict[str, str] = field(default_factory=dict)  # name -> "leaf" | "spine"
    uplinks: set[tuple[str, str]] = field(default_factory=set)  # (leaf, spine)
    problems: list[str] = field(default_factory=list)


# ---- Slurm -------------------------------------------------------------------------------

_HOSTLIST_PART = re.compile(r"([^\[,]*)(?:\[([^\]]*)\])?")


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's hostlist syntax: ``gpu[001-003,007],login1`` -> gpu001 gpu002 gpu003 gpu007 login1."""
    names: list[str] = []
    for item in _split_top_level(expr.strip()):
        names.extend(_expand_one(item))
    return names


def _split_top_level(expr: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in expr:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise DiscoveryError(f"hostlist {expr!r}: unbalanced brackets")
    return [i for i in items + [cur] if i]


def _expand_one(item: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        return [item]
    head, ranges, tail = m.groups()
    out = []
    for r in ranges.split(","):
        lo, _, hi = r.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise DiscoveryError(f"hostlist {item!r}: range {r!r} is not N or N-M")
        width = len(lo)
        if hi and int(hi) - int(lo) > 100_000:
            raise DiscoveryError(f"hostlist {item!r}: range {r!r} expands to more than 100000 names")
        for i in range(int(lo), int(hi or lo) + 1):
            out.extend(f"{head}{i:0{width}d}{t}" for t in _expand_one(tail))
    return out


_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_.:/]*)=")


def scontrol_records(text: str, first_key: str) -> list[dict[str, str]]:
    """``Key=Value`` records of ``scontrol show …`` (one-line or multi-line form); a record
    starts where ``first_key=`` starts a line. Values may hold spaces (``OS=Linux 6.1 …``)."""
    records: list[str] = []
    for line in text.splitlines():
        if line.startswith(f"{first_key}="):
            records.append(line)
        elif line.strip() and records:
            records[-1] += " " + line.strip()
    out = []
    for rec in records:
        keys = list(_KEY.finditer(rec))
        out.append({m.group(1): rec[m.end():keys[i + 1].start() if i + 1 < len(keys) else len(rec)].strip()
                    for i, m in enumerate(keys)})
    return out


def gres_gpus(gres: str) -> int | None:
    """GPUs in a Gres string: ``gpu:h100:8(S:0-1),mps:100`` -> 8; None when it names none."""
    total, seen = 0, False
    for item in _split_top_level(gres or ""):
        parts = re.sub(r"\(.*\)$", "", item).split(":")
        if parts[0] == "gpu":
            seen = True
            if len(parts) > 1 and parts[-1].isdigit():
                total += int(parts[-1])
            else:
                total += 1  # "gpu" or "gpu:type" alone means one
    return total if seen else None


def parse_slurm_nodes(nodes_text: str, partitions_text: str = "", spare_partitions: Iterable[str] = (),
                      prefixes: dict[str, str] | None = None) -> Sighting:
    """``scontrol show nodes`` (+ partitions): GPUs, facility features, spares."""
    prefixes = prefixes or FEATURE_PREFIXES
    s = Sighting("slurm")
    spare_parts = set(spare_partitions)
    part_nodes: dict[str, set[str]] = {}
    for p in scontrol_records(partitions_text, "PartitionName"):
        nodes = p.get("Nodes", "")
        part_nodes[p.get("PartitionName", "")] = set(expand_hostlist(nodes)) if nodes not in ("", "(null)") else set()
    for missing in sorted(spare_parts - part_nodes.keys()):
        s.problems.append(f"slurm: spare partition {missing!r} is not a partition")
    for rec in scontrol_records(nodes_text, "NodeName"):
        name = rec["NodeName"]
        facts = NodeFacts(gpus=gres_gpus(rec.get("Gres", "")))
        features = [f for f in re.split(r"[,&|]", rec.get("AvailableFeatures") or rec.get("Features") or "")
                    if f and f != "(null)"]
        for fld, prefix in prefixes.items():
            vals = sorted({f[len(prefix):] for f in features if f.startswith(prefix) and len(f) > len(prefix)})
            if len(vals) > 1:
                s.problems.append(f"slurm: node {name}: features give {fld} {', '.join(vals)}; kept {vals[0]}")
            if vals:
                setattr(facts, fld, vals[0])
        in_parts = {p for p, ns in part_nodes.items() if name in ns}
        if spare_parts and in_parts:
            facts.spare = in_parts <= spare_parts
        s.nodes[name] = facts
    if not s.nodes:
        raise DiscoveryError("slurm: no NodeName= record in the node listing (expected `scontrol show nodes`)")
    return s


def parse_slurm_topology(text: str, source: str = "slurm topology") -> Sighting:
    """topology/tree switches (``scontrol show topology`` or ``topology.conf``).

    Switches with nodes and no child switch are leaves; the switches above leaves are spines; a tier above
    that is reported and left out (the topology format has leaf and spine). Slurm does not
    know rails: each node gets one NIC on rail 0 under its leaf (the fabric's own view,
    ibnetdiscover, replaces it where given)."""
    s = Sighting(source)
    kids_nodes: dict[str, list[str]] = {}
    kids_switches: dict[str, list[str]] = {}
    for lineno, line in enumerate(_logical_lines(text), start=1):
        rec = scontrol_records(line, "SwitchName")
        if not rec:
            continue
        r = rec[0]
        name = r["SwitchName"]
        nodes, switches = r.get("Nodes", ""), r.get("Switches", "")
        kids_nodes[name] = expand_hostlist(nodes) if nodes not in ("", "(null)") else []
        kids_switches[name] = expand_hostlist(switches) if switches not in ("", "(null)") else []
    if not kids_nodes:
        raise DiscoveryError(f"{source}: no SwitchName= line (expected topology/tree's format)")
    # a switch with child switches is above the leaves (scontrol lists its descendants as Nodes too)
    leaves = {n for n, ns in kids_nodes.items() if ns and not kids_switches[n]}
    for sw, kids in kids_switches.items():
        unknown = [k for k in kids if k not in kids_nodes]
        if unknown:
            s.problems.append(f"{source}: switch {sw}: child switch(es) {', '.join(unknown)} not defined")
    spines = {sw for sw, kids in kids_switches.items() if sw not in leaves and any(k in leaves for k in kids)}
    for sw in sorted(kids_nodes.keys() - leaves - spines):
        s.problems.append(f"{source}: switch {sw}: above the spine tier (the topology has leaf and spine): left out")
    for sw in sorted(leaves):
        s.switches[sw] = "leaf"
    for sw in sorted(spines):
        s.switches[sw] = "spine"
        s.uplinks.update((k, sw) for k in kids_switches[sw] if k in leaves)
    for leaf in sorted(leaves):
        for node in kids_nodes[leaf]:
            facts = s.nodes.setdefault(node, NodeFacts())
            if facts.nics:
                s.problems.append(f"{source}: node {node} is under leaves {next(iter(facts.nics.values()))[1]} and "
                                  f"{leaf}; kept the first")
                continue
            facts.nics[f"{node}/mlx5_0"] = (0, leaf)
    return s


def _logical_lines(text: str) -> list[str]:
    """Lines without comments, with backslash continuations joined."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    return out + ([cur.strip()] if cur.strip() else [])


# ---- Kubernetes --------------------------------------------------------------------------

def parse_kubectl_nodes(text: str, labels: dict[str, str] | None = None) -> Sighting:
    """``kubectl get nodes -o json``: GPUs (device plugin capacity or GPU operator label), facility labels."""
    labels = labels or LABELS
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DiscoveryError(f"kubernetes: not JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise DiscoveryError("kubernetes: expected a NodeList (`kubectl get nodes -o json`) with `items`")
    s = Sighting("kubernetes")
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            s.problems.append(f"kubernetes: items[{i}]: no metadata.name; left out")
            continue
        lab = meta.get("labels") or {}
        cap = (item.get("status") or {}).get("capacity") or {}
        facts = NodeFacts(gpus=_count(cap.get("nvidia.com/gpu"), lab.get("nvidia.com/gpu.count")))
        for fld in FACILITY_FIELDS:
            if lab.get(labels[fld]):
                setattr(facts, fld, str(lab[labels[fld]]))
        if labels["spare"] in lab:
            facts.spare = str(lab[labels["spare"]]).lower() in ("true", "1", "yes")
        s.nodes[name] = facts
    return s


def _count(*vals: Any) -> int | None:
    for v in vals:
        if isinstance(v, int) and v >= 0:
            return v
        if isinstance(v, str) and v.isdigit():
            return int(v)
    return None


# ---- InfiniBand --------------------------------------------------------------------------

_DEVICE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([^"]+)"\s*(?:#\s*"([^"]*)")?')
_PORT = re.compile(r'^\[(\d+)\](?:\([0-9a-fA-F]+\))?\s+"([^"]+)"\[(\d+)\]')


def parse_ibnetdiscover(text: str) -> Sighting:
    """Switches, HCAs and cables from ``ibnetdiscover`` output.

    A switch cabled to an HCA is a leaf; one cabled only to switches, a spine (a tier
    above is reported, left out). An HCA's description ``<host> <device>`` names its node
    and NIC; its rail is the number in the device name (``mlx5_3`` -> 3), else its place
    among the host's HCAs."""
    s = Sighting("infiniband")
    kind: dict[str, str] = {}
    desc: dict[str, str] = {}
    links: dict[str, set[str]] = {}
    cur = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if m := _DEVICE.match(line):
            cur = m.group(3)
            kind[cur], desc[cur] = m.group(1), (m.group(4) or "").strip()
            links.setdefault(cur, set())
        elif (m := _PORT.match(line)) and cur is not None:
            links[cur].add(m.group(2))
            links.setdefault(m.group(2), set()).add(cur)
    if not kind:
        raise DiscoveryError("infiniband: no Switch or Ca record (expected `ibnetdiscover` output)")
    switches = [d for d, k in kind.items() if k == "Switch"]
    names = _switch_names(switches, desc)
    leaves = {sw for sw in switches if any(kind.get(p) == "Ca" for p in links[sw])}
    spines = {sw for sw in switches if sw not in leaves and any(p in leaves for p in links[sw])}
    for sw in sorted(set(switches) - leaves - spines):
        s.problems.append(f"infiniband: switch {names[sw]}: above the spine tier: left out")
    for sw in leaves | spines:
        s.switches[names[sw]] = "leaf" if sw in leaves else "spine"
    for sw in leaves:
        for p in links[sw]:
            if p in spines:
                s.uplinks.add((names[sw], names[p]))
            elif p in leaves:
                s.problems.append(f"infiniband: leaf {names[sw]} cabled to leaf {names[p]}: link left out")
    hcas: dict[str, list[tuple[str, str]]] = {}
    for ca in (d for d, k in kind.items() if k == "Ca"):
        parts = desc[ca].split()
        if len(parts) != 2:
            s.problems.append(f"infiniband: HCA {ca} {desc[ca]!r}: description names no host and device "
                              "(set the node description to '<host> <device>', rdma-ndd's default): left out")
            continue
        up = sorted(names[p] for p in links[ca] if p in leaves)
        if not up:
            s.problems.append(f"infiniband: HCA {parts[0]}/{parts[1]}: cabled to no leaf: left out")
            continue
        hcas.setdefault(parts[0], []).append((parts[1], up[0]))
    for host, devs in hcas.items():
        facts = s.nodes.setdefault(host, NodeFacts())
        for order, (dev, leaf) in enumerate(sorted(devs)):
            num = re.search(r"(\d+)$", dev)
            facts.nics[f"{host}/{dev}"] = (int(num.group(1)) if num else order, leaf)
    return s


def _switch_names(switches: list[str], desc: dict[str, str]) -> dict[str, str]:
    """A switch's description when unique (characters a link name can carry), else its GUID id."""
    clean = {sw: re.sub(r"[^A-Za-z0-9._:;-]+", "-", desc[sw]).strip("-") for sw in switches}
    seen: dict[str, int] = {}
    for c in clean.values():
        seen[c] = seen.get(c, 0) + 1
    return {sw: c if c and seen[c] == 1 else sw for sw, c in clean.items()}


# ---- merge -------------------------------------------------------------------------------

@dataclass(frozen=True)
class MergeOptions:
    name: str = "fleet"
    storage: str | None = None  # storage path for nodes no source names one for
    rated_flow_lpm: float | None = None  # for cooling loops the base does not rate


def merge(sightings: list[Sighting], base: dict[str, Any] | None = None,
          opts: MergeOptions = MergeOptions()) -> tuple[dict[str, Any], list[str]]:
    """One topology document from every source, and one line per conflict or unplaced entity.

    Facts from the base topology win, then sources in the order given; NICs come from the
    first source that has any for a node (give the fabric's own view first). What cannot be
    placed — a node without rack or storage, a rack without cooling loop, a loop without
    rated flow — is left out, so the document always validates; each is one line."""
    base = base or {}
    lines = [p for s in sightings for p in s.problems]
    base_nodes = {n["name"]: n for n in base.get("nodes", []) if isinstance(n, dict) and "name" in n}
    racks = {r["name"]: r.get("cooling_loop") for r in base.get("racks", []) if isinstance(r, dict)}
    loops = {lp["name"]: lp.get("rated_flow_lpm") for lp in base.get("cooling_loops", []) if isinstance(lp, dict)}
    names = list(dict.fromkeys([*base_nodes, *(n for s in sightings for n in s.nodes)]))
    nodes: dict[str, dict[str, Any]] = {}
    for name in names:
        node, why = _merge_node(name, base_nodes.get(name, {}), sightings, opts, racks, lines)
        if node is None:
            lines.append(f"node {name}: {why}: left out")
        else:
            nodes[name] = node
    for rack, loop in sorted(racks.items()):
        if loop is None:
            lines.append(f"rack {rack}: no cooling loop (feature {FEATURE_PREFIXES['cooling_loop']}<loop>, label "
                         f"{LABELS['cooling_loop']}, or the base's racks): its nodes left out")
        elif loops.get(loop) is None and opts.rated_flow_lpm is None:
            lines.append(f"cooling loop {loop}: no rated flow (give it in the base or --rated-flow-lpm): "
                         f"rack {rack} and its nodes left out")
    placed_racks = {r: lp for r, lp in racks.items()
                    if lp is not None and (loops.get(lp) is not None or opts.rated_flow_lpm is not None)}
    nodes = {n: v for n, v in nodes.items() if v["rack"] in placed_racks}
    switches, uplinks = _merge_fabric(sightings, base, lines)
    for v in nodes.values():
        v["nics"] = [nic for nic in v["nics"] if switches.get(nic["leaf"]) == "leaf"]
    used_loops = sorted({placed_racks[v["rack"]] for v in nodes.values()})
    doc = {
        "version": 1,
        "name": base.get("name", opts.name),
        **({"defaults": base["defaults"]} if "defaults" in base else {}),
        "cooling_loops": [{"name": lp, "rated_flow_lpm": loops.get(lp) or opts.rated_flow_lpm} for lp in used_loops],
        "racks": [{"name": r, "cooling_loop": placed_racks[r]} for r in sorted({v["rack"] for v in nodes.values()})],
        "switches": [{"name": n, "tier": t} for n, t in switches.items()],
        "uplinks": [{"leaf": a, "spine": b} for a, b in sorted(uplinks)],
        "storage_paths": sorted({v["storage"] for v in nodes.values()}),
        "nodes": list(nodes.values()),
        "jobs": _kept_jobs(base.get("jobs", []), nodes, lines),
    }
    return doc, lines


def _merge_node(name: str, base_node: dict[str, Any], sightings: list[Sighting], opts: MergeOptions,
                racks: dict[str, str | None], lines: list[str]) -> tuple[dict[str, Any] | None, str]:
    said = [(s.source, s.nodes[name]) for s in sightings if name in s.nodes]
    value: dict[str, Any] = {}
    for fld in ("gpus", *FACILITY_FIELDS, "spare"):
        if base_node.get(fld) is not None:
            value[fld] = base_node[fld]
            continue
        votes = [(src, getattr(f, fld)) for src, f in said if getattr(f, fld) is not None]
        if votes:
            value[fld] = votes[0][1]
            for src, v in votes[1:]:
                if v != votes[0][1]:
                    lines.append(f"node {name}: {fld} {votes[0][1]} ({votes[0][0]}) vs {v} ({src}); kept {votes[0][1]}")
    rack = value.get("rack")
    if rack is None:
        return None, (f"no rack (feature {FEATURE_PREFIXES['rack']}<rack>, label {LABELS['rack']}, "
                      "or the base's nodes[].rack)")
    loop = value.get("cooling_loop")
    if racks.get(rack) is None:
        racks[rack] = loop
    elif loop is not None and loop != racks[rack]:
        lines.append(f"node {name}: cooling loop {loop} but rack {rack} is on {racks[rack]}; kept {racks[rack]}")
    storage = value.get("storage") or opts.storage
    if storage is None:
        return None, f"no storage path (feature {FEATURE_PREFIXES['storage']}<path>, label {LABELS['storage']}, or --storage)"
    nics = base_node.get("nics") or next(
        ([{"name": n, "rail": r, "leaf": leaf} for n, (r, leaf) in sorted(f.nics.items())] for _, f in said if f.nics), [])
    gpus = value.get("gpus")
    if gpus is None:
        lines.append(f"node {name}: no source gives its GPU count (Slurm Gres, nvidia.com/gpu): 0 GPUs")
    return {"name": name, "rack": rack, "storage": storage, "gpus": int(gpus or 0),
            "spare": bool(value.get("spare", False)), "nics": nics}, ""


def _merge_fabric(sightings: list[Sighting], base: dict[str, Any],
                  lines: list[str]) -> tuple[dict[str, str], set[tuple[str, str]]]:
    switches: dict[str, str] = {s["name"]: s["tier"] for s in base.get("switches", []) if isinstance(s, dict)}
    uplinks = {(u["leaf"], u["spine"]) for u in base.get("uplinks", []) if isinstance(u, dict)}
    for s in sightings:
        for sw, tier in s.switches.items():
            if switches.setdefault(sw, tier) != tier:
                lines.append(f"switch {sw}: {tier} ({s.source}) vs {switches[sw]}; kept {switches[sw]}")
        uplinks |= {(a, b) for a, b in s.uplinks if switches.get(a) == "leaf" and switches.get(b) == "spine"}
    return switches, uplinks


def _kept_jobs(jobs: list[Any], nodes: dict[str, Any], lines: list[str]) -> list[Any]:
    kept = []
    for j in jobs:
        gone = [n for n in j.get("nodes", []) if n not in nodes]
        if gone:
            lines.append(f"job {j.get('name')}: node(s) {', '.join(gone)} not placed: job left out")
        else:
            kept.append(j)
    return kept
