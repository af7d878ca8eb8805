"""The declarative policy (YAML): objective, action rules, breaker, and assess tuning.

A shipped default (default_policy.yaml) is merged under a user's file, so a user
writes only what they change. Errors name the file, the field and what was expected.
"""

from __future__ import annotations

from enum import Enum
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from seamguard.assess.assessment import AssessConfig
from seamguard.assess.quality import FailsafeConfig
from seamguard.assess.states import STATE_BY_LABEL
from seamguard.decide.durations import table_from_rows
from seamguard.fleet.model import JOB_CLASS_BY_LABEL
from seamguard.config import format_validation_error, parse_yaml


class Mode(str, Enum):
    """dry_run: decide and record, change nothing. enforce: actuate."""

    dry_run = "dry_run"
    enforce = "enforce"


def check_mode(mode: str) -> str:
    """The mode, or a ValueError naming the two there are."""
    if mode not in Mode._value2member_map_:
        raise ValueError(f"mode must be 'dry_run' or 'enforce', got {mode!r}")
    return str(mode)


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
    slip_weight: float = Field(
        1.0, ge=0, allow_inf_nan=False,
        description="weight of a job's schedule slip (decide/slip.py): a drain or move is also worth the expected "
                    "seconds past its deadline it saves x its GPUs x this / 3600 GPU-hours, and shedding takes jobs "
                    "with slack first; 0 turns the deadline term off")
    fault_durations: list[Any] = Field(
        default_factory=list,
        description="how long faults last, per domain and class (decide/durations.py): the `durations` rows of a "
                    "calibrated twin config (`seamguard twin calibrate`), as they are; a drain, move or shed is "
                    "priced over the fault's expected remaining time (at most horizon_h). A pair not here keeps "
                    "its fault_duration_priors row")
    fault_duration_priors: list[Any] = Field(
        default_factory=list,
        description="the published priors (same shape), used for a domain and class fault_durations lacks")

    @field_validator("fault_durations", "fault_duration_priors")
    @classmethod
    def _durations(cls, v: list[Any], info: Any) -> list[Any]:
        table_from_rows(v, info.field_name)
        return v

    def duration_table(self) -> dict:
        """(domain, class) -> decide.durations.Duration: the calibrated rows over the priors."""
        return table_from_rows(self.fault_duration_priors, "fault_duration_priors") | \
            table_from_rows(self.fault_durations, "fault_durations")


class ActionRules(_Strict):
    drain_states: list[str]
    label_degraded: bool = True
    checkpoint_classes: list[str]
    checkpoint_write_s: float = Field(
        20.0, gt=0, allow_inf_nan=False,
        description="stall of one checkpoint write; every GPU of the job waits this long (the cost of checkpoint_now)")
    episode_end_healthy_ticks: int = Field(
        120, ge=1, description="a job's risk episode ends after its nodes have been healthy this many ticks "
                               "(the state machine's own recovery ticks count): at most one checkpoint_now per "
                               "episode unless its state worsens")
    reask_on_worse: bool = Field(
        False, description="within a job's risk episode, ask checkpoint_now again when the evidence worsens (a "
                           "stricter state, or the hazard reask_hazard_ratio times), if it pays and Young's interval "
                           "has passed; off: exactly once per episode")
    reask_hazard_ratio: float = Field(
        2.0, gt=1, allow_inf_nan=False,
        description="with reask_on_worse: the job's failure-hazard growth since it was asked that counts as worse "
                    "evidence")
    adapt_checkpoint_interval: bool = Field(
        True, description="while a checkpointed job is exposed, ask its runtime for a shorter checkpoint interval "
                          "(Young's at the job's hazard, on a ladder of halvings of "
                          "assess.propagation.checkpoint_interval_h) where it saves more rollback than its writes "
                          "cost; its own interval again when the exposure ends")
    release_after_healthy_ticks: int = Field(
        40, ge=0, description="a restriction (drain, label, avoid_*, move_job) is withdrawn only after its entity "
                              "has been healthy this many ticks (the state machine's own recovery ticks count)")
    avoid_link_states: list[str]
    avoid_storage_states: list[str]
    move_job_domain_states: list[str]
    move_job_classes: list[str]
    move_job_min_criticality: float = Field(1.0, ge=0)
    shed_job_domain_states: list[str] = Field(
        default_factory=list, description="cooling-loop states in which the lowest-criticality jobs are shed "
                                          "(requeued off the loop, waiting for room elsewhere); [] turns shedding off")
    shed_job_max_criticality: float = Field(0.5, ge=0, description="only jobs at or below this criticality are shed")
    shed_job_max_loop_fraction: float = Field(
        0.5, ge=0, le=1, description="at most this share of a loop's nodes is shed (lowest criticality first)")

    _v_states = field_validator("drain_states", "avoid_link_states", "avoid_storage_states",
                                "move_job_domain_states", "shed_job_domain_states")(_states)
    _v_classes = field_validator("checkpoint_classes", "move_job_classes")(_classes)

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "severe_checkpoint_interval_s" in data:
            raise ValueError("severe_checkpoint_interval_s was removed: checkpoint_now is now priced by the "
                             "economics (checkpoint_write_s) and issued at most once per risk episode "
                             "(episode_end_healthy_ticks); see docs/policy.md")
        return data


# Numbers that bound the controller's own blast radius are strict: a bool (``true`` is 1 to
# a lax parser, which would allow the whole fleet), a string, NaN or infinity is an error,
# not a value. Switching the breaker off is said in words: ``breaker: {enabled: false}``.
_FRACTION = dict(gt=0, le=1, strict=True, allow_inf_nan=False)
MIN_WINDOW_S = 60.0


def _number(v: Any) -> Any:
    # strict float still takes an int; refuse bool explicitly (bool is an int in Python)
    if isinstance(v, bool):
        raise ValueError("expected a number, got a boolean (to switch the breaker off say enabled: false)")
    return float(v) if isinstance(v, int) else v


class BreakerConfig(_Strict):
    enabled: bool = Field(True, strict=True, description="false switches the breaker off (warned at start)")
    window_s: float = Field(3600.0, ge=MIN_WINDOW_S, strict=True, allow_inf_nan=False,
                            description="rate window; at least a minute and at least one tick")
    # rate: nodes newly restricted (drain, label, move) within the window; hard failures bypass it
    max_fleet_fraction: float = Field(0.05, **_FRACTION)
    max_loop_fraction: float = Field(0.25, **_FRACTION)
    # totals: nodes under any restriction at once (the actuators' observed in-effect set)
    max_in_effect_fleet_fraction: float = Field(0.20, **_FRACTION)
    max_in_effect_loop_fraction: float = Field(0.30, **_FRACTION)
    max_in_effect_rack_fraction: float = Field(0.50, **_FRACTION)
    max_in_effect_leaf_fraction: float = Field(0.30, **_FRACTION)
    # whole domains (cooling loops, racks) restricted at once for their own state
    max_domain_fraction: float = Field(0.25, **_FRACTION)
    # fabric and storage paths taken out of use at once (at least one is always allowed)
    max_link_fraction: float = Field(0.10, **_FRACTION)
    max_storage_fraction: float = Field(0.50, **_FRACTION)
    # every node bound above is max(share x its domain's nodes, min_nodes), never more than the
    # domain has: on a 32-node pilot 5 % of the fleet is one node, and the second drain would trip
    min_nodes: int = Field(2, ge=1, strict=True,
                           description="the fewest nodes any node bound allows (capped at the domain's size)")
    # while tripped, nodes seamguard restricted still return after sustained recovery, this many per
    # window (max(share x fleet, min_nodes)); a return past it waits, kept with why
    max_return_fraction: float = Field(0.05, **_FRACTION)

    _v_numbers = field_validator(
        "window_s", "max_fleet_fraction", "max_loop_fraction", "max_in_effect_fleet_fraction",
        "max_in_effect_loop_fraction", "max_in_effect_rack_fraction", "max_in_effect_leaf_fraction",
        "max_domain_fraction", "max_link_fraction", "max_storage_fraction", "max_return_fraction",
        mode="before")(_number)


class Policy(_Strict):
    version: Literal[1]
    mode: Literal["dry_run", "enforce"] = "dry_run"
    objective: Objective
    actions: ActionRules
    breaker: BreakerConfig
    failsafe: FailsafeConfig = Field(default_factory=FailsafeConfig)
    assess: AssessConfig = Field(default_factory=AssessConfig)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _default_data() -> dict[str, Any]:
    text = resources.files("seamguard.decide").joinpath("default_policy.yaml").read_text()
    return parse_yaml(text, "default_policy.yaml", "default policy")


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

