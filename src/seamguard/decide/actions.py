"""The Decision record: one keyed action with its reasons, crossing from decide to act.

Level-triggered: an action describes a state to hold ("node X is drained"), keyed so
that applying it twice is a no-op and a restarted controller recognises its own work.
One-shot actions (checkpoint now) carry the episode in their key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Verb(str, Enum):
    DRAIN = "drain"  # quarantine a node: no new work, evacuate running work to a spare
    LABEL_DEGRADED = "label_degraded"  # admissibility labels: job classes the node may still take
    CHECKPOINT_NOW = "checkpoint_now"  # one-shot: an exposed job writes a checkpoint now
    AVOID_LINK = "avoid_link"  # take a fabric path out of routing (ECMP weight 0)
    AVOID_STORAGE = "avoid_storage"  # checkpoints go to another storage path
    MOVE_JOB = "move_job"  # move a job's ranks off a degraded domain (loop, rack)
    CHECKPOINT_INTERVAL = "checkpoint_interval"  # a job checkpoints at a shorter interval while at risk

    @property
    def one_shot(self) -> bool:
        return self == Verb.CHECKPOINT_NOW


@dataclass(frozen=True)
class Action:
    key: str
    verb: Verb
    target: str  # entity name (node, job, link, storage path)
    target_kind: str
    params: tuple[tuple[str, str], ...] = ()
    reason: str = ""
    cause: str = ""  # the entity whose state drove it
    evidence: tuple[tuple[str, float, float, str], ...] = ()  # (channel, score, value, unit)
    benefit_gpu_h_per_h: float = 0.0
    cost_gpu_h_per_h: float = 0.0
    criticality: float = 1.0

    def param(self, name: str, default: str = "") -> str:
        return dict(self.params).get(name, default)


@dataclass(frozen=True)
class ActionKey:
    """``verb:entity[=value][@episode]`` — the one spelling of an action's identity.

    ``value`` is what a labelling action sets (the job classes a node may take);
    ``episode`` makes a one-shot unique (checkpoint_now) or names the domain a job
    moves off (move_job). Actuators store the string form on the objects they own.
    """

    verb: Verb
    entity: str
    value: str = ""
    episode: str = ""

    def __str__(self) -> str:
        return (f"{self.verb.value}:{self.entity}" + (f"={self.value}" if self.value else "")
                + (f"@{self.episode}" if self.episode else ""))

    @classmethod
    def parse(cls, key: str) -> ActionKey:
        verb, sep, rest = key.partition(":")
        if not sep:
            raise ValueError(f"action key {key!r}: expected 'verb:entity[=value][@episode]'")
        try:
            v = Verb(verb)
        except ValueError:
            raise ValueError(f"action key {key!r}: unknown verb {verb!r}") from None
        rest, _, episode = rest.partition("@")
        entity, _, value = rest.partition("=")
        if not entity:
            raise ValueError(f"action key {key!r}: no entity")
        return cls(v, entity, value, episode)


def action_key(verb: Verb, target: str, episode: str = "", value: str = "") -> str:
    return str(ActionKey(verb, target, value, episode))


@dataclass(frozen=True)
class Decisions:
    """The desired state for this tick, plus what the breaker held back."""

    t_s: float
    desired: dict[str, Action]
    held: list[Action] = field(default_factory=list)  # wanted, but blocked by the breaker
    breaker_tripped: bool = False
    breaker_reason: str = ""
    frozen: tuple = ()  # FrozenScope of every scope whose input failed (no new action there)
    held_by_freeze: int = 0  # new actions not taken this tick because their scope is frozen
