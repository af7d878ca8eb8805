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

Every node bound is ``max(share × the domain's nodes, min_nodes)``, never more than the
domain has, so a small fleet can still act on its first bad nodes (5 % of 32 nodes is one).
The rate counts distinct nodes: a node asked for again within the window (every tick of a
dry run, where nothing comes into effect) was counted when first admitted.

A second action on a node already restricted (label → drain) does not widen the blast
radius and is admitted for free; so is a node inside a domain already restricted as a
whole (it was counted with its domain). An action that would exceed a bound of one
cooling loop, rack or leaf is held (with why), and the rest of the fleet goes on. The
first action that would exceed a fleet-wide bound (nodes restricted in effect or per
window, domains restricted as a whole, fabric or storage paths avoided) trips the
breaker: from then on every action that would restrict something new is held — except
a hard failure that fits every total — and what is in effect stays. Tripped stays
tripped — across restarts — until a person resets it. A node admitted within the window
(a dry run's standing decision, or one admitted before a crash) is not new: it is checked
against the totals only.

A tripped breaker never blocks recovery: a node seamguard restricted itself (what its
actuators hold) still returns once its release dwell is over, at most
``max(max_return_fraction × fleet, min_nodes)`` nodes per window (``admit_returns``); one
past that is kept, with why, and returns in a later tick. The state is plain data,
committed in the ledger in the same transaction as the decisions it admitted, before any
actuator is called.
"""

from __future__ import annotations

import weakref
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
    returned: tuple[tuple[float, str], ...] = ()  # (t_s, node) returned while tripped, inside the window

    def reset(self) -> BreakerState:
        return replace(self, tripped=False, reason="", tripped_at_s=None, drained=(), returned=())

    def to_json(self) -> dict:
        return {"tripped": self.tripped, "reason": self.reason, "tripped_at_s": self.tripped_at_s,
                "drained": [list(x) for x in self.drained], "domains": list(self.domains),
                "returned": [list(x) for x in self.returned]}

    @classmethod
    def from_json(cls, d: dict) -> BreakerState:
        return cls(bool(d.get("tripped")), str(d.get("reason", "")), d.get("tripped_at_s"),
                   tuple((float(t), str(n)) for t, n in d.get("drained", [])),
                   tuple(str(x) for x in d.get("domains", [])),
                   tuple((float(t), str(n)) for t, n in d.get("returned", [])))


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
    """The most of ``n`` a fraction allows (floor; at least one where asked)."""
    c = int(np.floor(frac * n + 1e-9))
    return max(c, 1) if at_least_one else c


def _node_cap(frac: float, n: int, min_nodes: int) -> int:
    """A node bound: ``max(share × n, min_nodes)``, never more than the ``n`` nodes there are."""
    return min(max(_cap(frac, n), min_nodes), n)


def _node_caps(frac: float, sizes: np.ndarray, min_nodes: int) -> np.ndarray:
    """``_node_cap`` for every domain of a kind at once."""
    return np.minimum(np.maximum(np.floor(frac * sizes + 1e-9).astype(np.int64), min_nodes), sizes)


def _domain_nodes(fleet: Fleet, domain: str) -> np.ndarray:
    """The nodes of a domain ("cooling_loop:<name>", "rack:<name>"), as a mask."""
    head, _, name = domain.partition(":")
    if head == Kind.COOLING_LOOP.label:
        return fleet.node_loop == fleet.index_of(Kind.COOLING_LOOP, name)
    if head == Kind.RACK.label:
        return fleet.node_rack == fleet.index_of(Kind.RACK, name)
    return np.zeros(fleet.count(Kind.NODE), dtype=bool)


@dataclass(frozen=True, eq=False)
class _Topology:
    """The sizes the bounds are fractions of: nodes per loop, rack and leaf; fabric links; storage paths."""

    n_nodes: int
    n_loops: int
    n_racks: int
    n_leaf: int
    loop_size: np.ndarray
    rack_size: np.ndarray
    leaf_size: np.ndarray
    node_leaf_pairs: np.ndarray  # [k, 2]: (node, leaf) a node reaches through its NICs
    n_links: int
    n_storage: int
    _leaves: dict[int, np.ndarray] = field(default_factory=dict)

    def leaves(self, i: int) -> np.ndarray:
        """The leaf switches node ``i`` hangs off (cached)."""
        if i not in self._leaves:
            self._leaves[i] = self.node_leaf_pairs[self.node_leaf_pairs[:, 0] == i, 1]
        return self._leaves[i]


_TOPOLOGIES: weakref.WeakKeyDictionary[Fleet, _Topology] = weakref.WeakKeyDictionary()


def _topology(fleet: Fleet) -> _Topology:
    """The fleet's sizes per domain, as the breaker's fractions need them: a function of the
    fleet alone, so worked out once per fleet (a fleet is immutable; a new placement or
    topology is a new Fleet), not once per tick."""
    topo = _TOPOLOGIES.get(fleet)
    if topo is None:
        topo = _TOPOLOGIES[fleet] = _topology_of(fleet)
    return topo


def _topology_of(fleet: Fleet) -> _Topology:
    n_loops, n_racks, n_leaf = fleet.count(Kind.COOLING_LOOP), fleet.count(Kind.RACK), fleet.count(Kind.SWITCH)
    nic_ok = fleet.nic_leaf >= 0
    leaf_of_nic, node_of_nic = fleet.nic_leaf[nic_ok], fleet.nic_node[nic_ok]
    # The distinct (node, leaf) pairs in (node, leaf) order: a unique of one integer key
    # (a row-wise unique sorts rows as structured records).
    key = np.sort(node_of_nic.astype(np.int64) * max(n_leaf, 1) + leaf_of_nic)
    key = key[np.r_[True, key[1:] != key[:-1]]] if key.size else key
    pairs = np.stack([key // max(n_leaf, 1), key % max(n_leaf, 1)], axis=1) if leaf_of_nic.size \
        else np.zeros((0, 2), dtype=np.int64)
    leaf_size = np.bincount(pairs[:, 1], minlength=n_leaf) if n_leaf else np.zeros(0, dtype=np.int64)
    return _Topology(fleet.count(Kind.NODE), n_loops, n_racks, n_leaf,
                     np.bincount(fleet.node_loop, minlength=n_loops), np.bincount(fleet.node_rack, minlength=n_racks),
                     leaf_size, pairs, int((fleet.link_nic < 0).sum()), fleet.count(Kind.STORAGE))


@dataclass
class _Tally:
    """What is restricted so far this tick: in effect, then each request as it is admitted (local to admit)."""

    doms: set[str]  # domains restricted as a whole
    covered: np.ndarray  # nodes inside those domains
    restricted: set[int]  # nodes restricted one by one
    per_loop: np.ndarray  # per-domain totals count nodes restricted one by one, not those covered
    per_rack: np.ndarray
    per_leaf: np.ndarray
    rate_nodes: set[int]  # nodes newly restricted inside the rate window
    rate_loop: np.ndarray
    paths: set[str]
    window: tuple[tuple[float, str], ...]

    def total_now(self) -> int:
        """Nodes under any restriction now, one by one or with their domain."""
        return int((self.covered | np.isin(np.arange(self.covered.size), list(self.restricted))).sum())


def _tally(fleet: Fleet, topo: _Topology, now: InEffect, window: tuple[tuple[float, str], ...]) -> _Tally:
    """Count what is in effect (and newly restricted within the window) per loop, rack and leaf."""
    covered = np.zeros(topo.n_nodes, dtype=bool)
    for d in now.domains:
        covered |= _domain_nodes(fleet, d)
    per_loop = np.zeros(topo.n_loops, dtype=np.int64)
    per_rack = np.zeros(topo.n_racks, dtype=np.int64)
    per_leaf = np.zeros(topo.n_leaf, dtype=np.int64)
    for i in set(now.nodes):
        if not covered[i]:
            per_loop[fleet.node_loop[i]] += 1
            per_rack[fleet.node_rack[i]] += 1
            per_leaf[topo.leaves(i)] += 1
    rate_nodes = {fleet.index_of(Kind.NODE, n) for _, n in window if _known(fleet, n)}
    rate_loop = np.bincount(fleet.node_loop[list(rate_nodes)], minlength=topo.n_loops) if rate_nodes \
        else np.zeros(topo.n_loops, dtype=np.int64)
    return _Tally(set(now.domains), covered, set(now.nodes), per_loop, per_rack, per_leaf, rate_nodes, rate_loop,
                  set(now.paths), window)


def _domain_bound(fleet: Fleet, cfg: BreakerConfig, topo: _Topology, tally: _Tally, r: Request) -> str:
    """Why restricting a new whole domain would exceed a fleet-wide bound (share of its kind, nodes restricted); "" if not."""
    kind = r.domain.partition(":")[0]
    n_kind = topo.n_loops if kind == Kind.COOLING_LOOP.label else topo.n_racks
    have = sum(1 for d in tally.doms if d.partition(":")[0] == kind)
    dn = _domain_nodes(fleet, r.domain)
    total_now = tally.total_now()
    grow = int((dn & ~tally.covered & ~np.isin(np.arange(topo.n_nodes), list(tally.restricted))).sum())
    if have + 1 > _cap(cfg.max_domain_fraction, n_kind, at_least_one=True):
        return (f"restricting {r.domain} would restrict {have + 1} of {n_kind} {kind}s as a whole "
                f"(> {cfg.max_domain_fraction:.0%})")
    if total_now + grow > _node_cap(cfg.max_in_effect_fleet_fraction, topo.n_nodes, cfg.min_nodes):
        return (f"restricting {r.domain} would put {total_now + grow} of {topo.n_nodes} nodes under restriction "
                f"(> {cfg.max_in_effect_fleet_fraction:.0%} of the fleet)")
    return ""


def _node_total_bound(fleet: Fleet, cfg: BreakerConfig, topo: _Topology, tally: _Tally, r: Request,
                      new_nodes: list[int]) -> tuple[str, bool]:
    """(why, trips) if new nodes would exceed a bound in effect: the fleet's trips; a loop's, rack's or leaf's holds."""
    t = tally
    add_loop = np.bincount(fleet.node_loop[new_nodes], minlength=topo.n_loops)
    add_rack = np.bincount(fleet.node_rack[new_nodes], minlength=topo.n_racks)
    add_leaf = np.zeros(topo.n_leaf, dtype=np.int64)
    for i in new_nodes:
        add_leaf[topo.leaves(i)] += 1
    loop_cap = _node_caps(cfg.max_in_effect_loop_fraction, topo.loop_size, cfg.min_nodes)
    rack_cap = _node_caps(cfg.max_in_effect_rack_fraction, topo.rack_size, cfg.min_nodes)
    lp = int(np.argmax((t.per_loop + add_loop) - loop_cap))
    rk = int(np.argmax((t.per_rack + add_rack) - rack_cap))
    total = t.total_now() + len(new_nodes)
    if total > _node_cap(cfg.max_in_effect_fleet_fraction, topo.n_nodes, cfg.min_nodes):
        return (f"{r.key} would put {total} of {topo.n_nodes} nodes under restriction "
                f"(> {cfg.max_in_effect_fleet_fraction:.0%} of the fleet in effect)"), True
    if t.per_loop[lp] + add_loop[lp] > loop_cap[lp]:
        return (f"{r.key} would put {t.per_loop[lp] + add_loop[lp]} of {topo.loop_size[lp]} nodes on "
                f"{fleet.loop_names[lp]} under restriction (> {cfg.max_in_effect_loop_fraction:.0%})"), False
    if t.per_rack[rk] + add_rack[rk] > rack_cap[rk]:
        return (f"{r.key} would put {t.per_rack[rk] + add_rack[rk]} of {topo.rack_size[rk]} nodes in "
                f"{fleet.rack_names[rk]} under restriction (> {cfg.max_in_effect_rack_fraction:.0%})"), False
    leaf_cap = _node_caps(cfg.max_in_effect_leaf_fraction, topo.leaf_size, cfg.min_nodes)
    if topo.n_leaf and np.any(t.per_leaf + add_leaf > leaf_cap) and np.any(add_leaf > 0):
        lf = int(np.argmax(t.per_leaf + add_leaf - leaf_cap))
        return (f"{r.key} would put {t.per_leaf[lf] + add_leaf[lf]} of {topo.leaf_size[lf]} nodes on leaf "
                f"{fleet.switch_names[lf]} under restriction (> {cfg.max_in_effect_leaf_fraction:.0%})"), False
    return "", True


def _node_rate_bound(fleet: Fleet, cfg: BreakerConfig, topo: _Topology, tally: _Tally, r: Request,
                     new_nodes: list[int]) -> tuple[str, bool]:
    """(why, trips) if new nodes would restrict too many within the window: the fleet's share trips, a loop's holds.

    Nodes already counted in the window (admitted earlier, asked for again) are not counted twice."""
    fresh = [i for i in new_nodes if i not in tally.rate_nodes]
    if not fresh:
        return "", True
    rl = tally.rate_loop + np.bincount(fleet.node_loop[fresh], minlength=topo.n_loops)
    loop_cap = _node_caps(cfg.max_loop_fraction, topo.loop_size, cfg.min_nodes)
    lp = int(np.argmax(rl - loop_cap))
    n_rate = len(tally.rate_nodes) + len(fresh)
    fleet_cap = _node_cap(cfg.max_fleet_fraction, topo.n_nodes, cfg.min_nodes)
    if n_rate > fleet_cap:
        return (f"{r.key} ({fleet.node_names[fresh[0]]}) would restrict {n_rate} of {topo.n_nodes} nodes "
                f"within {cfg.window_s:.0f}s (> {fleet_cap}: {cfg.max_fleet_fraction:.1%} of the fleet per window, "
                f"at least {cfg.min_nodes})"), True
    if rl[lp] > loop_cap[lp]:
        return (f"{r.key} would restrict {rl[lp]} of {topo.loop_size[lp]} nodes on {fleet.loop_names[lp]} "
                f"within {cfg.window_s:.0f}s (> {cfg.max_loop_fraction:.1%} per window)"), False
    return "", True


def _path_bound(cfg: BreakerConfig, topo: _Topology, tally: _Tally, r: Request) -> str:
    """Why taking a new fabric link or storage path out of use would exceed its share; "" if not."""
    kind = r.path.partition(":")[0]
    n_kind = topo.n_links if kind == "link" else topo.n_storage
    frac = cfg.max_link_fraction if kind == "link" else cfg.max_storage_fraction
    have = sum(1 for p in tally.paths if p.partition(":")[0] == kind)
    if have + 1 > _cap(frac, n_kind, at_least_one=True):
        return f"{r.key} would take {have + 1} of {n_kind} {kind} paths out of use (> {frac:.0%})"
    return ""


def _exceeds(fleet: Fleet, cfg: BreakerConfig, topo: _Topology, tally: _Tally, r: Request, new_nodes: list[int],
             new_domain: bool, new_path: bool) -> tuple[str, bool]:
    """(why, trips) for the first bound a request would exceed, in order: domain, nodes in effect, rate, path."""
    why, trips = "", True  # a fleet-wide bound trips; a bound of one loop, rack or leaf holds
    if new_domain:
        why = _domain_bound(fleet, cfg, topo, tally, r)
    if not why and new_nodes:
        why, trips = _node_total_bound(fleet, cfg, topo, tally, r, new_nodes)
        if not why and not r.hard:
            why, trips = _node_rate_bound(fleet, cfg, topo, tally, r, new_nodes)
    if not why and new_path:
        why = _path_bound(cfg, topo, tally, r)
    return why, trips


def _count(fleet: Fleet, topo: _Topology, tally: _Tally, r: Request, new_nodes: list[int], t_s: float) -> None:
    """Add an admitted request to the tally (its domain, path, nodes; the rate only for soft evidence)."""
    if r.domain and r.domain not in tally.doms:
        tally.doms.add(r.domain)
        tally.covered |= _domain_nodes(fleet, r.domain)
    if r.path:
        tally.paths.add(r.path)
    for i in new_nodes:
        tally.restricted.add(i)
        if tally.covered[i]:
            continue
        tally.per_loop[fleet.node_loop[i]] += 1
        tally.per_rack[fleet.node_rack[i]] += 1
        tally.per_leaf[topo.leaves(i)] += 1
        if not r.hard and i not in tally.rate_nodes:
            tally.rate_nodes.add(i)
            tally.rate_loop[fleet.node_loop[i]] += 1
            tally.window = tally.window + ((t_s, fleet.node_names[i]),)
    tally.restricted.update(r.nodes)


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
    topo = _topology(fleet)
    tally = _tally(fleet, topo, now, window)
    admitted: list[str] = []
    held: dict[str, str] = {}
    for r in requests:
        # a request for a whole domain covers its nodes: they are counted with the domain
        new_nodes = [] if r.domain else [i for i in r.nodes if i not in tally.restricted and not tally.covered[i]]
        new_domain = bool(r.domain) and r.domain not in tally.doms
        new_path = bool(r.path) and r.path not in tally.paths
        if not (new_nodes or new_domain or new_path):
            admitted.append(r.key)
            tally.restricted.update(r.nodes)
            continue
        readmitted = bool(new_nodes) and set(new_nodes) <= tally.rate_nodes and not (new_domain or new_path)
        if state.tripped and not r.hard and not readmitted:
            held[r.key] = f"breaker tripped: {state.reason}"
            continue
        why, trips = _exceeds(fleet, cfg, topo, tally, r, new_nodes, new_domain, new_path)
        if why:
            if trips and not state.tripped:
                state = replace(state, tripped=True, reason=why, tripped_at_s=t_s)
            held[r.key] = why
            continue
        admitted.append(r.key)
        _count(fleet, topo, tally, r, new_nodes, t_s)
    return replace(state, drained=tally.window, domains=tuple(sorted(tally.doms))), admitted, held


def _known(fleet: Fleet, name: str) -> bool:
    """Whether the fleet still has a node of that name (one in the rate window may be gone)."""
    try:
        fleet.index_of(Kind.NODE, name)
        return True
    except KeyError:
        return False


def admit_returns(state: BreakerState, fleet: Fleet, cfg: BreakerConfig, t_s: float,
                  returns: list[tuple[str, str]]) -> tuple[BreakerState, list[str], dict[str, str]]:
    """Which returns of restricted nodes go ahead this tick; returns (state, admitted keys, held key -> why). Pure.

    ``returns``: (key, node) of the restrictions seamguard holds that its release dwell lets
    go this tick. Untripped (or switched off), every one goes. Tripped, a node returns if it
    already returned within the window (its other restriction) or while fewer than
    ``max(max_return_fraction × fleet, min_nodes)`` nodes have; each is remembered in
    ``returned`` so the count survives a restart. In key order, so the same input gives the
    same turn.
    """
    window = tuple((t, n) for t, n in state.returned if t > t_s - cfg.window_s)
    state = replace(state, returned=window)
    if not cfg.enabled or not state.tripped:
        return state, [k for k, _ in returns], {}
    cap = _node_cap(cfg.max_return_fraction, fleet.count(Kind.NODE), cfg.min_nodes)
    seen = {n for _, n in window}
    admitted: list[str] = []
    held: dict[str, str] = {}
    for key, node in sorted(returns):
        if node not in seen and len(seen) >= cap:
            held[key] = (f"breaker tripped: {len(seen)} of {cap} nodes returned within {cfg.window_s:.0f}s; "
                         f"{node} returns when the window allows")
            continue
        if node not in seen:
            seen.add(node)
            window += ((t_s, node),)
        admitted.append(key)
    return replace(state, returned=window), admitted, held
