"""Each node's agent config, written from the topology (`seamguard agent config`).

Pure: a `Fleet`, the node's name, the rail addresses an operator has (the topology holds
no addresses) and where each storage path is mounted, in; the config mapping that
`seamguard.agent.config.parse_agent_config` validates, plus notes on what was left out.

Peers are chosen so that the fabric's paths are covered and the relation is symmetric:
on each rail the NICs are ordered by (leaf, name) and NIC i probes NICs i ± s for a
spread of strides s (half the ring, 1, 2, 4, …), so neighbours under the same leaf and
NICs across the spine are both probed, every node probes the same number of peers, and
whoever probes a node is also one it probes (its echo responder can admit exactly its
configured peers).
"""

from __future__ import annotations

from typing import Any

from seamguard.fleet.model import Fleet

DEFAULT_PEERS_PER_RAIL = 8


def ring_strides(n: int, degree: int) -> list[int]:
    """Distinct strides in [1, n // 2] whose ± neighbours give at most ``degree`` peers in a ring of n.

    Half the ring first (the far side: other leaves, across the spine), then 1 (a
    neighbour, usually under the same leaf), then 2, 4, … while they fit."""
    if n < 2 or degree < 1:
        return []
    half = n // 2
    cands = [half, 1]
    while cands[-1] * 2 < half:
        cands.append(cands[-1] * 2)
    strides, peers = [], 0
    for s in dict.fromkeys(cands):
        cost = 1 if 2 * s == n else 2
        if peers + cost <= degree:
            strides.append(s)
            peers += cost
    return strides


def agent_config_for(fleet: Fleet, node: str, addresses: dict[str, str], storage_mounts: dict[str, str],
                     peers_per_rail: int = DEFAULT_PEERS_PER_RAIL) -> tuple[dict[str, Any], list[str]]:
    """The agent config mapping for ``node`` and one note per thing it could not fill in."""
    try:
        ni = fleet.node_names.index(node)
    except ValueError:
        raise KeyError(f"node {node!r} is not in the topology") from None
    notes: list[str] = []
    leaf_of = {fleet.nic_names[i]: fleet.switch_names[int(fleet.nic_leaf[i])] for i in range(len(fleet.nic_names))}
    rails, peers = [], []
    for i in (int(k) for k in (fleet.nic_node == ni).nonzero()[0]):
        nic, rail = fleet.nic_names[i], int(fleet.nic_rail[i])
        if nic not in addresses:
            notes.append(f"{nic}: no address given; rail {rail} is not probed from this node")
            continue
        rails.append({"nic": nic, "address": addresses[nic], "rail": rail, "link": f"{nic}~{leaf_of[nic]}"})
        ring = sorted((leaf_of[fleet.nic_names[k]], fleet.nic_names[k]) for k in range(len(fleet.nic_names))
                      if int(fleet.nic_rail[k]) == rail and fleet.nic_names[k] in addresses)
        me = ring.index((leaf_of[nic], nic))
        chosen = sorted({(me + sign * s) % len(ring) for s in ring_strides(len(ring), peers_per_rail)
                         for sign in (1, -1)} - {me})
        peers += [{"nic": ring[k][1], "address": addresses[ring[k][1]], "rail": rail} for k in chosen]
    storage = fleet.storage_names[int(fleet.node_storage[ni])]
    paths = [{"name": storage, "path": storage_mounts[storage]}] if storage in storage_mounts else []
    if not paths:
        notes.append(f"storage {storage}: no mount point given (--storage-mount {storage}=/path); not probed")
    cfg = {"version": 1, "node": node,
           "storage": {"enabled": bool(paths), "paths": paths},
           "fabric": {"enabled": True, "rails": rails, "peers": peers}}
    return cfg, notes
