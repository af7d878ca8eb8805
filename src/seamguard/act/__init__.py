"""Actuation: the only stage that changes the world (level-triggered, idempotent)."""

from seamguard.act.base import ActionResult, Actuator
from seamguard.act.log import LogActuator
from seamguard.act.reconcile import Change, diff, observe_all, reconcile

__all__ = ["ActionResult", "Actuator", "Change", "LogActuator", "diff", "observe_all", "reconcile"]
