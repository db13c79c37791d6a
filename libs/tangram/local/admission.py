"""Tangram's admission webhook on this machine, as the Helm chart deploys it in a cluster.

The chart's admission objects (its ServiceAccount, ClusterRole and Role with their bindings, and
the MutatingWebhookConfiguration) are rendered with Helm (`tangram.local.helm`) for the
control plane's Kubernetes version and applied to it, with two changes a pod-less cluster needs:
the configuration's clientConfig points at `https://127.0.0.1:<port>/mutate` instead of the
chart's Service, and the cluster-scoped names can be changed (tests that share one control plane
make them unique). The webhook runs as `python -m services.admission` with a kubeconfig that
authenticates as the chart's ServiceAccount (a bound token from a TokenRequest), so it has exactly
the chart's rights; it makes its own CA and serving certificate for 127.0.0.1, stores them in its
Secret and patches the configuration's caBundle, as in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local import helm
from tangram.local.controlplane import ControlPlane, free_ports

# The chart's objects the webhook needs, by kind; each is the one named "...admission".
WEBHOOK_KINDS = (
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ServiceAccount",
    "MutatingWebhookConfiguration",
)
FIELD_MANAGER = "tangram-local"
TOKEN_S = 3600  # the webhook's token lifetime; the API server here sets no maximum
STOP_S = 30.0


class WebhookError(RuntimeError):
    """The webhook exited, or did not become ready; the message says which, with its log's tail."""


def render(
    settings: Mapping[str, str] = {},
    *,
    namespace: str = helm.NAMESPACE,
    kube_version: str = "1.34.0",
    binary: Path | None = None,
) -> list[dict[str, Any]]:
    """Every object the chart renders with `settings`, for a cluster of `kube_version`."""
    rendered = helm.template(
        settings=settings,
        namespace=namespace,
        kube_version=kube_version,
        binary=binary or helm.find_binary(),
    )
    return [d for d in yaml.safe_load_all(rendered) if d]


def admission_objects(rendered: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rendered objects of `kind` that belong to admission (named "...admission")."""
    return [o for o in rendered if o["kind"] == kind and "admission" in o["metadata"]["name"]]


def webhook_objects(
    rendered: Sequence[dict[str, Any]],
    *,
    port: int,
    configuration: str | None = None,
    namespace_selector: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The chart's webhook objects, in the order to apply them, changed to run off-cluster: the
    webhook called at 127.0.0.1:`port`; with `configuration`, the cluster-scoped objects (the
    ClusterRole, its binding and the MutatingWebhookConfiguration) named that, and the ClusterRole
    granting its rights on that configuration; with `namespace_selector`, the pods of only the
    namespaces it selects are sent to the webhook."""
    found = {kind: admission_objects(rendered, kind) for kind in WEBHOOK_KINDS}
    for kind, objects in found.items():
        if len(objects) != 1:
            raise WebhookError(f"the chart rendered {len(objects)} admission {kind} objects, not 1")
    cluster_role, cluster_binding, role, role_binding, account, config = (
        found[kind][0] for kind in WEBHOOK_KINDS
    )
    if configuration is not None:
        cluster_role["metadata"]["name"] = configuration
        cluster_binding["metadata"]["name"] = cluster_binding["roleRef"]["name"] = configuration
        for rule in cluster_role["rules"]:
            if "resourceNames" in rule:
                rule["resourceNames"] = [configuration]
        config["metadata"]["name"] = configuration
    (webhook,) = config["webhooks"]
    webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    if namespace_selector is not None:
        webhook["namespaceSelector"] = dict(namespace_selector)
    return [cluster_role, cluster_binding, role, role_binding, account, config]


async def _request(kube: Any, what: str, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    return await call_json(
        what,
        kube.call_api(
            path,
            method,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            **kwargs,
        ),
    )


async def _path(kube: Any, obj: Mapping[str, Any]) -> str:
    """The object's URL path, from the API server's discovery of its group and version."""
    api_version = obj["apiVersion"]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    listing = await _request(
        kube, f"discover {api_version}", "GET", base, header_params={"Accept": "application/json"}
    )
    resources = {r["kind"]: r for r in listing["resources"] if "/" not in r["name"]}
    resource = resources[obj["kind"]]
    namespace = f"/namespaces/{obj['metadata']['namespace']}" if resource["namespaced"] else ""
    return f"{base}{namespace}/{resource['name']}/{obj['metadata']['name']}"


async def apply(kube: Any, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
    """Server-side apply of `obj` as it is (created when missing), every field validated."""
    return await _request(
        kube,
        f"apply {obj['kind']} {obj['metadata']['name']}",
        "PATCH",
        await _path(kube, obj),
        query_params=[("fieldManager", field_manager), ("fieldValidation", "Strict")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=obj,
    )


async def delete(kube: Any, obj: Mapping[str, Any]) -> None:
    """Delete `obj`; one that is gone already is no error."""
    try:
        await _request(
            kube, f"delete {obj['kind']} {obj['metadata']['name']}", "DELETE", await _path(kube, obj)
        )
    except KubeApiError as error:
        if not error.not_found:
            raise


async def service_account_kubeconfig(
    plane: ControlPlane,
    kube: Any,
    namespace: str,
    account: str,
    path: Path,
    *,
    token_s: int = TOKEN_S,
    pod: Mapping[str, Any] | None = None,
) -> Path:
    """A kubeconfig (written to `path`, mode 0600) that authenticates as `namespace/account` with
    a fresh bound token valid `token_s` seconds; with `pod`, the token is bound to that Pod as the
    kubelet projects it, and so names the Pod's node to the API server."""
    spec: dict[str, Any] = {"expirationSeconds": token_s}
    if pod is not None:
        metadata = pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata["name"],
            "uid": metadata["uid"],
        }
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    token = await call(
        f"request a token for ServiceAccount {namespace}/{account}",
        CoreV1Api(kube).create_namespaced_service_account_token(account, namespace, request),
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {"server": plane.server, "certificate-authority": str(plane.endpoints.ca_file)},
            }
        ],
        "users": [{"name": account, "user": {"token": token.status.token}}],
        "contexts": [
            {"name": "test", "context": {"cluster": "test", "user": account, "namespace": namespace}}
        ],
        "current-context": "test",
    }
    return _write_private(path, yaml.safe_dump(config))


def _write_private(path: Path, text: str) -> Path:
    """`text` in `path`, readable by its owner only (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)
    return path


@dataclass
class WebhookProcess:
    """One running `python -m services.admission`; `health` is its /healthz, /readyz, /metrics base URL."""

    process: subprocess.Popen[bytes]
    health: str
    log: Path

    def stop(self, timeout: float = STOP_S) -> int:
        """SIGTERM (a graceful stop), SIGKILL if it is not gone within `timeout`; its exit code."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    async def ready(self) -> bool:
        """Whether /readyz answers 200; WebhookError when the process has exited."""
        if self.process.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
            raise WebhookError(f"the admission webhook exited {self.process.returncode}:\n{tail}")
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{self.health}/readyz") as answer:
                return answer.status == 200
        except aiohttp.ClientError:
            return False


@dataclass
class LocalWebhook:
    """The webhook's objects, applied, and what starts its process with their settings."""

    namespace: str
    configuration: str  # the MutatingWebhookConfiguration's name
    port: int  # where the API server calls it (HTTPS)
    health_port: int
    kubeconfig: Path  # the ServiceAccount's
    log: Path
    objects: list[dict[str, Any]] = field(repr=False)

    def start(self, *args: str) -> WebhookProcess:
        """A webhook process with these settings, and `args` besides; its output appended to `log`."""
        command = [
            sys.executable,
            "-m",
            "services.admission",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            "--cert-host=127.0.0.1",
            f"--webhook-configuration={self.configuration}",
            f"--health-port={self.health_port}",
            *args,
        ]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
        return WebhookProcess(process, f"http://127.0.0.1:{self.health_port}", self.log)


async def install(
    plane: ControlPlane,
    kube: Any,
    *,
    namespace: str,
    kubeconfig: Path,
    log: Path,
    kube_version: str,
    configuration: str | None = None,
    namespace_selector: Mapping[str, Any] | None = None,
    token_s: int = TOKEN_S,
    field_manager: str = FIELD_MANAGER,
    binary: Path | None = None,
) -> LocalWebhook:
    """The chart's webhook objects for `namespace` (which must exist) applied to the control plane,
    and the ServiceAccount's kubeconfig written to `kubeconfig`; start the process with
    `LocalWebhook.start` and remove the objects with `uninstall`."""
    port, health = free_ports(2)
    rendered = render(namespace=namespace, kube_version=kube_version, binary=binary)
    objects = webhook_objects(
        rendered, port=port, configuration=configuration, namespace_selector=namespace_selector
    )
    for obj in objects:
        await apply(kube, obj, field_manager=field_manager)
    account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    config = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")["metadata"]["name"]
    await service_account_kubeconfig(plane, kube, namespace, account, kubeconfig, token_s=token_s)
    return LocalWebhook(namespace, config, port, health, kubeconfig, log, objects)


async def uninstall(kube: Any, webhook: LocalWebhook) -> None:
    """Delete what `install` applied, the configuration first."""
    for obj in reversed(webhook.objects):
        await delete(kube, obj)


async def wait_ready(process: WebhookProcess, timeout_s: float) -> None:
    """Until the process answers /readyz (its certificates made, the caBundle patched)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await process.ready():
        if loop.time() > deadline:
            raise WebhookError(
                f"the admission webhook not ready within {timeout_s:g} s; its log: {process.log}"
            )
        await asyncio.sleep(0.2)


async def wait_called(kube: Any, namespace: str, timeout_s: float) -> None:
    """Until the API server sends pods to the webhook and it gates them: a pod using a Tangram
    claim, created in a dry run in `namespace` (from a ResourceClaimTemplate made for the probe
    and deleted after it), comes back with the scheduling gate. The API server picks up a new
    webhook configuration a moment after it is created."""
    resource, core = ResourceV1Api(kube), CoreV1Api(kube)
    name = "tangram-admission-probe"
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tangram.dev"}}]}
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    await call(
        f"create ResourceClaimTemplate {namespace}/{name}",
        resource.create_namespaced_resource_claim_template(namespace, template),
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            created = await call(
                f"create Pod {namespace}/{name} (dry run)",
                core.create_namespaced_pod(namespace, pod, dry_run="All"),
            )
            if SCHEDULING_GATE in [g.name for g in created.spec.scheduling_gates or []]:
                return
            if loop.time() > deadline:
                raise WebhookError(
                    f"the API server did not call the admission webhook within {timeout_s:g} s"
                )
            await asyncio.sleep(0.2)
    finally:
        with contextlib.suppress(KubeApiError):
            await call(
                f"delete ResourceClaimTemplate {namespace}/{name}",
                resource.delete_namespaced_resource_claim_template(name, namespace),
            )
