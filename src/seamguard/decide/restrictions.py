"""Restrictions in effect: they only tighten while the risk stays, and lift only after sustained recovery. Pure.

A restriction is a drain or a label_degraded of a node. Once in effect it is not
replaced by a looser one while its node is at risk, and once its entity is healthy again
it (and any avoid_* or move_job) stays until that entity has been healthy
release_after_healthy_ticks (the state machine's recovery ticks included), unless a new
restriction of the same node replaces it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from seamguard.assess.assessment import Assessment
from seamguard.assess.states import State
from seamguard.decide.actions import Action, ActionKey, Verb
from seamguard.decide.explain import kept
from seamguard.fleet.model import Fleet, Kind

RESTRICTS_NODE = (Verb.DRAIN, Verb.LABEL_DEGRADED)


def strictness(ak: ActionKey) -> tuple[int, frozenset[str]]:
    """drain 3 > a label admitting no job class 2 > a label admitting some 1."""
    if ak.verb == Verb.DRAIN:
        return 3, frozenset()
    classes = frozenset(c for c in ak.value.split(",") if c and c != "none")
    return (2 if not (classes - {"checkpoint_restore"}) else 1), classes


def at_least_as_strict(new: ActionKey, old: ActionKey) -> bool:
    """Whether ``new`` restricts its node at least as much as ``old`` (a label admitting a subset is)."""
    (rn, cn), (ro, co) = strictness(new), strictness(old)
    return rn > ro or (rn == ro and (rn != 1 or cn <= co))


def at_risk(a: Assessment) -> np.ndarray:
    """Nodes still at risk: their compute, fabric or facilities domain (or the node itself) is worse than healthy."""
    return (a.node_domain_state[:, :3] > State.HEALTHY).any(axis=1) | (a.node_state > State.HEALTHY)


def node_restrictions(keys, node_index: Mapping[str, int]) -> dict[int, list[ActionKey]]:
    """The restrictions among ``keys``, by node index (unknown nodes left out)."""
    by_node: dict[int, list[ActionKey]] = {}
    for k in keys:
        ak = ActionKey.parse(k)
        if ak.verb in RESTRICTS_NODE and ak.entity in node_index:
            by_node.setdefault(node_index[ak.entity], []).append(ak)
    return by_node


def only_tighten(desired: dict[str, Action], in_effect: set[str], risk: np.ndarray,
                 node_index: Mapping[str, int]) -> dict[str, Action]:
    """Keep a restriction in effect, instead of a looser or no replacement, while its node is at risk."""
    desired = dict(desired)
    by_node = node_restrictions(desired, node_index)
    for k in sorted(in_effect - set(desired)):
        old = ActionKey.parse(k)
        if old.verb not in RESTRICTS_NODE or old.entity not in node_index:
            continue
        i = node_index[old.entity]
        if not risk[i]:
            continue  # the risk is gone: the restriction is lifted
        mine = by_node.get(i, [])
        if any(at_least_as_strict(n, old) for n in mine):
            continue
        for n in mine:  # a looser replacement while the risk stays: keep the old one instead
            desired.pop(str(n), None)
        desired[k] = kept(k, f"{old.entity} is still at risk; a restriction only tightens while it is")
        by_node[i] = [old]
    return desired


def healthy_for(ak: ActionKey, fleet: Fleet, node_index: Mapping[str, int], kind_ht: dict[Kind, np.ndarray],
                node_ht: np.ndarray) -> tuple[int, str] | None:
    """(ticks healthy, entity) of what an action in effect restricts; None for a one-shot or an unknown entity."""
    try:
        if ak.verb in RESTRICTS_NODE:
            return int(node_ht[node_index[ak.entity]]), ak.entity
        if ak.verb == Verb.AVOID_LINK:
            return int(kind_ht[Kind.LINK][fleet.index_of(Kind.LINK, ak.entity)]), ak.entity
        if ak.verb == Verb.AVOID_STORAGE:
            return int(kind_ht[Kind.STORAGE][fleet.index_of(Kind.STORAGE, ak.entity)]), ak.entity
        if ak.verb == Verb.MOVE_JOB:
            return int(kind_ht[Kind.COOLING_LOOP][fleet.index_of(Kind.COOLING_LOOP, ak.episode)]), ak.episode
    except KeyError:
        return None
    return None


def release_dwell(desired: dict[str, Action], in_effect: set[str], fleet: Fleet, node_index: Mapping[str, int],
                  kind_ht: dict[Kind, np.ndarray], node_ht: np.ndarray, release_ticks: int) -> dict[str, Action]:
    """Keep what is in effect until its entity has been healthy ``release_ticks`` (not replaced by a new restriction);
    a job move is kept while its domain is still in trouble too."""
    desired = dict(desired)
    restricted_nodes = {ActionKey.parse(k).entity for k in desired
                        if ActionKey.parse(k).verb in RESTRICTS_NODE}
    for k in sorted(in_effect - set(desired)):
        ak = ActionKey.parse(k)
        if ak.verb in RESTRICTS_NODE and ak.entity in restricted_nodes:
            continue
        dwell = healthy_for(ak, fleet, node_index, kind_ht, node_ht)
        if dwell is None:
            continue
        ht, what = dwell
        if 0 < ht < release_ticks:
            desired[k] = kept(k, f"{what} healthy for {ht} of {release_ticks} ticks; lifted after sustained recovery")
        elif ht == 0 and ak.verb == Verb.MOVE_JOB:
            # a moved job no longer on the domain (pending, or landed elsewhere) is not asked to
            # move again, but lifting its exclusion would let the scheduler put it back there
            desired[k] = kept(k, f"{what} still in trouble; the job stays off it until healthy for "
                                 f"{release_ticks} ticks")
    return desired
