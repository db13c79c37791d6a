"""Every manifest under deploy/ validates against the Kubernetes schemas (or, for OpenShift-only
kinds, has the structure OpenShift requires), and grants only what Tangram needs.

deploy/kubernetes/ and deploy/openshift/ are rendered from the Helm chart (deploy/helm/, whose
templates and values are checked in test_helm_chart.py); these tests read the rendered files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
OPENSHIFT_KINDS = {("security.openshift.io/v1", "SecurityContextConstraints")}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if DEPLOY / "helm" in path.parents or path.name == "kustomization.yaml":
            continue
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document is not None:
                found.append((f"{path.relative_to(ROOT)}#{index}", document))
    return found


DOCUMENTS = _documents()
KUBERNETES = [(name, d) for name, d in DOCUMENTS if (d["apiVersion"], d["kind"]) not in OPENSHIFT_KINDS]
OPENSHIFT = [(name, d) for name, d in DOCUMENTS if (d["apiVersion"], d["kind"]) in OPENSHIFT_KINDS]


def _by_kind(kind: str, name: str) -> dict[str, Any]:
    matches = [d for _, d in DOCUMENTS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def test_the_expected_objects_are_shipped() -> None:
    kinds = sorted({f"{d['kind']}/{d['metadata']['name']}" for _, d in DOCUMENTS})
    for expected in [
        "Namespace/tangram",
        "ServiceAccount/tangram-allocator",
        "ServiceAccount/tangram-node",
        "ClusterRole/tangram-node",
        "Deployment/tangram-allocator",
        "Deployment/tangram-authcallout",
        "ClusterRole/tangram-authcallout",
        "DaemonSet/tangram-node",
        "StatefulSet/tangram-nats",
        "Job/tangram-nats-streams",
        "DeviceClass/gpu.tangram.dev",
        "DeviceClass/mig.gpu.tangram.dev",
        "DeviceClass/shared.gpu.tangram.dev",
        "SecurityContextConstraints/tangram-node",
        "ValidatingAdmissionPolicy/tangram-resourceslices-own-node",
        "ValidatingAdmissionPolicy/tangram-resourceclaim-status-own-node",
    ]:
        assert expected in kinds


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "document"), KUBERNETES, ids=[name for name, _ in KUBERNETES])
def test_manifest_validates_strictly(name: str, document: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize(("name", "scc"), OPENSHIFT, ids=[name for name, _ in OPENSHIFT])
def test_security_context_constraints_structure(name: str, scc: dict[str, Any]) -> None:
    # The fields OpenShift's API requires, with the types it accepts.
    assert scc["metadata"]["name"]
    for strategy in ("runAsUser", "seLinuxContext", "fsGroup", "supplementalGroups"):
        assert isinstance(scc[strategy]["type"], str)
    for flag in ("allowPrivilegedContainer", "allowHostDirVolumePlugin", "allowHostNetwork", "allowHostPID"):
        assert isinstance(scc[flag], bool)
    assert isinstance(scc["readOnlyRootFilesystem"], bool)
    assert set(scc["volumes"]) <= {
        "hostPath",
        "secret",
        "projected",
        "emptyDir",
        "downwardAPI",
        "configMap",
        "persistentVolumeClaim",
    }
    # Granted by RBAC "use", never through broad SCC user or group lists.
    assert scc["users"] == [] and scc["groups"] == []
    assert scc["allowHostNetwork"] is False and scc["allowHostPID"] is False and scc["allowHostIPC"] is False


def test_the_node_scc_is_usable_only_by_the_node_service_account() -> None:
    role = _by_kind("ClusterRole", "tangram-node-scc")
    assert role["rules"] == [
        {
            "apiGroups": ["security.openshift.io"],
            "resources": ["securitycontextconstraints"],
            "resourceNames": ["tangram-node"],
            "verbs": ["use"],
        }
    ]
    binding = _by_kind("RoleBinding", "tangram-node-scc")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tangram-node", "namespace": "tangram"}]


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_allocator_rbac_is_what_deciding_claims_needs() -> None:
    # The leader allocator decides the cluster's claims of Tangram's classes: it watches claims,
    # classes and pods, writes allocations, removes its gate from pods and records Events; to
    # preempt, it reads PodDisruptionBudgets and evicts pods through the Eviction API (which
    # honours them); it reads the Workload API's PodGroups (which pods are placed together); for a
    # pod no node could hold, it asks cluster-autoscaler for a node (a
    # ProvisioningRequest and its PodTemplate, deleted once the claim is allocated). It reads no
    # Secret, and creates and deletes nothing else.
    grants = _grants(_by_kind("ClusterRole", "tangram-allocator"))
    assert grants == {
        # from Kubernetes 1.36 an allocation written is also authorized as a claim's binding
        ("resource.k8s.io", "resourceclaims/binding", "update"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("resource.k8s.io", "deviceclasses", "list"),
        ("resource.k8s.io", "deviceclasses", "watch"),
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "pods/eviction", "create"),
        ("policy", "poddisruptionbudgets", "list"),
        ("policy", "poddisruptionbudgets", "watch"),
        ("scheduling.k8s.io", "podgroups", "list"),
        ("scheduling.k8s.io", "podgroups", "watch"),
        ("", "podtemplates", "create"),
        ("", "podtemplates", "delete"),
        ("autoscaling.x-k8s.io", "provisioningrequests", "create"),
        ("autoscaling.x-k8s.io", "provisioningrequests", "delete"),
        ("", "events", "create"),
    }
    binding = _by_kind("ClusterRoleBinding", "tangram-allocator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tangram-allocator", "namespace": "tangram"}
    ]
    rbac = [
        f"{d['kind']}/{d['metadata']['name']}"
        for _, d in DOCUMENTS
        if d["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    ]
    assert [name for name in rbac if "allocator" in name] == [
        "ClusterRole/tangram-allocator",
        "ClusterRoleBinding/tangram-allocator",
        "Role/tangram-allocator",
        "RoleBinding/tangram-allocator",
    ]
    # its Lease, in its own namespace: created, then read and renewed by name only
    role = _by_kind("Role", "tangram-allocator")
    assert role["metadata"]["namespace"] == "tangram"
    assert sorted(
        (rule["apiGroups"], rule["resources"], rule["verbs"], rule.get("resourceNames"))
        for rule in role["rules"]
    ) == [
        (["coordination.k8s.io"], ["leases"], ["create"], None),
        (["coordination.k8s.io"], ["leases"], ["get", "update"], ["tangram-allocator"]),
    ]
    pod = _by_kind("Deployment", "tangram-allocator")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True


def test_node_rbac_is_least_privilege() -> None:
    assert _grants(_by_kind("ClusterRole", "tangram-node")) == {
        ("resource.k8s.io", "resourceslices", verb)
        for verb in ("create", "update", "delete", "get", "list", "watch")
    } | {
        ("", "nodes", "get"),
        ("resource.k8s.io", "resourceclaims", "get"),
        # what cdi prepared, in status.devices: the status subresource, and from 1.36 the
        # per-driver check, for claims allocated on the caller's own node only
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"),
    }


def test_no_role_is_cluster_admin_like() -> None:
    for name, document in DOCUMENTS:
        if document["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in document["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{name}: wildcard {field}"
            if "secrets" in rule["resources"]:
                # only the admission webhook, for its own certificates, in its own namespace: read
                # and renew that one Secret by name; create cannot be bound to a name
                assert document["kind"] == "Role" and document["metadata"]["name"] == "tangram-admission", (
                    name
                )
                assert rule["resources"] == ["secrets"], name
                assert (rule["verbs"], rule.get("resourceNames")) in (
                    (["get", "update"], ["tangram-admission-tls"]),
                    (["create"], None),
                ), f"{name}: reads secrets"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), name
    for name, document in DOCUMENTS:
        if document["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert document["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), name


def _containers(kind: str, name: str) -> dict[str, dict[str, Any]]:
    spec = _by_kind(kind, name)["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def test_only_the_partitioner_is_privileged() -> None:
    privileged = {
        f"{d['kind']}/{c['name']}"
        for _, d in DOCUMENTS
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
        if c.get("securityContext", {}).get("privileged")
    }
    assert privileged == {"DaemonSet/partitioner"}
    for container in _containers("DaemonSet", "tangram-node").values():
        context = container["securityContext"]
        if container["name"] != "partitioner":
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["allowPrivilegeEscalation"] is False
    allocator = _containers("Deployment", "tangram-allocator")["allocator"]
    assert allocator["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_node_pod_mounts_and_placement() -> None:
    daemonset = _by_kind("DaemonSet", "tangram-node")
    spec = daemonset["spec"]["template"]["spec"]
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert {
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/dev",
    } <= host_paths
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["serviceAccountName"] == "tangram-node"
    assert set(_containers("DaemonSet", "tangram-node")) == {"discovery", "partitioner", "cdi"}


def test_allocator_runs_a_leader_and_a_standby_rolled_one_at_a_time() -> None:
    deployment = _by_kind("Deployment", "tangram-allocator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "tangram-allocator"


def test_no_manifest_carries_a_password() -> None:
    for path in DEPLOY.rglob("*.yaml"):
        text = path.read_text().lower()
        assert "password:" not in text and not re.search(r"nats://[^\s/@]*@", text), path


def test_admission_rbac_is_least_privilege() -> None:
    assert _grants(_by_kind("ClusterRole", "tangram-admission")) == {
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaimtemplates", "get"),
        ("resource.k8s.io", "deviceclasses", "get"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch"),
        # the gate timeout: pods holding the gate, their gate lifted, an Event on each
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "events", "create"),
    }
    role = _by_kind("Role", "tangram-admission")
    assert role["metadata"]["namespace"] == "tangram"
    assert _grants(role) == {
        ("", "secrets", "get"),
        ("", "secrets", "update"),
        ("", "secrets", "create"),
        ("coordination.k8s.io", "leases", "get"),  # the allocator's Lease: is it alive?
    }
    spec = _by_kind("Deployment", "tangram-admission")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "tangram-admission"


def test_authcallout_rbac_is_least_privilege() -> None:
    assert _grants(_by_kind("ClusterRole", "tangram-authcallout")) == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("", "pods", "get"),
        ("", "nodes", "list"),
    }
    spec = _by_kind("Deployment", "tangram-authcallout")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "tangram-authcallout"


def test_node_services_get_nats_identity_from_a_projected_token_only() -> None:
    """No hand-placed file: the token the kubelet projects, for the callout's audience, bound to
    the pod; no NATS Secret or host path is mounted into the node pod."""
    spec = _by_kind("DaemonSet", "tangram-node")["spec"]["template"]["spec"]
    callout = _containers("Deployment", "tangram-authcallout")["authcallout"]
    callout_env = {e["name"]: e.get("value") for e in callout["env"]}
    (volume,) = [v for v in spec["volumes"] if v["name"] == "nats-token"]
    (source,) = volume["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == callout_env["TANGRAM_CALLOUT_AUDIENCE"]
    assert callout_env["TANGRAM_CALLOUT_SERVICE_ACCOUNTS"] == f"tangram:{spec['serviceAccountName']}"
    assert token["expirationSeconds"] <= int(callout_env["TANGRAM_CALLOUT_MAX_TTL_S"])
    assert not any("secret" in v or "/etc/tangram" in str(v.get("hostPath")) for v in spec["volumes"])
    for container in spec["containers"]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert env["TANGRAM_NATS_TOKEN_FILE"] == f"{mounts['nats-token']}/{token['path']}", container["name"]
        assert "TANGRAM_NATS_URL_FILE" not in env and "TANGRAM_NATS_CREDENTIALS" not in env


def test_nats_is_a_three_server_cluster_and_every_user_of_it_replicates_streams_three_times() -> None:
    nats = _by_kind("StatefulSet", "tangram-nats")
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["podManagementPolicy"] == "Parallel"
    config = _by_kind("ConfigMap", "tangram-nats-config")["data"]["nats.conf"]
    routes = [f"tangram-nats-{n}.tangram-nats-headless.tangram.svc:6222" for n in range(3)]
    assert all(f"nats-route://{route}" in config for route in routes)
    assert "include ./authorization.conf" in config and "server_name: $POD_NAME" in config
    assert _by_kind("PodDisruptionBudget", "tangram-nats")["spec"]["maxUnavailable"] == 1
    for kind, name in (("Deployment", "tangram-allocator"), ("DaemonSet", "tangram-node")):
        for container in _by_kind(kind, name)["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env.get("TANGRAM_NATS_STREAM_REPLICAS") == "3", (name, container["name"])
    job = _by_kind("Job", "tangram-nats-streams")["spec"]["template"]["spec"]["containers"][0]
    assert "stream_replicas=3" in job["command"][-1]
