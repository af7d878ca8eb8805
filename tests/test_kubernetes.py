"""Request bodies of the Kubernetes actuator.

NOT an integration test: no API server can run on the build machines. CoreV1Api is
replaced by a recorder holding real `kubernetes.client.V1Node` objects, and the tests
check the exact patches the actuator would send (docs/kubernetes.md says so).
"""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes.client import (
    V1Eviction,
    V1Node,
    V1NodeList,
    V1NodeSpec,
    V1ObjectMeta,
    V1OwnerReference,
    V1Pod,
    V1PodList,
    V1PodSpec,
    V1PodStatus,
    V1Taint,
)
from kubernetes.client.exceptions import ApiException

from seamguard.act.kubernetes import KubernetesActuator, KubernetesConfig
from seamguard.act.reconcile import reconcile
from seamguard.decide.actions import Action, Decisions, Verb, action_key


class Recorder:
    """CoreV1Api as far as the actuator uses it. Eviction follows the API server's rule: a pod
    covered by a PodDisruptionBudget with no disruption allowed answers 429; otherwise the
    pod starts terminating (deletionTimestamp) and the budget allows one fewer."""

    def __init__(self, nodes: dict[str, V1Node], pods: list[V1Pod] = (), pdbs: list[dict] = ()):
        self.nodes = nodes
        self.pods = list(pods)
        self.pdbs = [dict(b) for b in pdbs]  # {namespace, match: {label: value}, allowed: int}
        self.calls: list[tuple[str, str, dict]] = []

    def list_node(self, **kw):
        assert "_request_timeout" in kw
        return V1NodeList(items=list(self.nodes.values()))

    def list_pod_for_all_namespaces(self, field_selector=None, _request_timeout=None):
        assert _request_timeout and field_selector.startswith("spec.nodeName=")
        node = field_selector.partition("=")[2]
        return V1PodList(items=[p for p in self.pods if p.spec.node_name == node])

    def create_namespaced_pod_eviction(self, name, namespace, body, _request_timeout=None):
        assert _request_timeout and isinstance(body, V1Eviction)
        assert (body.metadata.name, body.metadata.namespace) == (name, namespace)
        self.calls.append(("evict", f"{namespace}/{name}", body))
        pod = next((p for p in self.pods if (p.metadata.name, p.metadata.namespace) == (name, namespace)), None)
        if pod is None:
            raise ApiException(status=404, reason="Not Found")
        labels = pod.metadata.labels or {}
        for b in self.pdbs:
            if b["namespace"] == namespace and all(labels.get(k) == v for k, v in b["match"].items()):
                if b["allowed"] <= 0:
                    raise ApiException(status=429, reason="Too Many Requests")
                b["allowed"] -= 1
        pod.metadata.deletion_timestamp = datetime.now(UTC)

    def finish_terminating(self):
        """The kubelet finishes what was evicted: terminating pods disappear."""
        self.pods = [p for p in self.pods if p.metadata.deletion_timestamp is None]

    def read_node(self, name, _request_timeout=None):
        assert _request_timeout
        return self.nodes[name]

    def patch_node(self, name, body, _request_timeout=None):
        assert _request_timeout
        self.calls.append(("patch_node", name, body))
        n = self.nodes[name]  # apply the parts the actuator reads back
        if "unschedulable" in body.get("spec", {}):
            n.spec.unschedulable = body["spec"]["unschedulable"]
        if "taints" in body.get("spec", {}):
            n.spec.taints = [V1Taint(key=t["key"], value=t["value"], effect=t["effect"]) for t in body["spec"]["taints"]]
        for k, v in body.get("metadata", {}).get("annotations", {}).items():
            n.metadata.annotations = n.metadata.annotations or {}
            if v is None:
                n.metadata.annotations.pop(k, None)
            else:
                n.metadata.annotations[k] = v

    def patch_node_status(self, name, body, _request_timeout=None):
        self.calls.append(("patch_node_status", name, body))


def node(name, unschedulable=None, taints=None, annotations=None):
    return V1Node(metadata=V1ObjectMeta(name=name, annotations=annotations),
                  spec=V1NodeSpec(unschedulable=unschedulable, taints=taints))


def drain(name):
    return Action(key=action_key(Verb.DRAIN, name), verb=Verb.DRAIN, target=name, target_kind="node",
                  reason="seamguard: quarantine gpu0:compute_excess=0.6")


def test_quarantine_cordons_taints_and_sets_condition():
    api = Recorder({"n1": node("n1", taints=[V1Taint(key="other", value="x", effect="NoExecute")])})
    k = KubernetesActuator(api=api)
    assert k.apply(drain("n1")).ok
    (_, _, body), (_, _, status) = api.calls
    assert body["spec"]["unschedulable"] is True
    assert body["metadata"]["annotations"] == {"seamguard.io/cordoned": "true"}
    assert body["spec"]["taints"] == [{"key": "other", "value": "x", "effect": "NoExecute"},
                                      {"key": "seamguard.io/state", "value": "quarantine", "effect": "NoSchedule"}]
    cond = status["status"]["conditions"][0]
    assert cond["type"] == "SeamguardHealthy" and cond["status"] == "False" and cond["reason"] == "Quarantine"
    assert "compute_excess" in cond["message"] and cond["lastTransitionTime"].endswith("Z")
    assert k.observe() == {"drain:n1"}
    api.calls.clear()
    assert k.revert("drain:n1").ok
    body = api.calls[0][2]
    assert body["spec"]["unschedulable"] is False
    assert body["spec"]["taints"] == [{"key": "other", "value": "x", "effect": "NoExecute"}]
    assert body["metadata"]["annotations"] == {"seamguard.io/cordoned": None}
    assert api.calls[1][2]["status"]["conditions"][0]["status"] == "True"


def test_never_uncordons_a_node_someone_else_cordoned():
    api = Recorder({"n2": node("n2", unschedulable=True)})
    k = KubernetesActuator(api=api)
    assert k.apply(drain("n2")).ok
    body = api.calls[0][2]
    assert "unschedulable" not in body["spec"] and "metadata" not in body  # no ownership claimed
    api.calls.clear()
    assert k.revert("drain:n2").ok
    body = api.calls[0][2]
    assert "unschedulable" not in body["spec"]  # the cordon stays; only our taint goes
    assert api.nodes["n2"].spec.unschedulable is True


def test_degraded_gets_prefer_no_schedule_and_admissible_classes():
    api = Recorder({"n3": node("n3")})
    k = KubernetesActuator(api=api)
    classes = "async_batch_inference,checkpoint_restore"
    key = action_key(Verb.LABEL_DEGRADED, f"n3={classes}")
    act = Action(key=key, verb=Verb.LABEL_DEGRADED, target="n3", target_kind="node",
                 params=(("classes", classes),), reason="seamguard: degraded")
    assert k.apply(act).ok
    body = api.calls[0][2]
    assert body["spec"]["taints"] == [{"key": "seamguard.io/state", "value": "degraded",
                                       "effect": "PreferNoSchedule"}]
    assert "unschedulable" not in body["spec"]
    assert k.observe() == {key}
    assert k.revert(key).ok and api.nodes["n3"].spec.taints == []


def test_api_errors_are_sorted_retryable_or_not():
    class Boom(Recorder):
        def patch_node(self, name, body, _request_timeout=None):
            e = Exception("conflict")
            e.status, e.reason = 409, "Conflict"
            raise e

    k = KubernetesActuator(api=Boom({"n4": node("n4")}))
    res = k.apply(drain("n4"))
    assert not res.ok and res.retryable and "409" in res.detail
    res = k.apply(drain("missing"))
    assert not res.ok


def pod(name, node, namespace="default", owner="ReplicaSet", labels=None, phase="Running", annotations=None):
    return V1Pod(metadata=V1ObjectMeta(name=name, namespace=namespace, labels=labels, annotations=annotations,
                                       owner_references=[V1OwnerReference(api_version="apps/v1", kind=owner,
                                                                          name=f"{name}-owner", uid="u")]),
                 spec=V1PodSpec(node_name=node, containers=[]), status=V1PodStatus(phase=phase))


def test_quarantine_evicts_the_pods_a_drain_moves_and_only_those():
    pods = [pod("trainer-0", "n5"), pod("agent", "n5", owner="DaemonSet"),
            pod("static", "n5", annotations={"kubernetes.io/config.mirror": "x"}),
            pod("dns", "n5", namespace="kube-system"), pod("done", "n5", phase="Succeeded"),
            pod("elsewhere", "n6")]
    api = Recorder({"n5": node("n5"), "n6": node("n6")}, pods)
    k = KubernetesActuator(KubernetesConfig(eviction_grace_s=30), api=api)
    res = k.apply(drain("n5"))
    assert res.ok and "cordoned; evicted 1 pod(s): default/trainer-0" in res.detail, res.detail
    evictions = [c for c in api.calls if c[0] == "evict"]
    assert [c[1] for c in evictions] == ["default/trainer-0"]
    assert evictions[0][2].delete_options.grace_period_seconds == 30
    # terminating pods are left to finish: the drain is in effect
    assert k.observe() == {"drain:n5"}


def test_a_disruption_budget_blocks_eviction_and_it_is_retried_never_deleted():
    pods = [pod(f"web-{i}", "n7", labels={"app": "web"}) for i in range(2)]
    api = Recorder({"n7": node("n7")}, pods, pdbs=[{"namespace": "default", "match": {"app": "web"}, "allowed": 1}])
    k = KubernetesActuator(api=api)
    act = drain("n7")
    changes = reconcile(Decisions(t_s=0.0, desired={act.key: act}), [k], None, tick=1, enforce=True)
    (ch,) = changes
    assert ch.status == "failed" and "PodDisruptionBudget (429)" in ch.detail and "default/web-1" in ch.detail
    assert api.nodes["n7"].spec.unschedulable is True  # cordoned all the same
    assert k.observe() == set()  # a pod that must leave is still there: not in effect
    assert not any(c[0].startswith("delete") for c in api.calls)
    # The first pod terminates and its replacement runs elsewhere; the budget allows one again.
    api.finish_terminating()
    api.pdbs[0]["allowed"] = 1
    api.calls.clear()
    (ch,) = reconcile(Decisions(t_s=15.0, desired={act.key: act}), [k], None, tick=2, enforce=True)
    assert ch.status == "done" and ch.detail == "evicted 1 pod(s): default/web-1"
    assert [c[0] for c in api.calls] == ["evict"]  # tainted already: no second patch, only the evacuation
    assert k.observe() == {"drain:n7"}
    assert reconcile(Decisions(t_s=30.0, desired={act.key: act}), [k], None, tick=3, enforce=True) == []


def test_eviction_can_be_switched_off():
    api = Recorder({"n8": node("n8")}, [pod("trainer-0", "n8")])
    k = KubernetesActuator(KubernetesConfig(evict_pods=False), api=api)
    assert k.apply(drain("n8")).detail == "cordoned"
    assert k.observe() == {"drain:n8"} and not [c for c in api.calls if c[0] == "evict"]


def test_other_eviction_errors_are_sorted():
    class Forbidden(Recorder):
        def create_namespaced_pod_eviction(self, name, namespace, body, _request_timeout=None):
            raise ApiException(status=403, reason="Forbidden")

    res = KubernetesActuator(api=Forbidden({"n9": node("n9")}, [pod("p", "n9")])).apply(drain("n9"))
    assert not res.ok and not res.retryable and "eviction of default/p failed (403): Forbidden" in res.detail


def test_degraded_for_no_job_class_reads_back_as_the_planners_key():
    api = Recorder({"n10": node("n10")})
    k = KubernetesActuator(api=api)
    key = action_key(Verb.LABEL_DEGRADED, "n10", value="none")
    # what the planner sends for a node that may take no job class: only checkpoint_restore admissible
    act = Action(key=key, verb=Verb.LABEL_DEGRADED, target="n10", target_kind="node",
                 params=(("classes", "checkpoint_restore"),),
                 reason="seamguard: no new work")
    assert k.apply(act).ok and k.observe() == {key}
