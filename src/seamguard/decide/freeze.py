"""The failsafe freeze in decide: nothing new where the input failed; what is in effect stays. Pure."""

from __future__ import annotations

from seamguard.assess.quality import FreezeView
from seamguard.decide.actions import Action, ActionKey, Verb
from seamguard.decide.breaker import Request
from seamguard.decide.explain import kept
from seamguard.fleet.model import Fleet, Kind

_TARGET_KIND = {"node": Kind.NODE, "link": Kind.LINK, "storage": Kind.STORAGE}
_VERB_KIND = {Verb.DRAIN: Kind.NODE, Verb.LABEL_DEGRADED: Kind.NODE, Verb.AVOID_LINK: Kind.LINK,
              Verb.AVOID_STORAGE: Kind.STORAGE}


def action_scope(act: Action) -> tuple[Kind | None, str]:
    """The entity whose input a new action depends on: its target, or for a job the loop it moves off / the node it is exposed to."""
    if act.target_kind == "job":
        return (Kind.COOLING_LOOP, act.cause) if act.verb == Verb.MOVE_JOB else (Kind.NODE, act.cause)
    return _TARGET_KIND.get(act.target_kind), act.target


def key_scope(ak: ActionKey) -> tuple[Kind | None, str]:
    """The entity an action in effect restricts, read from its key (a move_job's loop is its episode)."""
    if ak.verb == Verb.MOVE_JOB:
        return Kind.COOLING_LOOP, ak.episode
    return _VERB_KIND.get(ak.verb), ak.entity


def is_frozen(fleet: Fleet, frozen: FreezeView, kind: Kind | None, target: str) -> bool:
    """Whether the entity (kind, name) is inside a frozen scope; an unknown one is not."""
    try:
        idx = fleet.index_of(kind, target) if kind is not None else -1
    except KeyError:
        idx = -1
    return idx >= 0 and frozen.frozen(kind, idx)


def drop_frozen_new(fleet: Fleet, frozen: FreezeView, desired: dict[str, Action], requests: dict[str, Request],
                    in_effect: set[str], carried: frozenset[str]
                    ) -> tuple[dict[str, Action], dict[str, Request], int]:
    """Withdraw every new action inside a frozen scope (and its breaker request); returns how many."""
    desired, requests = dict(desired), dict(requests)
    n_frozen = 0
    for k in list(desired):
        if k in in_effect or k in carried:
            continue
        if is_frozen(fleet, frozen, *action_scope(desired[k])):
            del desired[k]
            requests.pop(k, None)
            n_frozen += 1
    return desired, requests, n_frozen


def keep_frozen_in_effect(fleet: Fleet, frozen: FreezeView, desired: dict[str, Action],
                          in_effect: set[str]) -> dict[str, Action]:
    """Keep every restriction in effect inside a frozen scope: not reverted for want of data."""
    desired = dict(desired)
    for k in sorted(in_effect - set(desired)):
        ak = ActionKey.parse(k)
        if ak.verb.one_shot:
            continue
        if is_frozen(fleet, frozen, *key_scope(ak)):
            desired[k] = kept(k, "its input is missing (failsafe freeze); not reverted for want of data")
    return desired


def apply_freeze(fleet: Fleet, frozen: FreezeView | None, desired: dict[str, Action], requests: dict[str, Request],
                 in_effect: set[str], carried: frozenset[str]) -> tuple[dict[str, Action], dict[str, Request], int]:
    """The freeze: no new action where the input failed, and what is in effect there stays."""
    if frozen is None or not frozen.scopes:
        return desired, requests, 0
    desired, requests, n_frozen = drop_frozen_new(fleet, frozen, desired, requests, in_effect, carried)
    return keep_frozen_in_effect(fleet, frozen, desired, in_effect), requests, n_frozen
