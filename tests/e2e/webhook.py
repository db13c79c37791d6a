"""The admission webhook against the real control plane as the chart deploys it: its objects
applied, its process started with its ServiceAccount's rights, served over TLS
(`tangram.local.admission`, which `tangram cluster up` runs too)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api import KubeApiError, call
from tangram.local import admission
from tangram.local.admission import WebhookProcess as Webhook
from tangram.local.controlplane import ControlPlane
from tests.support.polling import until

FIELD_MANAGER = "tangram-admission-test"


def objects(settings: dict[str, str], namespace: str, kube_version: str = "1.34.0") -> list[dict[str, Any]]:
    return admission.render(settings, namespace=namespace, kube_version=kube_version)


def one(found: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return admission.admission_objects(found, kind)


async def apply(kube: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply of `obj` as it is (created when missing)."""
    return await admission.apply(kube, obj, field_manager=FIELD_MANAGER)


async def delete(kube: Any, obj: dict[str, Any]) -> None:
    with contextlib.suppress(KubeApiError):
        await admission.delete(kube, obj)


async def gates_of(kube: Any, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> list[str]:
    """The scheduling gates of the pod as the API server stores it (dry run: would store it)."""
    core = CoreV1Api(kube)
    kwargs = {"dry_run": "All"} if dry_run else {}
    created = await call(
        f"create Pod {body['metadata']['name']}", core.create_namespaced_pod(namespace, body, **kwargs)
    )
    return [g.name for g in created.spec.scheduling_gates or []]


async def ready(webhook: Webhook) -> bool:
    try:
        return await webhook.ready()
    except admission.WebhookError as error:
        raise AssertionError(f"{error}\n{webhook.log.read_text()}") from None


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
    # cluster-scoped names are made unique, and only this test's namespace is sent to the
    # webhook: the control plane is shared with other tests
    hook = await admission.install(
        controlplane,
        kube,
        namespace=namespace,
        kubeconfig=tmp_path / "kubeconfig",
        log=tmp_path / "admission.log",
        kube_version="1.34.0",
        configuration=f"{unique}-admission",
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        field_manager=FIELD_MANAGER,
    )

    def start() -> Webhook:
        return hook.start(
            "--check-interval=1",  # certificates and caBundle checked every second here
            "--log-level=debug",
            *args,
        )

    state = Served(namespace, hook.configuration, start(), hook.port, start)
    try:
        await until("the webhook ready", lambda: ready(state.webhook))
        yield state
    finally:
        code = state.webhook.stop()
        for obj in reversed(hook.objects):
            await delete(kube, obj)
        if make_namespace:
            with contextlib.suppress(KubeApiError):
                await call("delete namespace", CoreV1Api(kube).delete_namespace(namespace))
        assert code == 0, hook.log.read_text()
