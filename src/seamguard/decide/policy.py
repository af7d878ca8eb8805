"""The declarative policy (YAML): objective, action rules, breaker, and assess tuning.

A shipped default (default_policy.yaml) is merged under a user's file, so a user
writes only what they change. Errors name the file, the field and what was expected.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from seamguard.assess.assessment import AssessConfig
from seamguard.assess.states import STATE_BY_LABEL
from seamguard.fleet.model import JOB_CLASS_BY_LABEL
from seamguard.config import format_validation_error


class PolicyError(ValueError):
    """A policy that cannot be used; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _states(v: list[str]) -> list[str]:
    for s in v:
        if s not in STATE_BY_LABEL:
            raise ValueError(f"unknown state {s!r}; expected one of {', '.join(STATE_BY_LABEL)}")
    return v


def _classes(v: list[str]) -> list[str]:
    for c in v:
        if c not in JOB_CLASS_BY_LABEL:
            raise ValueError(f"unknown job class {c!r}; expected one of {', '.join(JOB_CLASS_BY_LABEL)}")
    return v


class Objective(_Strict):
    criticality_exponent: float = Field(1.0, ge=0)
    hold_h: float = Field(24.0, gt=0)
    horizon_h: float = Field(4.0, gt=0)
    migrate_h: float = Field(0.0125, ge=0)
    idle_criticality: float = Field(0.5, ge=0)


class ActionRules(_Strict):
    drain_states: list[str]
    label_degraded: bool = True
    checkpoint_classes: list[str]
    severe_checkpoint_interval_s: float = Field(120.0, gt=0)
    avoid_link_states: list[str]
    avoid_storage_states: list[str]
    move_job_domain_states: list[str]
    move_job_classes: list[str]
    move_job_min_criticality: float = Field(1.0, ge=0)

    _v_states = field_validator("drain_states", "avoid_link_states", "avoid_storage_states",
                                "move_job_domain_states")(_states)
    _v_classes = field_validator("checkpoint_classes", "move_job_classes")(_classes)


class BreakerConfig(_Strict):
    window_s: float = Field(3600.0, gt=0)
    max_fleet_fraction: float = Field(0.05, gt=0, le=1)
    max_loop_fraction: float = Field(0.25, gt=0, le=1)


class Policy(_Strict):
    version: Literal[1]
    mode: Literal["dry_run", "enforce"] = "dry_run"
    objective: Objective
    actions: ActionRules
    breaker: BreakerConfig
    assess: AssessConfig = Field(default_factory=AssessConfig)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _default_data() -> dict[str, Any]:
    text = resources.files("seamguard.decide").joinpath("default_policy.yaml").read_text()
    return yaml.safe_load(text)


def parse_policy(data: Any, source: str = "<policy>") -> Policy:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    merged = _merge(_default_data(), data)
    try:
        return Policy.model_validate(merged)
    except ValidationError as err:
        raise PolicyError(format_validation_error(source, "policy", err)) from None


def default_policy(**overrides: Any) -> Policy:
    return parse_policy(overrides, "<default policy>")

