"""Request bodies of the Kubernetes actuator.

NOT an integration test: no API server can run on the build machines. CoreV1Api is
replaced by a recorder holding real `kubernetes.client.V1Node` objects, and the tests
check the exact patches the actuator would send (docs/kubernetes.md says so).
"""

from __future__ import annotations

from kubernetes.client import V1Node, V1NodeList, V1NodeSpec, V1ObjectMeta, V1Taint

from seamguard.act.kubernetes import KubernetesActuator
from seamguard.decide.actions import Action, Verb, action_key


class Recorder:
    def __init__(self, nodes: dict[str, V1Node]):
        self.nodes = nodes
        self.calls: list[tuple[str, str, dict]] = []

    def list_node(self, **kw):
        assert "_request_timeout" in kw
        return V1NodeList(items=list(self.nodes.values()))

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
