"""The safety breaker around the controller itself: one breaker that counts everything.

Every action that takes capacity away counts — drain, label_degraded (a restriction),
move_job, avoid_link, avoid_storage — hard evidence included. Two kinds of bound:

- **in effect** (totals): nodes under any restriction at once, as a share of the fleet
  and of each cooling loop, rack and leaf; whole domains (a cooling loop, a rack)
  restricted for their own state, as a share of their kind; fabric links and storage
  paths avoided. The set in effect is what the actuators report (``observe()``), the
  ground truth after any crash. Hard failures count here like everything else.
- **rate**: nodes newly restricted within ``window_s``, as a share of the fleet and of
  each loop. Hard failures (a node that already failed) bypass the rate, never a total.

A second action on a node already restricted (label → drain) does not widen the blast
radius and is admitted for free; so is a node inside a domain already restricted as a
whole (it was counted with its domain). An action that would exceed a bound of one
cooling loop, rack or leaf is held (with why), and the rest of the fleet goes on. The
first action that would exceed a fleet-wide bound (nodes restricted in effect or per
window, domains restricted as a whole, fabric or storage paths avoided) trips the
breaker: from then on every action that would restrict something new is held — except
a hard failure that fits every total — and what is in effect stays. Tripped stays
tripped — across restarts — until a person resets it. The state is plain data, committed in the ledger in the same transaction as
the decisions it admitted, before any actuator is called.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from seamguard.decide.policy import BreakerConfig
from seamguard.fleet.model import Fleet, Kind


@dataclass(frozen=True)
class BreakerState:
    tripped: bool = False
    reason: str = ""
    tripped_at_s: float | None = None
    drained: tuple[tuple[float, str], ...] = ()  # (t_s, node) newly restricted inside the rate window
    domains: tuple[str, ...] = ()  # domains admitted as a whole ("cooling_loop:<name>", "rack:<name>")

    def reset(self) -> BreakerState:
        return replace(self, tripped=False, reason="", tripped_at_s=None, drained=())

    def to_json(self) -> dict:
        return {"tripped": self.tripped, "reason": self.reason, "tripped_at_s": self.tripped_at_s,
                "drained": [list(x) for x in self.drained], "domains": list(self.domains)}

    @classmethod
    def from_json(cls, d: dict) -> BreakerState:
        return cls(bool(d.get("tripped")), str(d.get("reason", "")), d.get("tripped_at_s"),
                   tuple((float(t), str(n)) for t, n in d.get("drained", [])),
                   tuple(str(x) for x in d.get("domains", [])))


@dataclass(frozen=True)
class Request:
    """One action that would take capacity away, as the breaker counts it."""

    key: str
    nodes: tuple[int, ...] = ()  # nodes it restricts (drain, label)
    domain: str = ""  # a whole domain it restricts ("cooling_loop:<name>", "rack:<name>")
    path: str = ""  # a fabric link or storage path it takes out ("link:<name>", "storage:<name>")
    hard: bool = False  # hard evidence: bypasses the rate, never a total


@dataclass
class InEffect:
    """What is restricted now (from the actuators' observed set)."""

    nodes: set[int] = field(default_factory=set)
    domains: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)


def _cap(frac: float, n: int, at_least_one: bool = False) -> int:
    c = int(np.floor(frac * n + 1e-9))
    return max(c, 1) if at_least_one else c


def _domain_nodes(fleet: Fleet, domain: str) -> np.ndarray:
    head, _, name = domain.partition(":")
    if head == Kind.COOLING_LOOP.label:
        return fleet.node_loop == fleet.index_of(Kind.COOLING_LOOP, name)
    if head == Kind.RACK.label:
        return fleet.node_rack == fleet.index_of(Kind.RACK, name)
    return np.zeros(fleet.count(Kind.NODE), dtype=bool)


def admit(state: BreakerState, fleet: Fleet, cfg: BreakerConfig, t_s: float, requests: list[Request],
          now: InEffect) -> tuple[BreakerState, list[str], dict[str, str]]:
    """Admit requests in order; returns (state, admitted keys, held key -> why). Pure.

    ``now.domains`` are the domains restricted as a whole that are still in trouble; the
    returned state's ``domains`` is that set plus the ones admitted here.
    """
    window = tuple((t, n) for t, n in state.drained if t > t_s - cfg.window_s)
    state = replace(state, drained=window, domains=tuple(sorted(now.domains)))
    if not cfg.enabled:
        doms = set(now.domains) | {r.domain for r in requests if r.domain}
        return replace(state, domains=tuple(sorted(doms))), [r.key for r in requests], {}
    n_nodes = fleet.count(Kind.NODE)
    n_loops, n_racks = fleet.count(Kind.COOLING_LOOP), fleet.count(Kind.RACK)
    node_loop, node_rack = fleet.node_loop, fleet.node_rack
    nic_ok = fleet.nic_leaf >= 0
    n_leaf = fleet.count(Kind.SWITCH)
    leaf_of_nic, node_of_nic = fleet.nic_leaf[nic_ok], fleet.nic_node[nic_ok]
    node_leaf_pairs = np.unique(np.stack([node_of_nic, leaf_of_nic], axis=1), axis=0) if leaf_of_nic.size \
        else np.zeros((0, 2), dtype=np.int64)
    leaf_size = np.bincount(node_leaf_pairs[:, 1], minlength=n_leaf) if n_leaf else np.zeros(0, dtype=np.int64)
    leaves_of: dict[int, np.ndarray] = {}

    def leaves(i: int) -> np.ndarray:
        if i not in leaves_of:
            leaves_of[i] = node_leaf_pairs[node_leaf_pairs[:, 0] == i, 1]
        return leaves_of[i]

    loop_size = np.bincount(node_loop, minlength=n_loops)
    rack_size = np.bincount(node_rack, minlength=n_racks)
    doms = set(now.domains)
    covered = np.zeros(n_nodes, dtype=bool)
    for d in doms:
        covered |= _domain_nodes(fleet, d)
    restricted = set(now.nodes)
    # per-domain totals count nodes restricted one by one (not those covered by their domain)
    per_loop = np.zeros(n_loops, dtype=np.int64)
    per_rack = np.zeros(n_racks, dtype=np.int64)
    per_leaf = np.zeros(n_leaf, dtype=np.int64)
    for i in restricted:
        if not covered[i]:
            per_loop[node_loop[i]] += 1
            per_rack[node_rack[i]] += 1
            per_leaf[leaves(i)] += 1
    rate_nodes = {fleet.index_of(Kind.NODE, n) for _, n in window if _known(fleet, n)}
    rate_loop = np.bincount(node_loop[list(rate_nodes)], minlength=n_loops) if rate_nodes \
        else np.zeros(n_loops, dtype=np.int64)
    paths = set(now.paths)
    n_links = int((fleet.link_nic < 0).sum())
    n_storage = fleet.count(Kind.STORAGE)

    cap_fleet = _cap(cfg.max_in_effect_fleet_fraction, n_nodes)
    cap_rate = _cap(cfg.max_fleet_fraction, n_nodes)

    admitted: list[str] = []
    held: dict[str, str] = {}
    for r in requests:
        # a request for a whole domain covers its nodes: they are counted with the domain
        new_nodes = [] if r.domain else [i for i in r.nodes if i not in restricted and not covered[i]]
        new_domain = bool(r.domain) and r.domain not in doms
        new_path = bool(r.path) and r.path not in paths
        if not (new_nodes or new_domain or new_path):
            admitted.append(r.key)
            restricted.update(r.nodes)
            continue
        if state.tripped and not r.hard:
            held[r.key] = f"breaker tripped: {state.reason}"
            continue
        why, trips = "", True  # a fleet-wide bound trips; a bound of one loop, rack or leaf holds
        total_now = int((covered | np.isin(np.arange(n_nodes), list(restricted))).sum())
        if new_domain:
            kind = r.domain.partition(":")[0]
            n_kind = n_loops if kind == Kind.COOLING_LOOP.label else n_racks
            have = sum(1 for d in doms if d.partition(":")[0] == kind)
            dn = _domain_nodes(fleet, r.domain)
            grow = int((dn & ~covered & ~np.isin(np.arange(n_nodes), list(restricted))).sum())
            if have + 1 > _cap(cfg.max_domain_fraction, n_kind, at_least_one=True):
                why = (f"restricting {r.domain} would restrict {have + 1} of {n_kind} {kind}s as a whole "
                       f"(> {cfg.max_domain_fraction:.0%})")
            elif total_now + grow > cap_fleet:
                why = (f"restricting {r.domain} would put {total_now + grow} of {n_nodes} nodes under restriction "
                       f"(> {cfg.max_in_effect_fleet_fraction:.0%} of the fleet)")
        if not why and new_nodes:
            add_loop = np.bincount(node_loop[new_nodes], minlength=n_loops)
            add_rack = np.bincount(node_rack[new_nodes], minlength=n_racks)
            add_leaf = np.zeros(n_leaf, dtype=np.int64)
            for i in new_nodes:
                add_leaf[leaves(i)] += 1
            name = fleet.node_names[new_nodes[0]]
            lp = int(np.argmax((per_loop + add_loop) - np.floor(cfg.max_in_effect_loop_fraction * loop_size)))
            rk = int(np.argmax((per_rack + add_rack) - np.floor(cfg.max_in_effect_rack_fraction * rack_size)))
            if total_now + len(new_nodes) > cap_fleet:
                why = (f"{r.key} would put {total_now + len(new_nodes)} of {n_nodes} nodes under restriction "
                       f"(> {cfg.max_in_effect_fleet_fraction:.0%} of the fleet in effect)")
            elif per_loop[lp] + add_loop[lp] > _cap(cfg.max_in_effect_loop_fraction, int(loop_size[lp])):
                trips = False
                why = (f"{r.key} would put {per_loop[lp] + add_loop[lp]} of {loop_size[lp]} nodes on "
                       f"{fleet.loop_names[lp]} under restriction (> {cfg.max_in_effect_loop_fraction:.0%})")
            elif per_rack[rk] + add_rack[rk] > _cap(cfg.max_in_effect_rack_fraction, int(rack_size[rk])):
                trips = False
                why = (f"{r.key} would put {per_rack[rk] + add_rack[rk]} of {rack_size[rk]} nodes in "
                       f"{fleet.rack_names[rk]} under restriction (> {cfg.max_in_effect_rack_fraction:.0%})")
            elif n_leaf and np.any(per_leaf + add_leaf > np.floor(cfg.max_in_effect_leaf_fraction * leaf_size + 1e-9)
                                   ) and np.any(add_leaf > 0):
                lf = int(np.argmax(per_leaf + add_leaf - np.floor(cfg.max_in_effect_leaf_fraction * leaf_size)))
                trips = False
                why = (f"{r.key} would put {per_leaf[lf] + add_leaf[lf]} of {leaf_size[lf]} nodes on leaf "
                       f"{fleet.switch_names[lf]} under restriction (> {cfg.max_in_effect_leaf_fraction:.0%})")
            elif not r.hard:
                rl = rate_loop + add_loop
                lp2 = int(np.argmax(rl - np.floor(cfg.max_loop_fraction * loop_size)))
                if len(rate_nodes) + len(new_nodes) > cap_rate:
                    why = (f"{r.key} ({name}) would restrict {len(rate_nodes) + len(new_nodes)} of {n_nodes} nodes "
                           f"within {cfg.window_s:.0f}s ({cfg.max_fleet_fraction:.1%} of the fleet per window)")
                elif rl[lp2] > _cap(cfg.max_loop_fraction, int(loop_size[lp2])):
                    trips = False
                    why = (f"{r.key} would restrict {rl[lp2]} of {loop_size[lp2]} nodes on {fleet.loop_names[lp2]} "
                           f"within {cfg.window_s:.0f}s (> {cfg.max_loop_fraction:.1%} per window)")
        if not why and new_path:
            kind = r.path.partition(":")[0]
            n_kind = n_links if kind == "link" else n_storage
            frac = cfg.max_link_fraction if kind == "link" else cfg.max_storage_fraction
            have = sum(1 for p in paths if p.partition(":")[0] == kind)
            if have + 1 > _cap(frac, n_kind, at_least_one=True):
                why = f"{r.key} would take {have + 1} of {n_kind} {kind} paths out of use (> {frac:.0%})"
        if why:
            if trips and not state.tripped:
                state = replace(state, tripped=True, reason=why, tripped_at_s=t_s)
            held[r.key] = why
            continue
        admitted.append(r.key)
        if new_domain:
            doms.add(r.domain)
            covered |= _domain_nodes(fleet, r.domain)
        if new_path:
            paths.add(r.path)
        for i in new_nodes:
            restricted.add(i)
            if covered[i]:
                continue
            per_loop[node_loop[i]] += 1
            per_rack[node_rack[i]] += 1
            per_leaf[leaves(i)] += 1
            if not r.hard:
                rate_nodes.add(i)
                rate_loop[node_loop[i]] += 1
                window = window + ((t_s, fleet.node_names[i]),)
        restricted.update(r.nodes)
    return replace(state, drained=window, domains=tuple(sorted(doms))), admitted, held


def _known(fleet: Fleet, name: str) -> bool:
    try:
        fleet.index_of(Kind.NODE, name)
        return True
    except KeyError:
        return False
