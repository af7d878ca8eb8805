"""The Slurm actuator: drains, resumes and admissibility features through scontrol/sinfo.

Level-triggered: `observe()` reads the cluster's actual state back with `sinfo` and
reports only what seamguard owns — drains whose reason carries the owner tag
(`seamguard: <state> <evidence>`, the LBNL NHC convention) and features with the
seamguard prefix. It never resumes a node someone else drained and never overwrites
another owner's drain reason. Every call has a timeout; what Slurm refuses (rc != 0)
comes back as ActionResult(ok=False, detail=stderr).

Slurm 22.05 quirk (REFERENCE.md section 2): RESUME on a node that never registered
(no slurmd) clears DRAIN but exits 1 with "Invalid node state specified"; the result
is decided by reading the state back, not by the exit code.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from seamguard.act.base import ActionResult, verb_of
from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.decide.actions import Action, ActionKey, Verb, action_key

log = logging.getLogger("seamguard.act.slurm")

_SEP = "|"
# sinfo fields: node, long state, reason, available features, active features.
_SINFO_FORMAT = _SEP.join(["%N", "%T", "%E", "%f", "%b"])


class SlurmConfig(BaseModel):
    """The `slurm` actuator section of a run config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scontrol: str = Field("scontrol", description="scontrol binary")
    sinfo: str = Field("sinfo", description="sinfo binary")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for the calls (default: Slurm's own)")
    timeout_s: float = Field(15.0, gt=0, description="timeout of every scontrol/sinfo call")
    tag: str = Field("seamguard", min_length=1, description="owner tag: drain reasons start with '<tag>:'")
    feature_prefix: str = Field("sg_", min_length=1, description="prefix of seamguard's node features")
    max_reason_len: int = Field(200, ge=32, description="drain reasons are cut to this length")


class SlurmError(RuntimeError):
    """sinfo/scontrol could not be run or answered nonsense; ``retryable`` if a retry may help."""

    def __init__(self, msg: str, retryable: bool) -> None:
        super().__init__(msg)
        self.retryable = retryable


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # sinfo %T, lower case (e.g. idle, drained, draining, down)
    reason: str
    available: tuple[str, ...]
    active: tuple[str, ...]

    @property
    def draining(self) -> bool:
        return "drain" in self.state  # drained, draining, idle+drain, ...


def _features(field: str) -> tuple[str, ...]:
    return tuple(f for f in field.split(",") if f and f != "(null)")


class SlurmActuator:
    name = "slurm"
    verbs = frozenset({Verb.DRAIN, Verb.LABEL_DEGRADED})

    def __init__(self, cfg: SlurmConfig | None = None) -> None:
        self.cfg = cfg or SlurmConfig()
        self._env = dict(os.environ)
        if self.cfg.slurm_conf is not None:
            self._env["SLURM_CONF"] = str(self.cfg.slurm_conf)

    # ---- subprocess --------------------------------------------------------------------
    def _run(self, args: list[str]) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=self.cfg.timeout_s, env=self._env)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(args[:3])}: no answer within {self.cfg.timeout_s:g}s", True) from None
        except OSError as e:
            raise SlurmError(f"cannot run {args[0]}: {e.strerror}", False) from None

    def nodes(self) -> dict[str, NodeInfo]:
        """Actual state of every node, read from sinfo (one row per node)."""
        r = self._run([self.cfg.sinfo, "-N", "-h", "-o", _SINFO_FORMAT])
        if r.returncode != 0:
            # slurmctld down or busy is worth retrying; a bad flag is not, but looks the same here.
            raise SlurmError(f"sinfo failed (rc {r.returncode}): {r.stderr.strip()}", True)
        out: dict[str, NodeInfo] = {}
        for line in r.stdout.splitlines():
            parts = line.split(_SEP)
            if len(parts) != 5:
                raise SlurmError(f"sinfo: cannot parse line {line!r}", False)
            name, state, reason, avail, active = parts
            # A node in several partitions appears once per partition; the rows agree.
            out[name] = NodeInfo(name, state.strip().lower(), reason.strip() if reason != "none" else "",
                                 _features(avail), _features(active))
        return out

    def _owned(self, reason: str) -> bool:
        return reason.startswith(self.cfg.tag + ":")

    def _own_features(self, feats: tuple[str, ...]) -> list[str]:
        return [f for f in feats if f.startswith(self.cfg.feature_prefix)]

    def _classes_from(self, feats: tuple[str, ...]) -> list[str]:
        ok = self.cfg.feature_prefix + "ok_"
        have = {f[len(ok):] for f in feats if f.startswith(ok)}
        return [c for c in ADMISSIBILITY_COLUMNS if c in have]

    # ---- Actuator protocol -----------------------------------------------------------------
    def observe(self) -> set[str]:
        held: set[str] = set()
        for n in self.nodes().values():
            if n.draining and self._owned(n.reason):
                held.add(action_key(Verb.DRAIN, n.name))
            if self.cfg.feature_prefix + "degraded" in n.available:
                held.add(action_key(Verb.LABEL_DEGRADED, n.name, value=','.join(self._classes_from(n.available))))
        return held

    def apply(self, action: Action) -> ActionResult:
        if action.verb == Verb.DRAIN:
            return self._drain(action)
        if action.verb == Verb.LABEL_DEGRADED:
            classes = [c for c in action.param("classes").split(",") if c]
            return self._set_features(action.target, classes)
        return ActionResult(False, f"slurm actuator does not handle {action.verb.value}")

    def revert(self, key: str) -> ActionResult:
        verb = verb_of(key)
        target = ActionKey.parse(key).entity
        if verb == Verb.DRAIN:
            return self._resume(target)
        if verb == Verb.LABEL_DEGRADED:
            return self._set_features(target, None)
        return ActionResult(False, f"slurm actuator does not handle {verb.value}")

    # ---- verbs ----------------------------------------------------------------------------------
    def reason_for(self, action: Action) -> str:
        text = " ".join(action.reason.split())  # one line, single spaces
        tag = self.cfg.tag + ":"
        if not text.startswith(tag):
            text = f"{tag} {text.split(':', 1)[1].strip() if text.startswith('seamguard:') else text}"
        return text[: self.cfg.max_reason_len]

    def _node(self, name: str) -> NodeInfo | None:
        return self.nodes().get(name)

    def _drain(self, action: Action) -> ActionResult:
        try:
            cur = self._node(action.target)
            if cur is None:
                return ActionResult(False, f"slurm has no node {action.target!r}")
            if cur.draining and not self._owned(cur.reason):
                # Someone else's drain: leave it and its reason alone (we would otherwise
                # take ownership and later resume a node we were never allowed to touch).
                return ActionResult(True, f"already drained by another owner ({cur.reason!r}); left as is")
            reason = self.reason_for(action)
            r = self._run([self.cfg.scontrol, "update", f"NodeName={action.target}", "State=DRAIN",
                           f"Reason={reason}"])
        except SlurmError as e:
            return ActionResult(False, str(e), retryable=e.retryable)
        if r.returncode != 0:
            return ActionResult(False, f"scontrol refused drain (rc {r.returncode}): {r.stderr.strip()}")
        return ActionResult(True, f"drained: {reason}")

    def _resume(self, node: str) -> ActionResult:
        try:
            cur = self._node(node)
            if cur is None:
                return ActionResult(False, f"slurm has no node {node!r}")
            if not cur.draining:
                return ActionResult(True, "not drained")
            if not self._owned(cur.reason):
                return ActionResult(False, f"refusing to resume {node}: drained by another owner ({cur.reason!r})")
            r = self._run([self.cfg.scontrol, "update", f"NodeName={node}", "State=RESUME"])
            if r.returncode == 0:
                return ActionResult(True, "resumed")
            after = self._node(node)  # 22.05: RESUME of a never-registered node clears DRAIN, rc 1
        except SlurmError as e:
            return ActionResult(False, str(e), retryable=e.retryable)
        if after is not None and not after.draining:
            return ActionResult(True, f"resumed (scontrol rc {r.returncode}: {r.stderr.strip()}; "
                                      f"state read back: {after.state})")
        return ActionResult(False, f"scontrol refused resume (rc {r.returncode}): {r.stderr.strip()}")

    def _set_features(self, node: str, classes: list[str] | None) -> ActionResult:
        """Replace seamguard's features on ``node`` (None removes them), keeping everyone else's."""
        try:
            cur = self._node(node)
            if cur is None:
                return ActionResult(False, f"slurm has no node {node!r}")
            p = self.cfg.feature_prefix
            keep_avail = [f for f in cur.available if not f.startswith(p)]
            keep_active = [f for f in cur.active if not f.startswith(p)]
            ours = [] if classes is None else [f"{p}degraded"] + [f"{p}ok_{c}" for c in classes]
            avail = ",".join(keep_avail + ours)
            active = ",".join(keep_active + ours)
            r = self._run([self.cfg.scontrol, "update", f"NodeName={node}", f"AvailableFeatures={avail}",
                           f"ActiveFeatures={active}"])
        except SlurmError as e:
            return ActionResult(False, str(e), retryable=e.retryable)
        if r.returncode != 0:
            return ActionResult(False, f"scontrol refused features (rc {r.returncode}): {r.stderr.strip()}")
        return ActionResult(True, f"features: {avail or '(none)'}")
