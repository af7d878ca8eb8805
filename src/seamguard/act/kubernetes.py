"""The Kubernetes actuator: cordon, taints, a node condition and pod eviction via the official client.

Follows NVSentinel's split (github.com/NVIDIA/NVSentinel; docs/sources.md §2): the taint says "is it bad"
(`seamguard.io/state=quarantine:NoSchedule`, `seamguard.io/state=degraded:PreferNoSchedule`),
the condition says why (type `SeamguardHealthy`, reason, message, lastTransitionTime),
and cordon (`spec.unschedulable`) keeps new pods off a quarantined node. Ownership is
written on the node as annotations, so the actuator never uncordons a node it did not
cordon and `observe()` reads its own actions back from the API server (level-triggered).

A quarantine also evacuates the node (``evict_pods``): every pod on it that a drain
would move (not a DaemonSet's, not a mirror pod, not finished, not in
``eviction_skip_namespaces``) is evicted through the Eviction API (policy/v1
`Eviction`, `create_namespaced_pod_eviction`), never deleted, so PodDisruptionBudgets
hold: the API answers 429 while a budget forbids the disruption, and the actuator reports
that as a retryable failure and tries again next tick. A drain counts as in effect only
once no such pod is left on the node (pods already terminating are left to finish), so
the reconciler keeps asking until the node is empty (level-triggered).

Not integration-tested against a real API server (none can run on the build machines);
the tests check the exact request bodies against a recorder standing in for CoreV1Api.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from seamguard.act.base import ActionResult, label_value, verb_of
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
    evict_pods: bool = Field(True, description="a quarantine also evicts the node's pods (Eviction API, "
                                               "PodDisruptionBudgets respected); false: cordon and taint only")
    eviction_skip_namespaces: tuple[str, ...] = Field(("kube-system",),
                                                      description="pods in these namespaces are never evicted")
    eviction_grace_s: int | None = Field(None, ge=0, description="termination grace of evicted pods "
                                                                 "(None: each pod's own)")


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
        tainted: list[str] = []
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
                        tainted.append(name)
                    elif self._ours(t, "PreferNoSchedule"):
                        held.add(action_key(Verb.LABEL_DEGRADED, name, value=label_value(str(classes).split(","))))
            except (AttributeError, TypeError, ValueError):
                skipped += 1
        if skipped:
            log.warning("kubernetes: %d node object(s) without a usable name or taints skipped", skipped)
        # a drain is in effect once its node is evacuated (an API error here fails the tick, as list_node's does)
        held |= {action_key(Verb.DRAIN, n) for n in tainted if not (self.cfg.evict_pods and self.evictable(n))}
        return held

    # ---- eviction ---------------------------------------------------------------------------
    def _must_leave(self, pod: Any) -> bool:
        """Whether a drain moves this pod: not a DaemonSet's, not a mirror pod, not finished, not exempt."""
        meta, status = pod.metadata, getattr(pod, "status", None)
        if meta.namespace in self.cfg.eviction_skip_namespaces or getattr(meta, "deletion_timestamp", None):
            return False  # exempt, or already terminating (evicted before: left to finish)
        if getattr(status, "phase", None) in ("Succeeded", "Failed"):
            return False
        if "kubernetes.io/config.mirror" in (meta.annotations or {}):
            return False  # a static pod: the kubelet owns it, the API cannot evict it
        return not any(getattr(o, "kind", None) == "DaemonSet" for o in (meta.owner_references or []))

    def evictable(self, node: str) -> list[Any]:
        """Pods on ``node`` a drain still has to evict (raises what the API raises)."""
        pods = self.api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                    _request_timeout=self.cfg.request_timeout_s)
        return [p for p in getattr(pods, "items", None) or [] if self._must_leave(p)]

    def eviction_body(self, pod: Any) -> Any:
        from kubernetes.client import V1DeleteOptions, V1Eviction, V1ObjectMeta

        opts = None if self.cfg.eviction_grace_s is None else V1DeleteOptions(
            grace_period_seconds=self.cfg.eviction_grace_s)
        return V1Eviction(metadata=V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace),
                          delete_options=opts)

    def evict(self, node: str) -> ActionResult:
        """Evict every pod a drain moves off ``node``; a PodDisruptionBudget's 429 is retried next tick."""
        try:
            pods = self.evictable(node)
        except Exception as e:
            status = getattr(e, "status", None)
            return ActionResult(False, f"list pods on {node} failed ({status or type(e).__name__})", retryable=True)
        evicted, blocked, failed = [], [], []
        for p in pods:
            name = f"{p.metadata.namespace}/{p.metadata.name}"
            try:
                self.api.create_namespaced_pod_eviction(p.metadata.name, p.metadata.namespace, self.eviction_body(p),
                                                        _request_timeout=self.cfg.request_timeout_s)
                evicted.append(name)
            except Exception as e:
                status = getattr(e, "status", None)
                if status == 404:
                    evicted.append(name)  # gone meanwhile
                elif status == 429:
                    blocked.append(name)
                else:
                    failed.append((name, status, e))
        parts = [f"evicted {len(evicted)} pod(s)" + (f": {', '.join(evicted[:5])}" if evicted else "")]
        if blocked:
            parts.append(f"blocked by a PodDisruptionBudget (429), retried next tick: {', '.join(blocked[:5])}")
        for name, status, e in failed[:3]:
            parts.append(f"eviction of {name} failed ({status or type(e).__name__}): {getattr(e, 'reason', '') or e}")
        retry = all(st is None or st in (409, 429) or (isinstance(st, int) and st >= 500) for _, st, _ in failed)
        return ActionResult(not blocked and not failed, "; ".join(parts), retryable=retry)

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
            if any(self._ours(t, "NoSchedule") for t in self._taints(node)):
                # tainted before: what is left of the drain is the evacuation
                return self.evict(action.target) if self.cfg.evict_pods else ActionResult(True, "already tainted")
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
        if action.verb != Verb.DRAIN:
            return ActionResult(True, "tainted degraded")
        if not self.cfg.evict_pods:
            return ActionResult(True, owned)
        ev = self.evict(action.target)
        return ActionResult(ev.ok, f"{owned}; {ev.detail}", ev.retryable)

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
