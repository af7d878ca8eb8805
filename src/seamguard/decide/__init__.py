"""Decisions: policy, objective, safety breaker -> desired state. Pure functions."""

from seamguard.decide.actions import Action, Decisions, Verb, action_key
from seamguard.decide.breaker import BreakerState
from seamguard.decide.planner import DecideState, decide
from seamguard.decide.policy import Policy, PolicyError, default_policy, parse_policy

__all__ = ["Action", "BreakerState", "DecideState", "Decisions", "Policy", "PolicyError", "Verb", "action_key",
           "decide", "default_policy", "parse_policy"]
