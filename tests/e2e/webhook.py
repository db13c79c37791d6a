"""The admission webhook against the real control plane as the chart deploys it: its objects
applied, its process started with its ServiceAccount's rights, served over TLS."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api import KubeApiError, call
from tangram.local import helm as chart
from tangram.local.controlplane import ControlPlane, free_ports
from tests.deploy.apiserver import api_request, api_resources
from tests.support.polling import until


def objects(settings: dict[str, str], namespace: str, kube_version: str = "1.34.0") -> list[dict[str, Any]]:
    rendered = chart.template(
        settings=settings, namespace=namespace, kube_version=kube_version, binary=chart.find_binary()
    )
    return [d for d in yaml.safe_load_all(rendered) if d]


def one(found: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in found if o["kind"] == kind and "admission" in o["metadata"]["name"]]


async def apply(kube: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply of `obj` as it is (created when missing)."""
    resource = (await api_resources(kube, obj["apiVersion"]))[obj["kind"]]
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    namespace = f"/namespaces/{obj['metadata']['namespace']}" if resource["namespaced"] else ""
    return await api_request(
        kube,
        "PATCH",
        f"{base}{namespace}/{resource['name']}/{obj['metadata']['name']}",
        query_params=[("fieldManager", "tangram-admission-test"), ("fieldValidation", "Strict")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=obj,
    )


async def delete(kube: Any, obj: dict[str, Any]) -> None:
    resource = (await api_resources(kube, obj["apiVersion"]))[obj["kind"]]
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    namespace = f"/namespaces/{obj['metadata']['namespace']}" if resource["namespaced"] else ""
    with contextlib.suppress(AssertionError):
        await api_request(kube, "DELETE", f"{base}{namespace}/{resource['name']}/{obj['metadata']['name']}")


async def gates_of(kube: Any, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> list[str]:
    """The scheduling gates of the pod as the API server stores it (dry run: would store it)."""
    core = CoreV1Api(kube)
    kwargs = {"dry_run": "All"} if dry_run else {}
    created = await call(
        f"create Pod {body['metadata']['name']}", core.create_namespaced_pod(namespace, body, **kwargs)
    )
    return [g.name for g in created.spec.scheduling_gates or []]


@dataclass
class Webhook:
    process: subprocess.Popen[bytes]
    health: str
    log: Path

    def stop(self) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


async def ready(webhook: Webhook) -> bool:
    if webhook.process.poll() is not None:
        raise AssertionError(f"the webhook exited {webhook.process.returncode}:\n{webhook.log.read_text()}")
    try:
        async with aiohttp.ClientSession() as session, session.get(f"{webhook.health}/readyz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


def write_yaml(path: Path, obj: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(obj))
    return path


async def service_account_kubeconfig(
    controlplane: ControlPlane, kube: Any, namespace: str, account: str, path: Path
) -> Path:
    """A kubeconfig that authenticates as `namespace/account` with a fresh bound token."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    token = await call(
        "request a service-account token",
        CoreV1Api(kube).create_namespaced_service_account_token(account, namespace, request),
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {
                    "server": controlplane.server,
                    "certificate-authority": str(controlplane.endpoints.ca_file),
                },
            }
        ],
        "users": [{"name": account, "user": {"token": token.status.token}}],
        "contexts": [
            {"name": "test", "context": {"cluster": "test", "user": account, "namespace": namespace}}
        ],
        "current-context": "test",
    }
    return write_yaml(path, config)


@dataclass
class Served:
    namespace: str
    configuration: str
    webhook: Webhook
    port: int
    start: Callable[[], Webhook]  # another process of the webhook with the same settings


@contextlib.asynccontextmanager
async def serving(
    controlplane: ControlPlane,
    kube: Any,
    unique: str,
    tmp_path: Path,
    *args: str,
    make_namespace: bool = True,
) -> AsyncIterator[Served]:
    """The chart's webhook objects for this test's namespace (`unique`), served by the real
    process started with `args` besides the test's own."""
    namespace = unique
    if make_namespace:
        await call("create namespace", CoreV1Api(kube).create_namespace({"metadata": {"name": namespace}}))
    rendered = objects({}, namespace)
    configuration = f"{unique}-admission"
    # cluster-scoped names are made unique: the control plane is shared with other tests
    (cluster_role,) = one(rendered, "ClusterRole")
    (cluster_binding,) = one(rendered, "ClusterRoleBinding")
    (role,) = one(rendered, "Role")
    (role_binding,) = one(rendered, "RoleBinding")
    (account,) = one(rendered, "ServiceAccount")
    (config,) = one(rendered, "MutatingWebhookConfiguration")
    cluster_role["metadata"]["name"] = cluster_binding["roleRef"]["name"] = cluster_binding["metadata"][
        "name"
    ] = configuration
    for rule in cluster_role["rules"]:
        if "resourceNames" in rule:
            rule["resourceNames"] = [configuration]
    config["metadata"]["name"] = configuration
    port, health = free_ports(2)
    (webhook_spec,) = config["webhooks"]
    webhook_spec["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    webhook_spec["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    made = [cluster_role, cluster_binding, role, role_binding, account, config]
    for obj in made:
        await apply(kube, obj)
    kubeconfig = await service_account_kubeconfig(
        controlplane, kube, namespace, account["metadata"]["name"], tmp_path / "kubeconfig"
    )
    log = tmp_path / "admission.log"

    def start() -> Webhook:
        command = [
            sys.executable,
            "-m",
            "services.admission",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            "--host=127.0.0.1",
            f"--port={port}",
            "--cert-host=127.0.0.1",
            f"--webhook-configuration={configuration}",
            f"--health-port={health}",
            "--check-interval=1",  # certificates and caBundle checked every second here
            "--log-level=debug",
            *args,
        ]
        with log.open("ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
        return Webhook(process, f"http://127.0.0.1:{health}", log)

    state = Served(namespace, configuration, start(), port, start)
    try:
        await until("the webhook ready", lambda: ready(state.webhook))
        yield state
    finally:
        code = state.webhook.stop()
        for obj in reversed(made):
            await delete(kube, obj)
        if make_namespace:
            with contextlib.suppress(KubeApiError):
                await call("delete namespace", CoreV1Api(kube).delete_namespace(namespace))
        assert code == 0, log.read_text()
