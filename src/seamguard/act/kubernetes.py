"""The Kubernetes actuator: cordon, taints and a node condition via the official client.

Follows NVSentinel's split (github.com/NVIDIA/NVSentinel; docs/sources.md §2): the taint says "is it bad"
(`seamguard.io/state=quarantine:NoSchedule`, `seamguard.io/state=degraded:PreferNoSchedule`),
the condition says why (type `SeamguardHealthy`, reason, message, lastTransitionTime),
and cordon (`spec.unschedulable`) keeps new pods off a quarantined node. Ownership is
written on the node as annotations, so the actuator never uncordons a node it did not
cordon and `observe()` reads its own actions back from the API server (level-triggered).

Not integration-tested against a real API server (none can run on the build machines);
the tests check the exact request bodies against a recorder standing in for CoreV1Api.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from seamguard.act.base import ActionResult, verb_of
from seamguard.decide.actions import Action, ActionKey, Verb, action_key

log = logging.getLogger("seamguard.act.kubernetes")


class KubernetesConfig(BaseModel):
    """The `kubernetes` actuator section of a run config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: Path | None = Field(None, description="kubeconfig file; None = in-cluster service account")
    context: str | None = None
    request_timeout_s: float = Field(10.0, gt=0, description="timeout of every API call")
    taint_key: str = "seamguard.io/state"
    condition_type: str = "SeamguardHealthy"
    annotation_prefix: str = "seamguard.io/"
    label_selector: str | None = Field(None, description="only nodes matching this selector are observed")


class KubernetesActuator:
    name = "kubernetes"
    verbs = frozenset({Verb.DRAIN, Verb.LABEL_DEGRADED})

    def __init__(self, cfg: KubernetesConfig | None = None, api: Any = None) -> None:
        self.cfg = cfg or KubernetesConfig()
        self.api = api if api is not None else self._connect()
        p = self.cfg.annotation_prefix
        self.ann_cordoned = p + "cordoned"  # "true": seamguard set spec.unschedulable
        self.ann_admissible = p + "admissible"  # job classes a degraded node may take

    def _connect(self) -> Any:
        from kubernetes import client, config  # optional dependency (extra `k8s`)

        if self.cfg.kubeconfig is not None:
            config.load_kube_config(config_file=str(self.cfg.kubeconfig), context=self.cfg.context)
        else:
            config.load_incluster_config()
        return client.CoreV1Api()

    # ---- reading ------------------------------------------------------------------------
    def _taints(self, node: Any) -> list[Any]:
        spec = getattr(node, "spec", None)
        taints = getattr(spec, "taints", None) if spec is not None else None
        return list(taints) if isinstance(taints, list | tuple) else []

    def _ours(self, taint: Any, effect: str | None = None) -> bool:
        return getattr(taint, "key", None) == self.cfg.taint_key and (
            effect is None or getattr(taint, "effect", None) == effect)

    def observe(self) -> set[str]:
        kw: dict[str, Any] = {"_request_timeout": self.cfg.request_timeout_s}
        if self.cfg.label_selector:
            kw["label_selector"] = self.cfg.label_selector
        held: set[str] = set()
        skipped = 0
        for node in getattr(self.api.list_node(**kw), "items", None) or []:
            # One odd node object (no metadata, no name, annotations not a map) is skipped,
            # never raised: this runs on every tick.
            try:
                name = node.metadata.name
                if not isinstance(name, str) or not name:
                    raise TypeError("node without a name")
                ann = node.metadata.annotations or {}
                if not isinstance(ann, dict):
                    ann = {}
                classes = ann.get(self.ann_admissible) or ""
                for t in self._taints(node):
                    if self._ours(t, "NoSchedule"):
                        held.add(action_key(Verb.DRAIN, name))
                    elif self._ours(t, "PreferNoSchedule"):
                        held.add(action_key(Verb.LABEL_DEGRADED, name, value=str(classes)))
            except (AttributeError, TypeError, ValueError):
                skipped += 1
        if skipped:
            log.warning("kubernetes: %d node object(s) without a usable name or taints skipped", skipped)
        return held

    # ---- request bodies (pure, so tests can read them) --------------------------------------
    def _taint_body(self, node: Any, add: dict | None, remove_effect: str | None) -> list[dict]:
        keep = [{"key": t.key, "value": t.value, "effect": t.effect,
                 **({"timeAdded": t.time_added} if getattr(t, "time_added", None) else {})}
                for t in self._taints(node)
                if not (self._ours(t, remove_effect) or (add and self._ours(t, add["effect"])))]
        return keep + ([add] if add else [])

    def _condition(self, healthy: bool, reason: str, message: str) -> dict:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"type": self.cfg.condition_type, "status": "True" if healthy else "False", "reason": reason,
                "message": message[:1024], "lastHeartbeatTime": now, "lastTransitionTime": now}

    def drain_patch(self, node: Any, action: Action) -> dict:
        already = bool(node.spec is not None and node.spec.unschedulable)
        ann = node.metadata.annotations or {}
        body: dict[str, Any] = {"spec": {"taints": self._taint_body(
            node, {"key": self.cfg.taint_key, "value": "quarantine", "effect": "NoSchedule"}, None)}}
        if not already:
            body["spec"]["unschedulable"] = True
            body["metadata"] = {"annotations": {self.ann_cordoned: "true"}}
        elif ann.get(self.ann_cordoned) == "true":
            pass  # cordoned by us before: ownership stays
        return body

    def undrain_patch(self, node: Any) -> dict:
        ann = node.metadata.annotations or {}
        body: dict[str, Any] = {"spec": {"taints": self._taint_body(node, None, "NoSchedule")}}
        if ann.get(self.ann_cordoned) == "true":
            body["spec"]["unschedulable"] = False
            body["metadata"] = {"annotations": {self.ann_cordoned: None}}  # null deletes in a merge patch
        return body

    def label_patch(self, node: Any, classes: str | None) -> dict:
        add = None if classes is None else {"key": self.cfg.taint_key, "value": "degraded",
                                            "effect": "PreferNoSchedule"}
        return {"metadata": {"annotations": {self.ann_admissible: classes}},
                "spec": {"taints": self._taint_body(node, add, "PreferNoSchedule")}}

    # ---- Actuator protocol ----------------------------------------------------------------------
    def _call(self, what: str, fn, *args: Any, **kw: Any) -> ActionResult | None:
        try:
            fn(*args, _request_timeout=self.cfg.request_timeout_s, **kw)
        except Exception as e:  # ApiException, urllib3 errors: sort by status
            status = getattr(e, "status", None)
            retry = status is None or status in (409, 429) or (isinstance(status, int) and status >= 500)
            return ActionResult(False, f"{what} failed ({status or type(e).__name__}): "
                                       f"{getattr(e, 'reason', '') or e}", retryable=retry)
        return None

    def _read(self, name: str) -> tuple[Any, ActionResult | None]:
        try:
            return self.api.read_node(name, _request_timeout=self.cfg.request_timeout_s), None
        except Exception as e:
            status = getattr(e, "status", None)
            return None, ActionResult(False, f"read node {name} failed ({status or type(e).__name__})",
                                      retryable=status != 404)

    def apply(self, action: Action) -> ActionResult:
        node, err = self._read(action.target)
        if err:
            return err
        if action.verb == Verb.DRAIN:
            body = self.drain_patch(node, action)
            cond = self._condition(False, "Quarantine", action.reason)
        elif action.verb == Verb.LABEL_DEGRADED:
            body = self.label_patch(node, action.param("classes"))
            cond = self._condition(False, "Degraded", action.reason)
        else:
            return ActionResult(False, f"kubernetes actuator does not handle {action.verb.value}")
        err = self._call("patch node", self.api.patch_node, action.target, body) or \
            self._call("patch node status", self.api.patch_node_status, action.target,
                       {"status": {"conditions": [cond]}})
        if err:
            return err
        owned = "cordoned" if body["spec"].get("unschedulable") else "tainted (cordon left to its owner)"
        return ActionResult(True, owned if action.verb == Verb.DRAIN else "tainted degraded")

    def revert(self, key: str) -> ActionResult:
        verb = verb_of(key)
        target = ActionKey.parse(key).entity
        node, err = self._read(target)
        if err:
            return err
        if verb == Verb.DRAIN:
            body = self.undrain_patch(node)
        elif verb == Verb.LABEL_DEGRADED:
            body = self.label_patch(node, None)
        else:
            return ActionResult(False, f"kubernetes actuator does not handle {verb.value}")
        cond = self._condition(True, "Recovered", f"seamguard: {verb.value} reverted")
        err = self._call("patch node", self.api.patch_node, target, body) or \
            self._call("patch node status", self.api.patch_node_status, target, {"status": {"conditions": [cond]}})
        return err or ActionResult(True, "uncordoned" if body["spec"].get("unschedulable") is False else "untainted")
