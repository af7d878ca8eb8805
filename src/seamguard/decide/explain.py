"""Explanations as data: the evidence and one-line summaries every action carries. Pure."""

from __future__ import annotations

from seamguard.decide.actions import Action, ActionKey, Verb


def evidence(reasons) -> tuple[tuple[str, float, float, str], ...]:
    """The (channel, score, value, unit) evidence an action records for its cause."""
    return tuple((r.channel, r.score, r.value, r.unit) for r in reasons)


def summary(reasons) -> str:
    """The first three channels and their values, for an action's reason text."""
    return ", ".join(f"{r.channel}={r.value:.3g}" for r in reasons[:3]) or "no evidence"


def kept(key: str, why: str) -> Action:
    """An action in effect kept as it is (its key says all the actuator needs)."""
    ak = ActionKey.parse(key)
    params: tuple[tuple[str, str], ...] = ()
    kind = "node"
    if ak.verb == Verb.LABEL_DEGRADED:
        params = (("classes", "" if ak.value == "none" else ak.value),)
    elif ak.verb == Verb.MOVE_JOB:
        params, kind = (("domain", ak.episode), ("domain_kind", "cooling_loop")), "job"
    elif ak.verb == Verb.AVOID_LINK:
        kind = "link"
    elif ak.verb == Verb.AVOID_STORAGE:
        kind = "storage"
    elif ak.verb == Verb.CHECKPOINT_NOW:
        kind = "job"
    elif ak.verb == Verb.CHECKPOINT_INTERVAL:
        params, kind = (("interval_s", ak.value),), "job"
    return Action(key=key, verb=ak.verb, target=ak.entity, target_kind=kind, params=params,
                  reason=f"seamguard: kept: {why}", cause=ak.entity)
