"""A pod whose claim no node of the cluster could hold is handed to cluster-autoscaler, on the real
control plane with cluster-autoscaler's ProvisioningRequest CRD installed: a ProvisioningRequest
and its PodTemplate (the pod without Tangram's gate, its claims kept), owned by the pod; when a
node that fits joins, its slices appear, the claim is decided again, and the request goes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiextensionsV1Api, CoreV1Api, CustomObjectsApi

from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane, register_node
from tangram.local.kubelet import NodeKubelet
from tangram.local.processes import SimNode
from tests.e2e.kubecluster import Node, claim_of, pod, started_node, template, until, wait_for_pod

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

CRD = Path(__file__).parent / "crds" / "provisioningrequests.yaml"
GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
ADA = 'device.attributes["gpu.tangram.dev"].architecture == "ada"'


async def served(kube: Any) -> None:
    """cluster-autoscaler's CRD installed once per control plane, and established."""
    extensions = ApiextensionsV1Api(kube)
    with contextlib.suppress(KubeApiError):
        await call(
            "create the CRD", extensions.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
        )

    async def established() -> bool:
        crd = await extensions.read_custom_resource_definition("provisioningrequests.autoscaling.x-k8s.io")
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    await until("the ProvisioningRequest CRD established", established)


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    await served(kube)
    async with started_node(controlplane, kube, unique, decide=True) as started:
        yield started


async def events(node: Node, pod_name: str, reason: str) -> list[str]:
    found = await node.core.list_namespaced_event(node.namespace)
    return [str(e.message) for e in found.items if e.reason == reason and e.involved_object.name == pod_name]


async def test_a_pod_no_node_could_hold_asks_the_autoscaler_and_runs_on_the_node_that_joins(
    node: Node,
) -> None:
    ns = node.namespace
    custom = CustomObjectsApi(node.api)
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu.tangram.dev", "selectors": [{"cel": {"expression": ADA}}]},
    }
    await node.resource.create_namespaced_resource_claim_template(
        ns, template("ada", ns, {"devices": {"requests": [request]}})
    )
    manifest = pod("render", ns, None, {"gpu": {"resourceClaimTemplateName": "ada"}}, gates=[SCHEDULING_GATE])
    manifest["metadata"]["labels"] = {"app": "render"}
    await node.core.create_namespaced_pod(ns, manifest)

    async def asked() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await custom.get_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, "tangram-render"
            )
        except Exception:
            return None
        return found

    provreq = await until("a ProvisioningRequest for the pod", asked)
    waiting = await node.core.read_namespaced_pod("render", ns)
    assert provreq["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    assert provreq["spec"]["podSets"] == [{"count": 1, "podTemplateRef": {"name": "tangram-render"}}]
    [owner] = provreq["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "render", waiting.metadata.uid)
    made = await node.core.read_namespaced_pod_template("tangram-render", ns)
    assert made.template.spec.scheduling_gates is None  # the pod as it would be scheduled
    assert [c.resource_claim_template_name for c in made.template.spec.resource_claims] == ["ada"]
    assert made.template.metadata.labels == {"app": "render"}
    [message] = await events(node, "render", "TangramProvisioningRequested")
    assert f"asked cluster-autoscaler for one through ProvisioningRequest {ns}/tangram-render" in message
    assert [g.name for g in waiting.spec.scheduling_gates] == [SCHEDULING_GATE]

    # the node the autoscaler would add: an L40S node joins; its slices appear, the claim is decided
    joined = f"n2-{ns.rsplit('-', 1)[-1]}"
    await register_node(node.api, joined)
    node.cluster.add_node(SimNode(joined, "l40s-8"))
    stop = asyncio.Event()
    kubelet = NodeKubelet(node.api, node=joined, dra_socket=node.cluster.dra_socket(joined))
    task = asyncio.create_task(kubelet.run(stop))
    try:
        running = await wait_for_pod(node, "render", "Running")
        assert running.spec.node_name == joined
        claim = await claim_of(node, running, "gpu")
        assert [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]] == [joined]

        async def withdrawn() -> bool:
            return await asked() is None

        await until("the ProvisioningRequest deleted once the claim is allocated", withdrawn)
        with pytest.raises(Exception, match="Not Found"):
            await node.core.read_namespaced_pod_template("tangram-render", ns)
        await node.core.delete_namespaced_pod("render", ns)
        await until("the pod gone", lambda: _gone(node, "render"))
    finally:
        stop.set()
        await task
        with contextlib.suppress(KubeApiError):
            await call("delete node", CoreV1Api(node.api).delete_node(joined))


async def _gone(node: Node, name: str) -> bool:
    try:
        await node.core.read_namespaced_pod(name, node.namespace)
    except Exception:
        return True
    return False
