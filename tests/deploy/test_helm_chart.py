"""The Helm chart in deploy/helm/tangram, for its default values, OpenShift, an existing NATS and
every switch on: `helm lint --strict` passes; every built-in object `helm template` renders is
strictly valid for Kubernetes 1.34 to 1.37; real 1.34 and 1.37 API servers accept every object
(server-side apply, dry run, strict field validation), the ServiceMonitor and PrometheusRule
included: the Prometheus Operator's own CRDs are installed there, so their openAPIV3Schema
validates them, and a misspelt field, a wrong type or a malformed duration is refused. Only
OpenShift's SecurityContextConstraints, whose CRD comes with OpenShift, is checked by its own
structure alone. The pods are what the services need and no more; and deploy/kubernetes/ is
exactly the chart's render, never a second copy.

Helm comes from `make helm` (built from its Go module, tangram.local.helm), the CRDs from
`make monitoring-crds` (taken from the operator's Go module at a pinned release,
tangram.local.monitoringcrds).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_asyncio.client import CoreV1Api, V1Namespace, V1ObjectMeta

from tangram.kubelet.devicemetrics import INFO_NAME
from tangram.kubernetes.api import call
from tangram.local import helm as chart
from tangram.local import monitoringcrds
from tangram.local.controlplane import Release
from tests.deploy.apiserver import Refused, api_request, api_resources, install_crds
from tests.deploy.settingsenv import settings_env_vars
from tests.support.driver import DRIVER

ROOT = Path(__file__).resolve().parents[2]
HELM_DIR = ROOT / "deploy" / "helm"
VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
VALUE_SETS: dict[str, list[Path]] = {
    "default": [],
    "openshift": [HELM_DIR / "openshift-values.yaml"],
    "existing-nats": [HELM_DIR / "existing-nats-values.yaml"],
}
# Every optional object on, and the switches that change pod specs flipped.
EVERYTHING = {
    "namespace.create": "true",
    "metrics.serviceMonitor.enabled": "true",
    "metrics.prometheusRule.enabled": "true",
    "grafana.dashboard.enabled": "true",
    "openshift.enabled": "true",
    "nats.tls.caConfigMap": "nats-ca",
}
# Value sets made of settings on top of value files: every optional object on, and an existing
# NATS whose node users the auth callout issues.
SETTINGS: dict[str, tuple[list[Path], dict[str, str]]] = {
    "everything": ([], EVERYTHING),
    "existing-nats-callout": (
        VALUE_SETS["existing-nats"],
        {"nats.authCallout.enabled": "true", "nats.url": "tls://nats.messaging.svc:4222"},
    ),
    # the scheduling gate from a MutatingAdmissionPolicy instead of the webhook
    "admission-policy": ([], {"admission.mode": "policy"}),
    # IMEX daemons for NVLink domains (GB200 NVL), on OpenShift too
    "imex": ([], {"node.imex.enabled": "true", "openshift.enabled": "true"}),
}
ALL_SETS = [*VALUE_SETS, *SETTINGS]
# The value sets whose node users come from the auth callout (the others: static url files).
CALLOUT_SETS = {"default", "openshift", "everything", "existing-nats-callout", "admission-policy", "imex"}
IMEX_SETS = {"imex"}
# What IMEX adds on the host: the daemons' configs and the channel device nodes.
IMEX_HOST_PATHS = {"/run/tangram/imex", "/dev/nvidia-caps-imex-channels"}
# The value sets that run the admission webhook (the others: the policy).
WEBHOOK_SETS = set(ALL_SETS) - {"admission-policy"}
# Custom resources: Kubernetes' own schemas do not know them.
CRD_KINDS = {
    ("security.openshift.io/v1", "SecurityContextConstraints"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
# The custom resources whose CRDs (the Prometheus Operator's, tangram.local.monitoringcrds) the
# API server tests install, so the API server validates them like any built-in object. The SCC's
# CRD comes with OpenShift only.
MONITORING_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
UNSERVED_KINDS = CRD_KINDS - MONITORING_KINDS
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")
NODE_HOST_PATHS = {
    "/dev",
    "/var/lib/kubelet/plugins",
    "/var/lib/kubelet/plugins_registry",
    "/var/run/cdi",
    "/",
    "/run/tangram/mps",  # the MPS control daemons' pipe and log directories
}
# Where node provisioning places each node's url file (static node users only).
NODE_URL_DIR = "/etc/tangram/nats"


def _values(value_set: str) -> tuple[list[Path], dict[str, str]]:
    if value_set in SETTINGS:
        return SETTINGS[value_set]
    return VALUE_SETS[value_set], {}


@pytest.fixture(scope="module")
def helm() -> Path:
    # not built: fails here with "run `make helm`" (make test builds it first)
    path = chart.find_binary()
    assert path.exists(), f"{path} missing: run `make helm`"
    return path


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def rendered(helm: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: _objects(chart.template(*_values(name), binary=helm)) for name in ALL_SETS}


def _one(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    name = f"tangram-{suffix}" if suffix else "tangram"
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def _containers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod(obj)["containers"]}


# --- lint and schema -------------------------------------------------------------------------


def test_helm_is_the_pinned_release(helm: Path) -> None:
    assert chart.version(binary=helm) == chart.HELM_VERSION == "v3.19.0"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("value_set", ALL_SETS)
def test_helm_lint_is_clean(helm: Path, value_set: str, version: str) -> None:
    values, settings = _values(value_set)
    output = chart.lint(values, settings, kube_version=f"{version}.0", binary=helm)
    assert "1 chart(s) linted, 0 chart(s) failed" in output
    assert "[ERROR]" not in output and "[WARNING]" not in output


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("allocator.resources", "oops", "got string, want object"),
        ("allocator.replica", "2", "additional properties 'replica' not allowed"),
        ("node.cleanOrphans", "some", "value must be one of"),
        ("nats.server.replicas", "2", "value must be one of"),
        ("admission.mode", "both", "value must be one of"),
        ("admission.policy.apiVersion", "v1", "value must be one of"),
        ("admission.gateTimeoutSeconds", "-1", "minimum: got -1, want 0"),
        ("admission.failurePolicy", "Open", "value must be one of"),
    ],
)
def test_lint_refuses_a_wrong_value(helm: Path, key: str, value: str, why: str) -> None:
    # the lint test above can fail: the values schema refuses mistakes before anything renders
    with pytest.raises(chart.HelmError, match=why):
        chart.lint(settings={key: value}, binary=helm)


def test_the_chart_refuses_kubernetes_before_1_34(helm: Path) -> None:
    # resource.k8s.io/v1 (DeviceClasses, ResourceSlices) is served from 1.34 on
    with pytest.raises(chart.HelmError, match="kubeVersion"):
        chart.template(kube_version="1.33.0", binary=helm)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("value_set", ALL_SETS)
def test_every_rendered_object_validates_strictly(
    rendered: dict[str, list[dict[str, Any]]], value_set: str, version: str
) -> None:
    checked = 0
    for obj in rendered[value_set]:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {error}") from error
        checked += 1
    assert checked >= 10


def test_a_misspelt_field_fails_strict_validation() -> None:
    bad = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automountToken": False}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.34", strict=True)


def test_the_value_sets_render_what_they_say(rendered: dict[str, list[dict[str, Any]]]) -> None:
    def kinds(value_set: str) -> set[str]:
        return {f"{o['kind']}/{o['metadata']['name']}" for o in rendered[value_set]}

    nats = {
        "StatefulSet/tangram-nats",
        "ConfigMap/tangram-nats-config",
        "Service/tangram-nats",
        "Service/tangram-nats-headless",
        "PodDisruptionBudget/tangram-nats",
    }
    callout = {
        "ServiceAccount/tangram-authcallout",
        "ClusterRole/tangram-authcallout",
        "ClusterRoleBinding/tangram-authcallout",
        "Deployment/tangram-authcallout",
    }
    always = {
        "ServiceAccount/tangram-allocator",
        "ClusterRole/tangram-allocator",
        "ClusterRoleBinding/tangram-allocator",
        "Role/tangram-allocator",
        "RoleBinding/tangram-allocator",
        "ServiceAccount/tangram-node",
        "ClusterRole/tangram-node",
        "ClusterRoleBinding/tangram-node",
        "Deployment/tangram-allocator",
        "DaemonSet/tangram-node",
        "Job/tangram-nats-streams",
        "DeviceClass/gpu.tangram.dev",
        "DeviceClass/mig.gpu.tangram.dev",
        "DeviceClass/shared.gpu.tangram.dev",
        "ValidatingAdmissionPolicy/tangram-resourceslices-own-node",
        "ValidatingAdmissionPolicyBinding/tangram-resourceslices-own-node",
        "ValidatingAdmissionPolicy/tangram-resourceclaim-status-own-node",
        "ValidatingAdmissionPolicyBinding/tangram-resourceclaim-status-own-node",
    }
    webhook = {
        "ServiceAccount/tangram-admission",
        "ClusterRole/tangram-admission",
        "ClusterRoleBinding/tangram-admission",
        "Role/tangram-admission",
        "RoleBinding/tangram-admission",
        "Deployment/tangram-admission",
        "Service/tangram-admission",
        "PodDisruptionBudget/tangram-admission",
        "MutatingWebhookConfiguration/tangram-admission",
    }
    policy = {
        "MutatingAdmissionPolicy/tangram-scheduling-gate",
        "MutatingAdmissionPolicyBinding/tangram-scheduling-gate",
    }
    openshift = {
        "SecurityContextConstraints/tangram-node",
        "ClusterRole/tangram-node-scc",
        "RoleBinding/tangram-node-scc",
    }
    assert kinds("default") == always | nats | callout | webhook
    assert kinds("existing-nats") == always | webhook
    assert kinds("existing-nats-callout") == always | callout | webhook
    assert kinds("admission-policy") == always | nats | callout | policy
    assert openshift | always | nats | callout | webhook <= kinds("openshift")
    assert "ServiceMonitor/tangram" in kinds("openshift")
    assert {"Namespace/tangram", "ConfigMap/tangram-dashboard", "ServiceMonitor/tangram"} <= kinds(
        "everything"
    )
    for objects in rendered.values():
        namespaced = [o for o in objects if o["kind"] not in _CLUSTER_SCOPED]
        assert {o["metadata"].get("namespace") for o in namespaced} == {"tangram"}


_CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "SecurityContextConstraints",
}


# --- NATS ------------------------------------------------------------------------------------


def test_nats_is_three_servers_on_persistent_volumes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["default"]
    nats = _one(objects, "StatefulSet", "nats")
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["podManagementPolicy"] == "Parallel"
    (claim,) = nats["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    mounts = {m["name"]: m["mountPath"] for m in _containers(nats)["nats"]["volumeMounts"]}
    assert mounts["data"] == "/data/jetstream"
    config = _one(objects, "ConfigMap", "nats-config")["data"]["nats.conf"]
    for n in range(3):
        assert f"nats-route://tangram-nats-{n}.tangram-nats-headless.tangram.svc:6222" in config
    assert 'store_dir: "/data/jetstream"' in config


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_every_user_of_nats_replicates_streams_three_times(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    objects = rendered[value_set]
    users = 0
    for obj in objects:
        if obj["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for container in _pod(obj)["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            if container["name"] == "admission":
                # reads pods' claims from the API server: no NATS at all
                assert not [name for name in env if name.startswith("TANGRAM_NATS")]
                continue
            if container["name"] == "authcallout":
                # answers the server's authorization requests: no streams, its own static user
                assert env["TANGRAM_NATS_URL_FILE"] == "/etc/tangram/nats/url"
                assert "TANGRAM_NATS_STREAM_REPLICAS" not in env
                continue
            assert env["TANGRAM_NATS_STREAM_REPLICAS"] == "3", container["name"]
            if obj["kind"] == "DaemonSet" and value_set in CALLOUT_SETS:
                # the node's user comes from its pod's token: no url file, no password
                assert env["TANGRAM_NATS_TOKEN_FILE"] == "/var/run/secrets/tangram/nats/token"
                assert "@" not in env["TANGRAM_NATS_URL"] and "TANGRAM_NATS_URL_FILE" not in env
            else:
                assert env["TANGRAM_NATS_URL_FILE"] == "/etc/tangram/nats/url"
                assert "TANGRAM_NATS_TOKEN_FILE" not in env
            users += 1
    assert users == 4
    job = _containers(_one(objects, "Job", "nats-streams"))["streams"]
    assert re.search(r"stream_replicas=3[,)]", job["command"][-1])


def test_stream_replicas_follow_the_value(helm: Path) -> None:
    settings = {"nats.deploy": "false", "nats.url": "nats://nats.messaging:4222", "nats.streamReplicas": "1"}
    objects = _objects(chart.template(settings=settings, binary=helm))
    job = _containers(_one(objects, "Job", "nats-streams"))["streams"]
    assert "stream_replicas=1)" in job["command"][-1]
    allocator = _containers(_one(objects, "Deployment", "allocator"))["allocator"]
    assert {"name": "TANGRAM_NATS_STREAM_REPLICAS", "value": "1"} in allocator["env"]


def test_more_stream_copies_than_servers_is_refused(helm: Path) -> None:
    with pytest.raises(chart.HelmError, match=r"exceeds nats\.server\.replicas"):
        chart.template(settings={"nats.server.replicas": "1"}, binary=helm)
    # an existing NATS: the chart cannot know how many servers it has
    existing = {"nats.deploy": "false", "nats.url": "nats://nats.messaging:4222", "nats.server.replicas": "1"}
    chart.template(settings=existing, binary=helm)


def test_existing_nats_uses_the_named_secrets(helm: Path) -> None:
    settings = {
        "nats.deploy": "false",
        "nats.url": "nats://nats.messaging:4222",
        "nats.urlSecrets.admin": "messaging-admin",
        "nats.urlSecrets.allocator": "messaging-tangram",
        "nats.authCallout.urlSecret": "messaging-callout",
        "nats.authCallout.issuerSecret": "messaging-issuer",
    }
    objects = _objects(chart.template(settings=settings, binary=helm))
    job = _pod(_one(objects, "Job", "nats-streams"))
    assert job["volumes"][0]["secret"]["secretName"] == "messaging-admin"
    allocator = _pod(_one(objects, "Deployment", "allocator"))
    assert allocator["volumes"][0]["secret"]["secretName"] == "messaging-tangram"
    callout = _pod(_one(objects, "Deployment", "authcallout"))
    secrets = {v["name"]: v["secret"]["secretName"] for v in callout["volumes"]}
    assert secrets == {"nats-credentials": "messaging-callout", "issuer": "messaging-issuer"}
    assert not [o for o in objects if o["kind"] == "StatefulSet"]


def test_node_services_reach_nats_at_the_deployed_service_or_the_given_url(
    helm: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    def urls(objects: list[dict[str, Any]]) -> set[str]:
        return {
            e["value"]
            for c in _containers(_one(objects, "DaemonSet", "node")).values()
            for e in c["env"]
            if e["name"] == "TANGRAM_NATS_URL"
        }

    assert urls(rendered["default"]) == {"nats://tangram-nats.tangram.svc:4222"}
    assert urls(rendered["existing-nats-callout"]) == {"tls://nats.messaging.svc:4222"}
    # an existing NATS with the callout needs its address: the chart cannot guess it
    with pytest.raises(chart.HelmError, match=r"nats\.url is required"):
        chart.template(settings={"nats.deploy": "false"}, binary=helm)
    # a URL with a user and password is refused: node users come from tokens
    with pytest.raises(
        chart.HelmError, match=r"/nats/url.: .nats://node:secret@nats:4222. does not match pattern"
    ):
        chart.lint(settings={"nats.url": "nats://node:secret@nats:4222"}, binary=helm)


def test_node_tokens_are_for_the_callout_and_live_no_longer_than_it_accepts(
    helm: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered["default"]
    node = _pod(_one(objects, "DaemonSet", "node"))
    (volume,) = [v for v in node["volumes"] if v["name"] == "nats-token"]
    assert volume["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": "tangram-nats", "expirationSeconds": 3600, "path": "token"}}
    ]
    callout = _one(objects, "Deployment", "authcallout")
    assert callout["spec"]["replicas"] == 2
    assert _pod(callout)["serviceAccountName"] == "tangram-authcallout"
    env = {e["name"]: e.get("value") for e in _containers(callout)["authcallout"]["env"]}
    assert env["TANGRAM_CALLOUT_AUDIENCE"] == "tangram-nats"
    assert env["TANGRAM_CALLOUT_SERVICE_ACCOUNTS"] == f"tangram:{node['serviceAccountName']}"
    assert env["TANGRAM_CALLOUT_MAX_TTL_S"] == "3600"
    with pytest.raises(chart.HelmError, match=r"exceeds nats\.authCallout\.maxTtlSeconds"):
        chart.template(settings={"nats.authCallout.tokenExpirationSeconds": "7200"}, binary=helm)
    # static node users: no callout, no token, the url file from the host
    static = _objects(chart.template(settings={"nats.authCallout.enabled": "false"}, binary=helm))
    assert not [o for o in static if "authcallout" in o["metadata"]["name"]]
    volumes = {v["name"]: v for v in _pod(_one(static, "DaemonSet", "node"))["volumes"]}
    assert "nats-token" not in volumes
    assert volumes["nats-credentials"]["hostPath"]["path"] == NODE_URL_DIR


def test_a_tls_nats_is_verified_with_the_given_ca(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["everything"]
    workloads = [
        _one(objects, "Deployment", "allocator"),
        _one(objects, "Deployment", "authcallout"),
        _one(objects, "DaemonSet", "node"),
        _one(objects, "Job", "nats-streams"),
    ]
    for workload in workloads:
        pod = _pod(workload)
        (volume,) = [v for v in pod["volumes"] if v["name"] == "nats-ca"]
        assert volume["configMap"] == {"name": "nats-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
        for container in pod["containers"]:
            mounts = {m["name"]: m for m in container["volumeMounts"]}
            assert mounts["nats-ca"] == {
                "name": "nats-ca",
                "mountPath": "/etc/tangram/nats-ca",
                "readOnly": True,
            }
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            if workload["kind"] != "Job":
                assert env["TANGRAM_NATS_TLS_CA"] == "/etc/tangram/nats-ca/ca.crt", container["name"]
    job = _containers(_one(objects, "Job", "nats-streams"))["streams"]
    assert 'tls_ca_file="/etc/tangram/nats-ca/ca.crt"' in job["command"][-1]
    # and without a CA, nothing of it
    for obj in rendered["default"]:
        text = json.dumps(obj)
        assert '"nats-ca"' not in text and "TANGRAM_NATS_TLS_CA" not in text, obj["metadata"]["name"]


# --- pods ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_host_paths_only_on_the_node_pod_and_only_the_expected_ones(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    for obj in rendered[value_set]:
        if obj["kind"] in WORKLOADS and obj["kind"] != "DaemonSet":
            assert not [v for v in _pod(obj).get("volumes", []) if "hostPath" in v], obj["metadata"]["name"]
    node = _pod(_one(rendered[value_set], "DaemonSet", "node"))
    host = {v["name"]: v["hostPath"] for v in node["volumes"] if "hostPath" in v}
    # with the auth callout the node's NATS credential is its projected token, not a host file
    expected = NODE_HOST_PATHS if value_set in CALLOUT_SETS else NODE_HOST_PATHS | {NODE_URL_DIR}
    expected |= IMEX_HOST_PATHS if value_set in IMEX_SETS else set()
    assert {h["path"] for h in host.values()} == expected
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in node["containers"]}
    # The host's / only read-only, and only in cdi; /dev only in the partitioner.
    assert mounts["cdi"]["driver-root"]["readOnly"] is True
    assert [c for c, m in mounts.items() if "driver-root" in m] == ["cdi"]
    assert [c for c, m in mounts.items() if "dev" in m] == ["partitioner"]
    # the MPS pipe directories: written by cdi (which runs the daemons), mounted nowhere else
    assert [c for c, m in mounts.items() if "mps-root" in m] == ["cdi"]
    assert mounts["cdi"]["mps-root"]["mountPath"] == "/run/tangram/mps"
    credential = "nats-token" if value_set in CALLOUT_SETS else "nats-credentials"
    for container, used in mounts.items():
        assert used[credential]["readOnly"] is True, container


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_only_the_partitioner_is_privileged(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    privileged = set()
    for obj in rendered[value_set]:
        if obj["kind"] not in WORKLOADS:
            continue
        pod = _pod(obj)
        # the host's network only for the node pod, and only with IMEX (its daemons' peers)
        on_host_network = value_set in IMEX_SETS and obj["metadata"]["name"] == "tangram-node"
        assert bool(pod.get("hostNetwork")) is on_host_network
        assert not pod.get("hostPID") and not pod.get("hostIPC")
        for container in pod["containers"]:
            context = container["securityContext"]
            if context.get("privileged"):
                privileged.add(f"{obj['kind']}/{container['name']}")
                continue
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            # one capability in all: MKNOD, for cdi's IMEX channel device nodes
            mknod = on_host_network and container["name"] == "cdi"
            wanted = {"drop": ["ALL"], "add": ["MKNOD"]} if mknod else {"drop": ["ALL"]}
            assert context["capabilities"] == wanted, container["name"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
    assert privileged == {"DaemonSet/partitioner"}


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_services_probe_healthz_and_readyz_on_their_ports(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    expected = {"allocator": 8080, "discovery": 8081, "partitioner": 8082, "cdi": 8083}
    workloads = [("Deployment", "allocator"), ("DaemonSet", "node")]
    if value_set in CALLOUT_SETS:
        expected["authcallout"] = 8080
        workloads.append(("Deployment", "authcallout"))
    if value_set in WEBHOOK_SETS:
        expected["admission"] = 8080
        workloads.append(("Deployment", "admission"))
    seen = {}
    for kind, suffix in workloads:
        for container in _containers(_one(rendered[value_set], kind, suffix)).values():
            env = {e["name"]: e.get("value") for e in container["env"]}
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            live, ready = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
            assert live["path"] == "/healthz" and ready["path"] == "/readyz", container["name"]
            assert live["port"] == ready["port"] and live["port"] in ports, container["name"]
            # the probes reach the port the service listens on, on every interface
            assert str(ports[live["port"]]) == env["TANGRAM_HEALTH_PORT"]
            assert env["TANGRAM_HEALTH_HOST"] == "0.0.0.0"
            seen[container["name"]] = ports[live["port"]]
    assert seen == expected


def test_allocator_runs_two_replicas_rolled_one_at_a_time(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for value_set in VALUE_SETS:
        deployment = _one(rendered[value_set], "Deployment", "allocator")
        assert deployment["spec"]["replicas"] == 2
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
        assert _containers(deployment)["allocator"]["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_node_pod_runs_only_on_gpu_nodes_and_runtime_class_is_optional(
    helm: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    node = _pod(_one(rendered["default"], "DaemonSet", "node"))
    assert node["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert node["runtimeClassName"] == "nvidia"
    assert node["serviceAccountName"] == "tangram-node"
    bare = _objects(chart.template(settings={"node.runtimeClassName": ""}, binary=helm))
    assert "runtimeClassName" not in _pod(_one(bare, "DaemonSet", "node"))


def test_gpu_operator_driver_root_is_seen_under_the_host_mount(helm: Path) -> None:
    objects = _objects(chart.template(settings={"node.driverRoot": "/run/nvidia/driver"}, binary=helm))
    env = {e["name"]: e.get("value") for e in _containers(_one(objects, "DaemonSet", "node"))["cdi"]["env"]}
    assert env["TANGRAM_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert env["TANGRAM_DRIVER_ROOT_MOUNT"] == "/driver-root/run/nvidia/driver"


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_the_environment_is_read_by_the_services(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    known = settings_env_vars() | {"TANGRAM_NATS_URL_FILE"}  # read by the image's entry point
    workloads = [("Deployment", "allocator"), ("DaemonSet", "node")]
    if value_set in CALLOUT_SETS:
        workloads.append(("Deployment", "authcallout"))
    if value_set in WEBHOOK_SETS:
        workloads.append(("Deployment", "admission"))
    for kind, suffix in workloads:
        for container in _containers(_one(rendered[value_set], kind, suffix)).values():
            names = {e["name"] for e in container["env"] if e["name"].startswith("TANGRAM_")}
            assert names <= known, (container["name"], names - known)


def test_openshift_lets_restricted_v2_choose_the_uid(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for value_set, pinned in (("default", True), ("openshift", False)):
        for kind, suffix in (
            ("Deployment", "allocator"),
            ("Deployment", "authcallout"),
            ("Deployment", "admission"),
            ("StatefulSet", "nats"),
            ("Job", "nats-streams"),
        ):
            context = _pod(_one(rendered[value_set], kind, suffix))["securityContext"]
            assert ("runAsUser" in context) is pinned, (value_set, kind)
            assert ("fsGroup" in context) is pinned, (value_set, kind)
            assert context["runAsNonRoot"] is True


def test_security_context_constraints_allow_only_the_node_pod(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    scc = _one(rendered["openshift"], "SecurityContextConstraints", "node")
    for strategy in ("runAsUser", "seLinuxContext", "fsGroup", "supplementalGroups"):
        assert isinstance(scc[strategy]["type"], str)
    assert scc["users"] == [] and scc["groups"] == []
    assert not (
        scc["allowHostNetwork"] or scc["allowHostPID"] or scc["allowHostIPC"] or scc["allowHostPorts"]
    )
    assert scc["allowPrivilegedContainer"] is True and scc["allowHostDirVolumePlugin"] is True
    # every volume the node pod uses is allowed
    node = _pod(_one(rendered["openshift"], "DaemonSet", "node"))
    used = {next(k for k in v if k != "name") for v in node["volumes"]}
    assert used <= set(scc["volumes"])
    role = _one(rendered["openshift"], "ClusterRole", "node-scc")
    assert role["rules"] == [
        {
            "apiGroups": ["security.openshift.io"],
            "resources": ["securitycontextconstraints"],
            "resourceNames": ["tangram-node"],
            "verbs": ["use"],
        }
    ]
    binding = _one(rendered["openshift"], "RoleBinding", "node-scc")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tangram-node", "namespace": "tangram"}]


# --- RBAC against the code -------------------------------------------------------------------

# Every Kubernetes API call the services' code makes (kubernetes_asyncio method -> the RBAC
# grant it needs), by the role of the pod whose code makes it. The node pod's: discovery's slices
# and Node, cdi's claim reads; the partitioner makes none. The allocator's: the claims, classes
# and pods it watches, the allocations it writes, the gates it removes, the Events it records.
# A list call in a file that watches is also a watch. The auth callout's: token
# reviews, a token's pod (for its node, before Kubernetes 1.32) and the Nodes (whose partitioner
# durables a node's user is denied). A new call fails
# test_rbac_grants_exactly_the_calls_the_code_makes until listed here, under its role.
CALLS = {
    "node": {
        "create_resource_slice": ("resource.k8s.io", "resourceslices", "create"),
        "replace_resource_slice": ("resource.k8s.io", "resourceslices", "update"),
        "delete_resource_slice": ("resource.k8s.io", "resourceslices", "delete"),
        "read_resource_slice": ("resource.k8s.io", "resourceslices", "get"),
        "list_resource_slice": ("resource.k8s.io", "resourceslices", "list"),
        "watch:list_resource_slice": ("resource.k8s.io", "resourceslices", "watch"),
        "read_node": ("", "nodes", "get"),
        "read_namespaced_resource_claim": ("resource.k8s.io", "resourceclaims", "get"),
        # what cdi prepared, in the claim's status.devices
        "replace_namespaced_resource_claim_status": ("resource.k8s.io", "resourceclaims/status", "update"),
    },
    "allocator": {
        "list_resource_claim_for_all_namespaces": ("resource.k8s.io", "resourceclaims", "list"),
        "watch:list_resource_claim_for_all_namespaces": ("resource.k8s.io", "resourceclaims", "watch"),
        "read_namespaced_resource_claim": ("resource.k8s.io", "resourceclaims", "get"),
        "replace_namespaced_resource_claim_status": ("resource.k8s.io", "resourceclaims/status", "update"),
        "list_device_class": ("resource.k8s.io", "deviceclasses", "list"),
        "watch:list_device_class": ("resource.k8s.io", "deviceclasses", "watch"),
        "list_pod_for_all_namespaces": ("", "pods", "list"),
        "watch:list_pod_for_all_namespaces": ("", "pods", "watch"),
        "read_namespaced_pod": ("", "pods", "get"),
        "patch_namespaced_pod": ("", "pods", "patch"),
        "create_namespaced_event": ("", "events", "create"),
        # preemption: victims evicted through the Eviction API, after reading the budgets
        "create_namespaced_pod_eviction": ("", "pods/eviction", "create"),
        "list_pod_disruption_budget_for_all_namespaces": ("policy", "poddisruptionbudgets", "list"),
        "watch:list_pod_disruption_budget_for_all_namespaces": ("policy", "poddisruptionbudgets", "watch"),
        # a node asked of cluster-autoscaler for a pod no node could hold
        "create_namespaced_pod_template": ("", "podtemplates", "create"),
        "delete_namespaced_pod_template": ("", "podtemplates", "delete"),
        "create_namespaced_custom_object": ("autoscaling.x-k8s.io", "provisioningrequests", "create"),
        "delete_namespaced_custom_object": ("autoscaling.x-k8s.io", "provisioningrequests", "delete"),
        # the Workload API's PodGroups, where served: which pods are placed together
        "list_cluster_custom_object": ("scheduling.k8s.io", "podgroups", "list"),
        "watch:list_cluster_custom_object": ("scheduling.k8s.io", "podgroups", "watch"),
        # its Lease (tangram-allocator, in its namespace): the allocator is alive
        "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
        "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
        "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    },
    "authcallout": {
        "create_token_review": ("authentication.k8s.io", "tokenreviews", "create"),
        "read_namespaced_pod": ("", "pods", "get"),
        "list_node": ("", "nodes", "list"),
    },
    # The admission webhook's: a created pod's claims or claim templates and their classes, its
    # certificates' Secret, and the caBundle of its webhook configuration; the pods held by the
    # gate, whose gate it removes past the gate timeout (with an Event on the pod).
    "admission": {
        "list_pod_for_all_namespaces": ("", "pods", "list"),
        "watch:list_pod_for_all_namespaces": ("", "pods", "watch"),
        "read_namespaced_pod": ("", "pods", "get"),
        "patch_namespaced_pod": ("", "pods", "patch"),
        "create_namespaced_event": ("", "events", "create"),
        "read_namespaced_resource_claim": ("resource.k8s.io", "resourceclaims", "get"),
        "read_namespaced_resource_claim_template": ("resource.k8s.io", "resourceclaimtemplates", "get"),
        "read_device_class": ("resource.k8s.io", "deviceclasses", "get"),
        "read_namespaced_secret": ("", "secrets", "get"),
        "create_namespaced_secret": ("", "secrets", "create"),
        "replace_namespaced_secret": ("", "secrets", "update"),
        "read_mutating_webhook_configuration": (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "get",
        ),
        "patch_mutating_webhook_configuration": (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "patch",
        ),
        # the allocator's Lease, read before any gate is lifted
        "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    },
}
# What the API server checks besides a call's own grant, by role and call: from Kubernetes 1.36
# (DRAResourceClaimGranularStatusAuthorization) a change of a claim's status.allocation or
# reservedFor is also authorized on the synthetic subresource resourceclaims/binding, and of its
# status.devices per driver, on the synthetic subresource resourceclaims/driver; the node's is the
# "associated-node:" verb, which holds only for claims allocated to the node of the pod whose
# token makes the call.
SERVER_CHECKS = {
    # the allocation Tangram writes: kube-scheduler's own "bind claim" check
    "allocator": {
        "replace_namespaced_resource_claim_status": (
            "resource.k8s.io",
            "resourceclaims/binding",
            "update",
        ),
    },
    "node": {
        "replace_namespaced_resource_claim_status": (
            "resource.k8s.io",
            "resourceclaims/driver",
            "associated-node:update",
        ),
    },
}
# The code each role's pod runs: the callout its package (python -m services.authcallout); the
# node pod the services and every other library module.
ROLE_CODE = {
    "authcallout": ROOT / "services" / "authcallout",
    "allocator": ROOT / "services" / "allocator",
    "admission": ROOT / "services" / "admission",
}
# The workload running under each role's ServiceAccount.
ROLE_WORKLOAD = {
    "node": ("DaemonSet", "node"),
    "authcallout": ("Deployment", "authcallout"),
    "allocator": ("Deployment", "allocator"),
    "admission": ("Deployment", "admission"),
}
# Code under libs/ that services never run: the tests' control plane, this chart's tooling,
# `tangram cluster up` (a local cluster with a kubelet stand-in, run by a person, not deployed) and
# the benchmarks (`tangram bench kubernetes` drives its own control plane).
NOT_SERVICE_CODE: set[str] = set()
NOT_SERVICE_FOLDERS = {ROOT / "libs" / "tangram" / tooling for tooling in ("local", "bench", "demo", "chaos")}
# Shared helpers that make a call on their caller's behalf: the call is charged to the role of each
# module that uses the helper, never to the role of the module that defines it.
CALLING_HELPERS = {"record_event": ROOT / "libs" / "tangram" / "kubernetes" / "api" / "events.py"}
# list_then_watch streams the list call its caller passes: that caller watches.
WATCHING = re.compile(r"\bWatch\(|\blist_then_watch\(")
_API_CALL = re.compile(r"\.((?:create|read|replace|patch|delete|list|watch)_(?:namespaced_)?[a-z_]+?)\(")
_LIST_CALL = re.compile(r"\.(list_[a-z_]+)\b")


def _calls_in(text: str) -> set[str]:
    return {n for n in _API_CALL.findall(text) if not n.endswith(("_task", "_text", "_bytes"))}


def _role_of(path: Path) -> str:
    return next((role for role, folder in ROLE_CODE.items() if folder in path.parents), "node")


def _api_calls(role: str) -> set[str]:
    calls = set()
    for folder in (ROOT / "libs" / "tangram", ROOT / "services"):
        for path in folder.rglob("*.py"):
            if path.name in NOT_SERVICE_CODE or NOT_SERVICE_FOLDERS & set(path.parents):
                continue
            if _role_of(path) != role:
                continue
            if path in CALLING_HELPERS.values():
                continue
            text = path.read_text()
            helpers = [h for h in CALLING_HELPERS if re.search(rf"\b{h}\(", text)]
            if "kubernetes_asyncio" not in text and not helpers and not WATCHING.search(text):
                continue
            found = _calls_in(text)
            for helper in helpers:
                found |= _calls_in(CALLING_HELPERS[helper].read_text())
            calls |= found
            if WATCHING.search(text):
                # the watched list call may be passed uncalled (to list_then_watch)
                listed = set(_LIST_CALL.findall(text)) | {n for n in found if n.startswith("list_")}
                calls |= {f"watch:{name}" for name in listed}
    return calls


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_api_calls_are_found_in_the_code_of_each_role() -> None:
    # the comparison below can fail: each role's code really makes its calls, and no other's
    assert {"create_token_review", "list_node"} <= _api_calls("authcallout")
    assert {"create_resource_slice", "read_node"} <= _api_calls("node")
    assert {
        "read_device_class",
        "patch_mutating_webhook_configuration",
        "patch_namespaced_pod",
    } <= _api_calls("admission")
    assert not _api_calls("node") & _api_calls("authcallout")
    assert {"replace_namespaced_resource_claim_status", "patch_namespaced_pod"} <= _api_calls("allocator")
    # an Event recorded through the shared helper is charged to its callers, not to the node pod
    assert "create_namespaced_event" in _api_calls("allocator") & _api_calls("admission")
    assert "create_namespaced_event" not in _api_calls("node")
    # a watch made through list_then_watch is the caller's
    assert "watch:list_pod_for_all_namespaces" in _api_calls("allocator") & _api_calls("admission")
    # both read a pod (the callout a token's, the webhook a gated one); nothing else is shared
    assert _api_calls("authcallout") & _api_calls("admission") == {"read_namespaced_pod"}


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_rbac_grants_exactly_the_calls_the_code_makes(
    rendered: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    objects = rendered[value_set]
    roles = ["node", "allocator", "authcallout"] if value_set in CALLOUT_SETS else ["node", "allocator"]
    if value_set in WEBHOOK_SETS:
        roles.append("admission")
    for role in roles:
        assert _api_calls(role) == set(CALLS[role]), role
        cluster_role = _one(objects, "ClusterRole", role)
        # a role's namespaced grants (the admission webhook's Secret) count with its cluster grants
        namespaced = [
            o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == f"tangram-{role}"
        ]
        granted_here = _grants(cluster_role) | {g for r in namespaced for g in _grants(r)}
        checked = {grant for call, grant in SERVER_CHECKS.get(role, {}).items() if call in CALLS[role]}
        assert granted_here == set(CALLS[role].values()) | checked, role
        for r in namespaced:
            (role_binding,) = [
                o
                for o in objects
                if o["kind"] == "RoleBinding" and o["metadata"]["name"] == f"tangram-{role}"
            ]
            assert role_binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": r["metadata"]["name"],
            }
            assert role_binding["subjects"] == [
                {"kind": "ServiceAccount", "name": f"tangram-{role}", "namespace": "tangram"}
            ]
        # granted to the ServiceAccount of the pod that runs that code, and to no other
        binding = _one(objects, "ClusterRoleBinding", role)
        assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
        (subject,) = binding["subjects"]
        kind, suffix = ROLE_WORKLOAD[role]
        assert _pod(_one(objects, kind, suffix))["serviceAccountName"] == subject["name"] == f"tangram-{role}"
    granted = {o["metadata"]["name"] for o in objects if o["kind"] in ("ClusterRole", "Role")}
    assert granted - {"tangram-node-scc"} == {f"tangram-{role}" for role in roles}


def test_the_node_writes_only_the_status_of_claims_and_only_its_drivers_devices(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for value_set in ALL_SETS:
        role = _one(rendered[value_set], "ClusterRole", "node")
        claim_rules = [
            r for r in role["rules"] if any(x.startswith("resourceclaims") for x in r["resources"])
        ]
        assert claim_rules == [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update"]},
            # Tangram's entries only, and only on claims allocated to the node of the caller's
            # pod: never "arbitrary-node:", and never resourceclaims/binding (the allocation)
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "resourceNames": [DRIVER],
                "verbs": ["associated-node:update"],
            },
        ], value_set


def test_the_partitioner_does_not_talk_to_kubernetes() -> None:
    for service in ("partitioner",):
        for path in (ROOT / "services" / service).rglob("*.py"):
            text = path.read_text()
            assert "kubernetes_asyncio" not in text, path
            assert not re.search(r"\btangram\.kube\b(?!let)", text), path


# --- metrics ---------------------------------------------------------------------------------


# A series name of Tangram's: a metric (tangram_...) or a recorded one (level:tangram_...:operation)
_TANGRAM_SERIES = re.compile(r"\b(?:[a-z_]+:)?tangram_[a-z_]+(?::[a-z_]+)?")
RULES = ROOT / "deploy" / "helm" / "tangram" / "files" / "prometheus" / "tangram.rules.yaml"


def _defined_metrics() -> dict[str, str]:
    pattern = re.compile(r"\b(Counter|Gauge|Histogram)\(\s*\"(tangram_[a-z_]+)\"")
    found: dict[str, str] = {}
    for folder in (ROOT / "libs" / "tangram", ROOT / "services"):
        for path in folder.rglob("*.py"):
            for kind, name in pattern.findall(path.read_text()):
                found[name] = kind
    return found


def _series(metric: str, kind: str) -> set[str]:
    if kind == "Histogram":
        return {f"{metric}_bucket", f"{metric}_count", f"{metric}_sum"}
    return {metric}


def test_the_dashboard_uses_only_metrics_the_services_export(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    configmap = _one(rendered["everything"], "ConfigMap", "dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["tangram.json"])
    exported = {s for name, kind in _defined_metrics().items() for s in _series(name, kind)}
    exported.add(INFO_NAME)  # a collector's family, read from the prepared claims at each scrape
    rules = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {r["record"] for g in rules for r in g["rules"] if "record" in r}
    for rule in (r for g in rules for r in g["rules"]):
        used = set(_TANGRAM_SERIES.findall(rule["expr"]))
        assert used and used <= exported | recorded, (rule.get("record") or rule["alert"], used - exported)
    titles = set()
    for panel in dashboard["panels"]:
        titles.add(panel["title"])
        for target in panel["targets"]:
            used = set(_TANGRAM_SERIES.findall(target["expr"]))
            assert used and used <= exported | recorded, (panel["title"], used - exported - recorded)
    for wanted in (
        "Claims decided, by outcome",
        "Decision latency",
        "MIG commands, by action",
        "Prepare latency",
        "Free GPUs",
        "Stranded GPUs",
        "GPU engine activity, by namespace",
        "GPU engine activity, by pod",
        "MIG layout over time",
        "Claims waiting, by cause",
    ):
        assert wanted in titles


def test_the_service_monitor_scrapes_every_metrics_port(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["everything"]
    monitor = _one(objects, "ServiceMonitor", "")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["tangram"]}
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert {e["path"] for e in endpoints.values()} == {"/metrics"}
    selector = monitor["spec"]["selector"]
    services = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"].endswith("-metrics")]
    ports = set()
    for service in services:
        labels = service["metadata"]["labels"]
        assert all(labels[k] == v for k, v in selector["matchLabels"].items())
        (expression,) = selector["matchExpressions"]
        assert labels[expression["key"]] in expression["values"]
        for port in service["spec"]["ports"]:
            ports.add(port["name"])
            # the Service's port reaches a named container port that serves /metrics
            workload = _one(
                objects,
                "DaemonSet" if "node" in service["metadata"]["name"] else "Deployment",
                next(c for c in ("allocator", "admission", "node") if c in service["metadata"]["name"]),
            )
            named = {p["name"] for c in _pod(workload)["containers"] for p in c["ports"]}
            assert port["targetPort"] in named
    assert ports == set(endpoints) == {"health", "discovery", "partitioner", "cdi", "admission"}


# --- the plain manifests are the chart's render ----------------------------------------------


def test_committed_manifests_are_a_fresh_render(helm: Path) -> None:
    fresh = chart.render_manifests(binary=helm)
    committed = {
        path.relative_to(ROOT): path.read_text()
        for folder in ("deploy/kubernetes", "deploy/openshift", "deploy/admission-policy")
        for path in (ROOT / folder).glob("*.yaml")
    }
    assert set(committed) == set(fresh), "run `make manifests`"
    stale = [str(path) for path, text in fresh.items() if committed[path] != text]
    assert not stale, f"{stale} differ from the chart's render: run `make manifests`"


def test_kustomizations_list_every_manifest() -> None:
    deploy = ROOT / "deploy"
    for folder in ("kubernetes", "openshift", "deviceclasses"):
        kustomization = yaml.safe_load((deploy / folder / "kustomization.yaml").read_text())
        assert kustomization["kind"] == "Kustomization"
        files = {p.name for p in (deploy / folder).glob("*.yaml") if p.name != "kustomization.yaml"}
        listed = set(kustomization["resources"])
        assert files <= listed, folder
        for resource in listed - files:
            # the others are folders with a kustomization of their own
            assert (deploy / folder / resource / "kustomization.yaml").exists(), (folder, resource)


def test_split_by_template_keeps_every_document() -> None:
    text = (
        "---\n# Source: tangram/templates/a.yaml\nkind: A\n---\n# Source: tangram/templates/b.yaml\n"
        "kind: B\n---\n# Source: tangram/templates/a.yaml\n# a comment\nkind: C\n"
    )
    assert chart.split_by_template(text) == {
        "templates/a.yaml": "kind: A\n---\n# a comment\nkind: C\n",
        "templates/b.yaml": "kind: B\n",
    }


# --- the real API server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def monitoring_crds() -> list[dict[str, Any]]:
    # not fetched: fails here with "run `make monitoring-crds`" (make test fetches them first)
    return monitoringcrds.load()


async def _apply_dry_run(kube: Any, obj: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply with dryRun=All and strict field validation: what the server would store."""
    resource = resources[obj["kind"]]
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    namespace = f"/namespaces/{obj['metadata']['namespace']}" if resource["namespaced"] else ""
    path = f"{base}{namespace}/{resource['name']}/{obj['metadata']['name']}"
    return await api_request(
        kube,
        "PATCH",
        path,
        query_params=[
            ("dryRun", "All"),
            ("fieldManager", "tangram-chart-test"),
            ("fieldValidation", "Strict"),
            # Other tests of the session made the shared objects (DeviceClasses) with another field
            # manager; where the server drops a field (extendedResourceName on 1.34) the apply would
            # conflict with them. What is checked is what the server accepts, not who owns fields.
            ("force", "true"),
        ],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=obj,
    )


def _in_namespace(objects: list[dict[str, Any]], namespace: str) -> Iterator[dict[str, Any]]:
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in UNSERVED_KINDS:
            continue
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace
        yield obj


@pytest.mark.controlplane
@pytest.mark.timeout(300)
@pytest.mark.parametrize("value_set", sorted(set(ALL_SETS) - {"admission-policy"}))
async def test_the_api_server_accepts_every_object(
    kube: Any,
    release: Release,
    unique: str,
    helm: Path,
    monitoring_crds: list[dict[str, Any]],
    value_set: str,
) -> None:
    await _accepts_every_object(kube, release, unique, helm, monitoring_crds, value_set)


@pytest.mark.controlplane
@pytest.mark.timeout(300)
async def test_an_api_server_serving_admission_policies_accepts_the_policy_set(
    kube_admission_policies: Any,
    release: Release,
    unique: str,
    helm: Path,
    monitoring_crds: list[dict[str, Any]],
) -> None:
    # MutatingAdmissionPolicy is served on 1.34 only with its feature gate and runtime config
    await _accepts_every_object(
        kube_admission_policies, release, unique, helm, monitoring_crds, "admission-policy"
    )


async def _accepts_every_object(
    kube: Any,
    release: Release,
    unique: str,
    helm: Path,
    monitoring_crds: list[dict[str, Any]],
    value_set: str,
) -> None:
    """What the chart renders for the plane's Kubernetes version, applied (dry run) to it, the
    ServiceMonitor and PrometheusRule with their CRDs installed."""
    namespace = unique[-20:].strip("-")
    values, settings = _values(value_set)
    objects = _objects(
        chart.template(values, settings, namespace=namespace, kube_version=f"{release.minor}.0", binary=helm)
    )
    if any((o["apiVersion"], o["kind"]) in MONITORING_KINDS for o in objects):
        await install_crds(kube, monitoring_crds)
    body = V1Namespace(metadata=V1ObjectMeta(name=namespace))
    await call(f"create Namespace {namespace}", CoreV1Api(kube).create_namespace(body))
    try:
        discovered: dict[str, dict[str, Any]] = {}
        applied = []
        for obj in _in_namespace(objects, namespace):
            if obj["apiVersion"] not in discovered:
                discovered[obj["apiVersion"]] = await api_resources(kube, obj["apiVersion"])
            stored = await _apply_dry_run(kube, obj, discovered[obj["apiVersion"]])
            assert stored["kind"] == obj["kind"] and stored["metadata"]["name"] == obj["metadata"]["name"]
            if (obj["apiVersion"], obj["kind"]) in MONITORING_KINDS:
                # nothing defaulted or dropped: the operator reads the rules and endpoints as rendered
                assert stored["spec"] == obj["spec"], obj["kind"]
            applied.append(obj["kind"])
        assert len(applied) == len([o for o in objects if (o["apiVersion"], o["kind"]) not in UNSERVED_KINDS])
        assert {"DaemonSet", "Deployment", "Job", "ValidatingAdmissionPolicy", "DeviceClass"} <= set(applied)
        if value_set == "everything":
            assert {"ServiceMonitor", "PrometheusRule"} <= set(applied)
        admission = (
            {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
            if value_set == "admission-policy"
            else {"MutatingWebhookConfiguration"}
        )
        assert admission <= set(applied)
    finally:
        await call(f"delete Namespace {namespace}", CoreV1Api(kube).delete_namespace(namespace))


@pytest.mark.controlplane
@pytest.mark.timeout(300)
async def test_the_api_server_refuses_an_unknown_field(kube: Any, helm: Path) -> None:
    # the acceptance above means something: strict validation refuses what the schema lacks
    objects = _objects(chart.template(binary=helm))
    role = dict(_one(objects, "ClusterRole", "node"))
    role["rulez"] = [{"verbs": ["get"]}]
    resources = await api_resources(kube, "rbac.authorization.k8s.io/v1")
    with pytest.raises(Refused, match=r"\.rulez: field not declared in schema"):
        await _apply_dry_run(kube, role, resources)
    # and a dry run stores nothing
    with pytest.raises(Refused, match="404"):
        await api_request(kube, "GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/tangram-node")


def _misspelt_group_field(monitor: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    rule["spec"]["groups"][0]["rulez"] = rule["spec"]["groups"][0].pop("rules")
    return rule


def _duration_as_a_number(monitor: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    alert = next(r for r in rule["spec"]["groups"][-1]["rules"] if "for" in r)
    alert["for"] = 600
    return rule


def _interval_in_words(monitor: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    monitor["spec"]["endpoints"][0]["interval"] = "half a minute"
    return monitor


@pytest.mark.controlplane
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (
            _misspelt_group_field,
            r"\.spec\.groups\[name=\W+tangram\.telemetry\W+\]\.rulez: field not declared in schema",
        ),
        (
            _duration_as_a_number,
            r"\.spec\.groups\[name=\W+tangram\.alerts\W+\]\.rules\[\d+\]\.for: expected string",
        ),
        (
            _interval_in_words,
            r"spec\.endpoints\[0\]\.interval: Invalid value: \W+half a minute\W+: .* should match",
        ),
    ],
    ids=["misspelt-field", "wrong-type", "wrong-format"],
)
async def test_the_api_server_refuses_monitoring_objects_their_crds_do_not_allow(
    kube: Any,
    unique: str,
    helm: Path,
    monitoring_crds: list[dict[str, Any]],
    spoil: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
    why: str,
) -> None:
    # the acceptance above means something for the custom resources too: their CRDs' schemas are
    # enforced, strictly
    await install_crds(kube, monitoring_crds)
    namespace = unique[-20:].strip("-")
    objects = _objects(chart.template(settings=EVERYTHING, namespace=namespace, binary=helm))
    monitor, rule = _one(objects, "ServiceMonitor", ""), _one(objects, "PrometheusRule", "")
    resources = await api_resources(kube, "monitoring.coreos.com/v1")
    body = V1Namespace(metadata=V1ObjectMeta(name=namespace))
    await call(f"create Namespace {namespace}", CoreV1Api(kube).create_namespace(body))
    try:
        spoilt = spoil(copy.deepcopy(monitor), copy.deepcopy(rule))
        pristine = monitor if spoilt["kind"] == "ServiceMonitor" else rule
        await _apply_dry_run(kube, pristine, resources)
        with pytest.raises(Refused, match=why):
            await _apply_dry_run(kube, spoilt, resources)
    finally:
        await call(f"delete Namespace {namespace}", CoreV1Api(kube).delete_namespace(namespace))


@pytest.mark.controlplane
@pytest.mark.timeout(300)
async def test_helm_installs_and_uninstalls_the_chart(
    controlplane: Any, kube: Any, unique: str, helm: Path
) -> None:
    # A release named without "tangram" prefixes every name, cluster-scoped ones included, so it
    # cannot collide with anything else on the shared control plane; the DeviceClasses have fixed
    # names and are checked by the dry run above. No hooks: the streams Job waits for a NATS that
    # cannot run without a kubelet.
    release, namespace = f"r{unique[-6:]}", unique[-20:].strip("-")
    kubeconfig = ["--kubeconfig", str(controlplane.kubeconfig), "--namespace", namespace]
    # No admission webhook either: nothing would serve it here, and a webhook configuration that
    # names a Service sends the API server to a cluster IP no kube-proxy routes.
    settings = ["--set", "deviceClasses.create=false", "--set", "admission.mode=none"]
    try:
        notes = chart.run(
            [
                "install",
                release,
                str(chart.chart_dir()),
                "--create-namespace",
                "--no-hooks",
                *settings,
                *kubeconfig,
            ],
            binary=helm,
        )
        assert "STATUS: deployed" in notes and f"installed in namespace {namespace}" in notes
        prefix = f"/apis/apps/v1/namespaces/{namespace}"
        daemonset = await api_request(kube, "GET", f"{prefix}/daemonsets/{release}-tangram-node")
        assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == f"{release}-tangram-node"
        deployment = await api_request(kube, "GET", f"{prefix}/deployments/{release}-tangram-allocator")
        assert deployment["spec"]["replicas"] == 2
        nats = await api_request(kube, "GET", f"{prefix}/statefulsets/{release}-tangram-nats")
        assert nats["spec"]["replicas"] == 3
        policy = await api_request(
            kube,
            "GET",
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{release}-tangram-resourceslices-own-node",
        )
        condition = policy["spec"]["matchConditions"][0]["expression"]
        assert f"system:serviceaccount:{namespace}:{release}-tangram-node" in condition
        chart.run(["uninstall", release, "--wait", *kubeconfig], binary=helm)
        with pytest.raises(Refused, match="404"):
            await api_request(
                kube, "GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release}-tangram-node"
            )
    finally:
        await CoreV1Api(kube).delete_namespace(namespace)


def test_the_admission_webhook_touches_only_its_own_secret_and_webhook_configuration(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["default"]
    role = _one(objects, "Role", "admission")
    assert role["metadata"]["namespace"] == "tangram"
    by_verb = {
        (resource, verb): rule.get("resourceNames")
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # Kubernetes cannot bind a create to a name; everything else is bound to the one Secret, and
    # the allocator's Lease is only read, by name
    assert by_verb == {
        ("secrets", "get"): ["tangram-admission-tls"],
        ("secrets", "update"): ["tangram-admission-tls"],
        ("secrets", "create"): None,
        ("leases", "get"): ["tangram-allocator"],
    }
    cluster_role = _one(objects, "ClusterRole", "admission")
    (webhooks,) = [r for r in cluster_role["rules"] if "mutatingwebhookconfigurations" in r["resources"]]
    assert webhooks["resourceNames"] == ["tangram-admission"]
    assert [r for r in cluster_role["rules"] if r is not webhooks] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
            "verbs": ["get"],
        },
        # the gate timeout: the pods holding the gate, their gate lifted, an Event on each
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    # the names the code is told to use are the ones the roles grant
    env = {
        e["name"]: e.get("value")
        for e in _containers(_one(objects, "Deployment", "admission"))["admission"]["env"]
    }
    assert env["TANGRAM_ADMISSION_SECRET"] == "tangram-admission-tls"
    assert env["TANGRAM_ADMISSION_WEBHOOK_CONFIGURATION"] == "tangram-admission"
    assert env["TANGRAM_ADMISSION_SERVICE"] == "tangram-admission"
    assert env["TANGRAM_ADMISSION_NAMESPACE"] == "tangram"
    assert env["TANGRAM_ADMISSION_GATE_TIMEOUT_S"] == "120"


def test_the_gate_timeout_is_a_value(helm: Path) -> None:
    objects = _objects(chart.template(settings={"admission.gateTimeoutSeconds": "0"}, binary=helm))
    env = {
        e["name"]: e.get("value")
        for e in _containers(_one(objects, "Deployment", "admission"))["admission"]["env"]
    }
    assert env["TANGRAM_ADMISSION_GATE_TIMEOUT_S"] == "0"


def test_the_webhook_never_blocks_pods_and_sees_only_pods_with_claims(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    config = _one(rendered["default"], "MutatingWebhookConfiguration", "admission")
    (webhook,) = config["webhooks"]
    assert webhook["failurePolicy"] == "Fail" and webhook["sideEffects"] == "None"
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["clientConfig"] == {
        "service": {"namespace": "tangram", "name": "tangram-admission", "path": "/mutate", "port": 443}
    }
    assert "caBundle" not in webhook["clientConfig"]  # written by the webhook itself
    assert {c["name"] for c in webhook["matchConditions"]} == {"has-claims", "not-bound", "not-gated"}
    service = _one(rendered["default"], "Service", "admission")
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https"}]
    policy = _one(rendered["admission-policy"], "MutatingAdmissionPolicy", "scheduling-gate")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1beta1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConditions"] == webhook["matchConditions"]
    binding = _one(rendered["admission-policy"], "MutatingAdmissionPolicyBinding", "scheduling-gate")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"gpu.tangram.dev/admission": "enabled"}
    }


def test_admission_failure_policy_is_chosen_for_webhook_and_policy_alike(helm: Path) -> None:
    # Fail by default (asserted above): Ignore is the operator's explicit choice
    webhook_set = _objects(chart.template(settings={"admission.failurePolicy": "Ignore"}, binary=helm))
    (webhook,) = _one(webhook_set, "MutatingWebhookConfiguration", "admission")["webhooks"]
    assert webhook["failurePolicy"] == "Ignore"
    policy_set = _objects(
        chart.template(
            settings={"admission.mode": "policy", "admission.failurePolicy": "Ignore"}, binary=helm
        )
    )
    assert _one(policy_set, "MutatingAdmissionPolicy", "scheduling-gate")["spec"]["failurePolicy"] == "Ignore"


def test_admission_none_renders_neither(helm: Path) -> None:
    objects = _objects(chart.template(settings={"admission.mode": "none"}, binary=helm))
    assert not [
        o
        for o in objects
        if "admission" in o["metadata"]["name"] or "scheduling-gate" in o["metadata"]["name"]
    ]


def test_sharing_off_takes_nvml_and_the_mps_root_from_the_cdi_container(helm: Path) -> None:
    on = _pod(_one(rendered_objects(helm, {}), "DaemonSet", "node"))
    off = _pod(_one(rendered_objects(helm, {"node.sharing.enabled": "false"}), "DaemonSet", "node"))

    def cdi_env(pod: dict[str, Any]) -> dict[str, Any]:
        [cdi] = [c for c in pod["containers"] if c["name"] == "cdi"]
        return {e["name"]: e.get("value") for e in cdi["env"]}

    assert cdi_env(on)["TANGRAM_REAL_NVML"] == "1"
    assert cdi_env(on)["TANGRAM_MPS_ROOT"] == "/run/tangram/mps"
    assert cdi_env(on)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert not {"TANGRAM_REAL_NVML", "TANGRAM_MPS_ROOT", "NVIDIA_VISIBLE_DEVICES"} & set(cdi_env(off))
    assert "mps-root" not in {v["name"] for v in off["volumes"]}


def rendered_objects(helm: Path, settings: dict[str, str]) -> list[dict[str, Any]]:
    return _objects(chart.template([], settings, binary=helm))


def test_imex_off_adds_nothing_and_on_adds_only_what_the_daemons_need(helm: Path) -> None:
    off = _pod(_one(rendered_objects(helm, {}), "DaemonSet", "node"))
    on = _pod(_one(rendered_objects(helm, {"node.imex.enabled": "true"}), "DaemonSet", "node"))

    def cdi(pod: dict[str, Any]) -> dict[str, Any]:
        [found] = [c for c in pod["containers"] if c["name"] == "cdi"]
        return found

    env = {e["name"]: e.get("value") for e in cdi(on)["env"]}
    assert env["TANGRAM_IMEX_ROOT"] == "/run/tangram/imex"
    assert env["TANGRAM_IMEX_DAEMON"] == "/driver-root/usr/bin/nvidia-imex"
    assert {e["name"] for e in cdi(off)["env"]}.isdisjoint({"TANGRAM_IMEX_ROOT", "TANGRAM_IMEX_DAEMON"})
    assert (on["hostNetwork"], on["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "hostNetwork" not in off and "dnsPolicy" not in off
    mounts = {m["name"]: m for m in cdi(on)["volumeMounts"]}
    # the channel device nodes go where the driver root's /dev is seen, writable; the host's / stays read-only
    assert mounts["imex-channels"]["mountPath"] == "/driver-root/dev/nvidia-caps-imex-channels"
    assert "readOnly" not in mounts["imex-channels"] and mounts["driver-root"]["readOnly"] is True
    assert mounts["imex-root"]["mountPath"] == "/run/tangram/imex"
    assert {"imex-root", "imex-channels"}.isdisjoint(v["name"] for v in off["volumes"])
    others = [c for c in on["containers"] if c["name"] != "cdi"]
    assert all("imex-channels" not in {m["name"] for m in c["volumeMounts"]} for c in others)
    # under the GPU Operator's driver root, the channels are its /dev's, as the CDI specs name them
    operator = _pod(
        _one(
            rendered_objects(helm, {"node.imex.enabled": "true", "node.driverRoot": "/run/nvidia/driver"}),
            "DaemonSet",
            "node",
        )
    )
    [channels] = [v for v in operator["volumes"] if v["name"] == "imex-channels"]
    assert channels["hostPath"]["path"] == "/run/nvidia/driver/dev/nvidia-caps-imex-channels"


def test_openshift_allows_the_host_network_and_mknod_only_with_imex(helm: Path) -> None:
    plain = _one(rendered_objects(helm, {"openshift.enabled": "true"}), "SecurityContextConstraints", "node")
    imex = _one(
        rendered_objects(helm, {"openshift.enabled": "true", "node.imex.enabled": "true"}),
        "SecurityContextConstraints",
        "node",
    )
    assert (plain["allowHostNetwork"], plain["allowHostPorts"], plain["allowedCapabilities"]) == (
        False,
        False,
        [],
    )
    assert (imex["allowHostNetwork"], imex["allowHostPorts"], imex["allowedCapabilities"]) == (
        True,
        True,
        ["MKNOD"],
    )
