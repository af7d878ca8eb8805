"""Shared parents: evidence that moves a share of one parent's children is the parent's.

When every uplink through one spine slows at once, the links' peer group (their tier)
has a median somewhere between the two halves and no single link looks unusual to it,
while each link, judged by its own floor, raises its own alarm: N alarms for one fault,
none of them on the switch where it is. Here a parent (a spine over its uplinks, a leaf
over its NIC links and uplinks) is judged by its children's *own-history* deviation: when
at least ``min_moved`` of its children and ``share`` of them have moved off their own
floors together, the parent is flagged with their strength, and the children it explains
lose their own score and carry the parent's index as data (``explained_by``): one alarm,
on the parent. Pure functions over arrays (docs/evidence.md, "Peer groups and parents").

Called by assess/assessment.py after the link evidence, with the link evidence.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.assess.evidence import Evidence, EvidenceConfig
from seamguard.assess.stats import ramp
from seamguard.fleet.model import Fleet, Kind


class ParentConfig(BaseModel):
    """When a parent's children moving together make the parent the fault (``assess.parents``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(0.5, gt=0, le=1, description="share of a parent's children that moved off their own floor "
                                                       "together for the parent to be the fault")
    min_moved: int = Field(2, ge=2, description="fewest children that must move together (one child alone is its own "
                                                "fault: a parent of two cannot tell)")


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
    flagged = (n_moved >= cfg.min_moved) & (share >= cfg.share)
    score = np.where(flagged, np.divide(s_sum, n_moved, out=np.zeros(n_parents), where=n_moved > 0), 0.0)
    return share, n_moved, score


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
