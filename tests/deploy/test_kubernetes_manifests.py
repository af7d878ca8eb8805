"""deploy/kubernetes: valid against the Kubernetes API schema, and RBAC exactly as the actuator needs.

No API server runs here, so the manifests are checked offline: every object against the
OpenAPI schema kubernetes-validate ships (strict: an unknown field fails), for the oldest
and newest Kubernetes this is checked for. The ClusterRole is checked against the calls
src/seamguard/act/kubernetes.py makes: each ``self.api.<method>`` it names is resolved, in
the kubernetes client's own request serializer, to its HTTP method and path, hence to
(API group, resource, verb); the role grants exactly that set, no more, no less.
"""

import ast
import inspect
import re
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")
client = pytest.importorskip("kubernetes.client")

from seamguard.app.config import load_run_config  # noqa: E402
from seamguard.fleet.topology import parse_topology  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
ACTUATOR = ROOT / "src" / "seamguard" / "act" / "kubernetes.py"
VERSIONS = ("1.29.0", "1.37.0")


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _all() -> list[dict]:
    return [d for p in MANIFESTS for d in _docs(p)]


def _one(kind: str, name: str) -> dict:
    found = [d for d in _all() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_manifest_validates_against_the_api_schema(path, version):
    for doc in _docs(path):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_can_fail():
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "two", "selector": {}, "template": {"spec": {"containers": []}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


# ---- RBAC: the actuator's calls -> (group, resource, verb) ---------------------------------------

def api_calls(source: str) -> tuple[set[str], set[str]]:
    """(client API classes it connects to, method names it uses on ``self.api``), from the source."""
    tree = ast.parse(source)
    classes = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and isinstance(n.func.value, ast.Name) and n.func.value.id == "client"
               and n.func.attr.endswith("Api")}
    methods = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
               and n.value.attr == "api" and isinstance(n.value.value, ast.Name) and n.value.value.id == "self"}
    return classes, methods


def permission(api_class: type, method: str) -> tuple[str, str, str]:
    """(API group, resource[/subresource], RBAC verb) of one client method, from its request serializer."""
    src = inspect.getsource(getattr(api_class, f"_{method}_serialize"))
    http = re.search(r"method='(\w+)'", src).group(1)
    path = re.search(r"resource_path='([^']+)'", src).group(1)
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]  # namespaces/{namespace}/<resource>...
    resource, named, sub = rest[0], len(rest) > 1, rest[2:]
    verb = {"GET": "get" if named else "list", "POST": "create", "PATCH": "patch", "PUT": "update",
            "DELETE": "delete" if named else "deletecollection"}[http]
    return group, "/".join([resource, *sub]), verb


def granted(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_permission_reads_the_clients_paths():
    core = client.CoreV1Api
    assert permission(core, "list_node") == ("", "nodes", "list")
    assert permission(core, "read_node") == ("", "nodes", "get")
    assert permission(core, "patch_node_status") == ("", "nodes/status", "patch")
    assert permission(core, "create_namespaced_pod_eviction") == ("", "pods/eviction", "create")
    assert permission(core, "delete_namespaced_pod") == ("", "pods", "delete")
    assert permission(client.AppsV1Api, "list_namespaced_daemon_set") == ("apps", "daemonsets", "list")


def test_cluster_role_grants_exactly_what_the_actuator_calls():
    classes, methods = api_calls(ACTUATOR.read_text())
    assert classes == {"CoreV1Api"} and methods, (classes, methods)
    needed = {permission(getattr(client, c), m) for c in classes for m in methods}
    role = _one("ClusterRole", "seamguard-controller")
    assert granted(role) == needed
    assert not any("*" in x for rule in role["rules"] for x in rule["apiGroups"] + rule["resources"] + rule["verbs"])


def test_a_new_call_in_the_actuator_would_fail_the_rbac_check():
    src = ACTUATOR.read_text() + "\n\ndef _x(self):\n    self.api.delete_namespaced_pod('p', 'ns')\n"
    _, methods = api_calls(src)
    needed = {permission(client.CoreV1Api, m) for m in methods}
    assert ("", "pods", "delete") in needed - granted(_one("ClusterRole", "seamguard-controller"))


def test_the_role_is_bound_to_the_controllers_service_account():
    dep = _one("Deployment", "seamguard-controller")
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    ns = dep["metadata"]["namespace"]
    assert _one("ServiceAccount", sa)["metadata"]["namespace"] == ns
    binding = _one("ClusterRoleBinding", "seamguard-controller")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "seamguard-controller"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]


# ---- the controller's Deployment and what goes with it -------------------------------------------

def _pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_controller_runs_two_replicas_on_a_shared_ledger_led_by_a_lease(tmp_path):
    dep = _one("Deployment", "seamguard-controller")
    assert dep["spec"]["replicas"] >= 2
    cm = _one("ConfigMap", "seamguard-controller")
    (tmp_path / "run.yaml").write_text(cm["data"]["run.yaml"].replace("__POD_NAME__", "seamguard-controller-abc"))
    cfg = load_run_config(tmp_path / "run.yaml")
    assert cfg.ha is not None and cfg.ha.name == "seamguard-controller-abc"
    assert str(cfg.ledger).startswith("postgresql://"), "replicas share the ledger"
    assert [a.type for a in cfg.actuators] == ["kubernetes"]
    assert str(cfg.topology) == "/etc/seamguard/topology.yaml" and "topology.yaml" in cm["data"]
    parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]), "topology.yaml")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    script = " ".join(c["args"])
    assert "__POD_NAME__" in script and "${POD_NAME}" in script, "each replica its own ha.name"
    assert "seamguard serve --config" in script and "--port 8642" in script
    assert {"name": "http", "containerPort": 8642} in c["ports"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname" and _selects(anti["labelSelector"], _pod_labels(dep))


def test_budget_policy_and_service_select_the_controller():
    labels = _pod_labels(_one("Deployment", "seamguard-controller"))
    pdb = _one("PodDisruptionBudget", "seamguard-controller")
    assert _selects(pdb["spec"]["selector"], labels) and pdb["spec"]["minAvailable"] == 1
    np_ = _one("NetworkPolicy", "seamguard-controller")
    assert _selects(np_["spec"]["podSelector"], labels)
    assert set(np_["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert all(labels.get(k) == v for k, v in _one("Service", "seamguard-controller")["spec"]["selector"].items())


@pytest.mark.parametrize("kind, name", [("Deployment", "seamguard-controller"), ("DaemonSet", "seamguard-agent")])
def test_containers_drop_privilege(kind, name):
    pod = _one(kind, name)["spec"]["template"]["spec"]
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(sc["capabilities"].get("add", [])) <= {"SYSLOG"}
    if kind == "Deployment":
        assert pod["securityContext"]["runAsNonRoot"] is True
    else:
        assert pod["automountServiceAccountToken"] is False, "the agent never talks to the API server"
