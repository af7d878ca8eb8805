"""Shared parents: evidence that moves a share of one parent's children together is the parent's.

When every uplink through one spine slows at once, the links' peer group (their tier)
has a median somewhere between the two halves and no single link looks unusual to it,
while each link, judged by its own floor, raises its own alarm: N alarms for one fault,
none of them on the switch where it is. The same holds for every shared parent: the nodes
a cooling loop cools, the nodes a rack's manifold and power distribution feed.

One rule for all of them (``parent_shift``): a parent is flagged when at least
``min_moved`` of its children, and ``share`` of them, have moved off their own baselines
together *and* independent child faults do not explain that many — the chance that this
many of its children moved on their own, at the rate the other parents' children move (their
median share, never below ``base_rate_floor``), is under ``alpha`` (a binomial tail). A fleet-wide move
(every link slower under a heavier load) is then nobody's parent. A flagged parent scores
its moved children's mean strength; the children's channels it explains score 0 and carry
the parent's index as data (``explained_by…``): one alarm, on the parent.

Parents and children (docs/evidence.md, "Peer groups and parents"):

- a spine over its uplinks, a leaf over its NIC links and uplinks (links' own-floor latency);
- a cooling loop over its nodes, on their GPUs' thermal channels (throttling, drift over the
  GPU's own baseline): the loop's meters may read normal while its cold plates do not;
- a rack over its nodes, on the thermal channels and the power brake (the rack's manifold
  and its power distribution — the PDUs or power shelf every node of the rack draws from).

A node is one child however many GPUs it has (a node's own fault — its PSU, its BMC's power
brake — moves all its GPUs and must not read as a rack's): it moved when ``node_share`` of its
GPUs did. Pure functions over arrays; called by assess/assessment.py after the evidence.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.special import bdtrc

from seamguard.assess.evidence import Evidence, EvidenceConfig
from seamguard.assess.stats import loo_median, ramp
from seamguard.fleet.model import Fleet, Kind

# (channels that show a GPU moved, channels the parent then explains on that GPU): a GPU held
# back by heat or by a power brake also runs a slower clock, and that deficit is the same cause's.
THERMAL = (("thermal_throttle", "thermal_drift"), ("thermal_throttle", "thermal_drift", "temp_peer_z", "clock_deficit"))
POWER = (("power_violation",), ("power_violation", "clock_deficit"))


class ParentConfig(BaseModel):
    """When a parent's children moving together make the parent the fault (``assess.parents``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(0.5, gt=0, le=1, description="share of a parent's children that moved off their own floor "
                                                       "together for the parent to be the fault (at half, the "
                                                       "group's median sits between the halves)")
    min_moved: int = Field(2, ge=2, description="fewest children that must move together (one child alone is its own "
                                                "fault: a parent of two cannot tell)")
    alpha: float = Field(0.01, gt=0, lt=1, description="largest chance that independent child faults alone moved "
                                                       "that many of its children")
    base_rate_floor: float = Field(0.02, gt=0, lt=1, description="least share of children assumed to move on their "
                                                                 "own at any time (the median share of the other "
                                                                 "parents' children that moved, when larger)")
    moved_score: float = Field(0.5, gt=0, le=1, description="a GPU's channel score from which it has moved")
    node_share: float = Field(0.5, gt=0, le=1, description="share of a node's GPUs that must move for the node to "
                                                            "count as moved")


def parent_shift(moved: np.ndarray, strength: np.ndarray, parent: np.ndarray, n_parents: int,
                 cfg: ParentConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per parent: (share of its children that moved, how many moved, score).

    ``moved``: per child, off its own floor; ``strength``: how far, in [0, 1]; ``parent``:
    per child, its parent's index (-1: none). The score is the moved children's mean
    strength where the parent is flagged, else 0.
    """
    ok = parent >= 0
    p = parent[ok]
    kids = np.bincount(p, minlength=n_parents).astype(float)
    n_moved = np.bincount(p, weights=moved[ok].astype(float), minlength=n_parents)
    s_sum = np.bincount(p, weights=np.where(moved[ok], np.nan_to_num(strength[ok]), 0.0), minlength=n_parents)
    share = np.divide(n_moved, kids, out=np.zeros(n_parents), where=kids > 0)
    flagged = (n_moved >= cfg.min_moved) & (share >= cfg.share) & (chance_alone(n_moved, kids, cfg) <= cfg.alpha)
    score = np.where(flagged, np.divide(s_sum, n_moved, out=np.zeros(n_parents), where=n_moved > 0), 0.0)
    return share, n_moved, score


def chance_alone(n_moved: np.ndarray, kids: np.ndarray, cfg: ParentConfig) -> np.ndarray:
    """Per parent, the chance that ``n_moved`` or more of its ``kids`` moved each on its own.

    The rate a child moves on its own is the median share of the *other* parents' children that
    moved (a median, so another parent's own fault does not raise it; at least ``base_rate_floor``,
    the floor alone when there is no other parent)."""
    share = np.divide(n_moved, kids, out=np.full(len(kids), np.nan), where=kids > 0)
    others, n_others = loo_median(share, np.zeros(len(kids), dtype=np.int64), 1)
    rate = np.clip(np.where(n_others > 0, np.nan_to_num(others), 0.0), cfg.base_rate_floor, 1.0 - 1e-9)
    k = np.maximum(n_moved - 1, 0).astype(np.int64)
    tail = bdtrc(k, kids.astype(np.int64), rate)  # P(X >= n_moved), X ~ Binomial(kids, rate)
    return np.where(n_moved >= 1, tail, 1.0)


def fabric_parents(fleet: Fleet, links: Evidence, cfg: EvidenceConfig,
                   pcfg: ParentConfig) -> tuple[Evidence, Evidence]:
    """(switch evidence, link evidence with the links a flagged switch explains).

    A link's own deviation is its latency over its own floor (the ``latency_own`` column,
    warm links only). A spine's children are its uplinks; a leaf's are its NIC links and
    its uplinks. A link explained by both a leaf and a spine is the one with the larger share's.
    """
    n_sw, n_l = fleet.count(Kind.SWITCH), links.score.shape[0]
    own = links.column("latency_own")
    warm = links.column("warming") == 0
    moved = warm & (np.nan_to_num(own, nan=0.0) >= cfg.latency_ratio[0])
    strength = ramp(own, *cfg.latency_ratio)
    spine = fleet.link_spine if n_l else np.zeros(0, dtype=np.int64)
    leaf = fleet.link_leaf if n_l else np.zeros(0, dtype=np.int64)
    sh_sp, mv_sp, sc_sp = parent_shift(moved, strength, spine, n_sw, pcfg)
    sh_lf, mv_lf, sc_lf = parent_shift(moved, strength, leaf, n_sw, pcfg)
    # A switch is a spine or a leaf: the two tests never score the same switch twice.
    score = np.maximum(sc_sp, sc_lf)
    share = np.maximum(sh_sp, sh_lf)
    n_moved = np.maximum(mv_sp, mv_lf)
    by_sp = moved & (spine >= 0) & (sc_sp[np.maximum(spine, 0)] > 0)
    by_lf = moved & (sc_lf[leaf] > 0) if n_l else np.zeros(0, dtype=bool)
    sp_share = np.where(spine >= 0, sh_sp[np.maximum(spine, 0)], -1.0)
    lf_share = sh_lf[leaf] if n_l else np.zeros(0)
    pick_sp = by_sp & (~by_lf | (sp_share >= lf_share))
    explained_by = np.where(pick_sp, spine, np.where(by_lf, leaf, -1))
    expl = explained_by >= 0
    none = np.zeros(n_sw, dtype=bool)
    switch_ev = Evidence(Kind.SWITCH, ("children_moved", "children_moved_count"), ("share", "links"),
                         np.stack([score, np.zeros(n_sw)], axis=1), np.stack([share, n_moved], axis=1), none, none)
    link_ev = replace(links, channels=links.channels + ("explained_by",), units=links.units + ("switch",),
                      score=np.concatenate([np.where(expl[:, None], 0.0, links.score), np.zeros((n_l, 1))], axis=1),
                      value=np.concatenate([links.value, np.where(expl, explained_by, np.nan)[:, None]], axis=1))
    return switch_ev, link_ev


def _node_moves(fleet: Fleet, gpu: Evidence, channels: tuple[str, ...],
                cfg: ParentConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node: (moved on ``channels``, mean strength of its moved GPUs); per GPU: its strength there."""
    cols = [gpu.channels.index(c) for c in channels if c in gpu.channels]
    n_nodes = fleet.count(Kind.NODE)
    if not cols:
        return np.zeros(n_nodes, dtype=bool), np.zeros(n_nodes), np.zeros(gpu.score.shape[0])
    s = gpu.score[:, cols[0]]
    for c in cols[1:]:
        s = np.maximum(s, gpu.score[:, c])
    idx = np.flatnonzero(s >= cfg.moved_score)
    if not len(idx):  # the usual tick: nothing moved, no pass over every GPU's node
        return np.zeros(n_nodes, dtype=bool), np.zeros(n_nodes), s
    node = fleet.gpu_node[idx]
    n_moved = np.bincount(node, minlength=n_nodes).astype(float)
    s_sum = np.bincount(node, weights=s[idx], minlength=n_nodes)
    node_moved = (n_moved >= 1) & (n_moved >= cfg.node_share * np.bincount(fleet.gpu_node, minlength=n_nodes))
    return node_moved, np.divide(s_sum, n_moved, out=np.zeros(n_nodes), where=n_moved > 0), s


def _with_children(e: Evidence, share: np.ndarray, n_moved: np.ndarray, score: np.ndarray) -> Evidence:
    """A parent's evidence with its children's verdict as two more channels."""
    n = e.score.shape[0]
    return replace(e, channels=e.channels + ("children_moved", "children_moved_count"),
                   units=e.units + ("share", "nodes"),
                   score=np.concatenate([e.score, score[:, None], np.zeros((n, 1))], axis=1),
                   value=np.concatenate([e.value, share[:, None], n_moved[:, None]], axis=1))


def facility_parents(fleet: Fleet, gpu: Evidence, rack: Evidence, loop: Evidence,
                     cfg: ParentConfig) -> tuple[Evidence, Evidence, Evidence]:
    """(GPU evidence, rack evidence, loop evidence) after the loops and racks judged their nodes.

    A loop is judged on its nodes' thermal moves; a rack on thermal moves its loop does not
    explain and on power-brake moves. A flagged parent's GPUs lose those channels' scores and
    name it (``explained_by_loop``, ``explained_by_rack``: its index, NaN when none); when no
    parent is flagged the GPU evidence is returned as it came (no copy of the largest matrix).
    """
    n_loops, n_racks = fleet.count(Kind.COOLING_LOOP), fleet.count(Kind.RACK)
    node_loop, node_rack = fleet.node_loop, fleet.node_rack
    hot, hot_s, g_hot = _node_moves(fleet, gpu, THERMAL[0], cfg)
    capped, capped_s, g_cap = _node_moves(fleet, gpu, POWER[0], cfg)
    if not (hot.any() or capped.any()):
        z_l, z_r = np.zeros(n_loops), np.zeros(n_racks)
        return gpu, _with_children(rack, z_r, z_r, z_r), _with_children(loop, z_l, z_l, z_l)
    sh_l, mv_l, sc_l = parent_shift(hot, hot_s, node_loop, n_loops, cfg)
    # A thermal move confined to one rack of a loop is that rack's (its manifold, its door): the loop
    # is the cause when its moved nodes span two or more of its racks, or it has only one.
    racks_hot = np.bincount(node_rack, weights=hot, minlength=n_racks) > 0
    spans = np.bincount(fleet.rack_loop, weights=racks_hot, minlength=n_loops)
    sc_l = np.where((spans >= 2) | (np.bincount(fleet.rack_loop, minlength=n_loops) == 1), sc_l, 0.0)
    loop_out = _with_children(loop, sh_l, mv_l, sc_l)
    hot_r = hot & (sc_l[node_loop] == 0)  # a loop's thermal move is the loop's, not each of its racks'
    moved_r = hot_r | capped
    sh_r, mv_r, sc_r = parent_shift(moved_r, np.maximum(np.where(hot_r, hot_s, 0.0), capped_s), node_rack, n_racks, cfg)
    rack_out = _with_children(rack, sh_r, mv_r, sc_r)
    gpu_loop, gpu_rack = fleet.gpu_loop, fleet.gpu_rack
    hot_l = (sc_l[gpu_loop] > 0) & (g_hot > 0)
    hot_rk = (sc_r[gpu_rack] > 0) & (g_hot > 0) & ~hot_l
    cap_rk = (sc_r[gpu_rack] > 0) & (g_cap > 0)
    if not (hot_l.any() or hot_rk.any() or cap_rk.any()):
        return gpu, rack_out, loop_out
    names = np.array(gpu.channels)
    mask = ((hot_l | hot_rk)[:, None] & np.isin(names, THERMAL[1])[None, :]) | \
        (cap_rk[:, None] & np.isin(names, POWER[1])[None, :])
    by_rack = hot_rk | cap_rk
    n = gpu.score.shape[0]
    gpu_out = replace(gpu, channels=gpu.channels + ("explained_by_loop", "explained_by_rack"),
                      units=gpu.units + ("cooling_loop", "rack"),
                      score=np.concatenate([np.where(mask, 0.0, gpu.score), np.zeros((n, 2))], axis=1),
                      value=np.concatenate([gpu.value, np.where(hot_l, gpu_loop, np.nan)[:, None],
                                            np.where(by_rack, gpu_rack, np.nan)[:, None]], axis=1))
    return gpu_out, rack_out, loop_out
