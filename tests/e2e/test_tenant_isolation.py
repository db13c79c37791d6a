"""One tenant's hostile claims beside another namespace's plain ones, against the real control plane.

A tenant with rights only to create pods and claims in its namespace writes claims whose selectors
fail while evaluated, an opaque config that does not parse and a count no node has. Each of its
pods stays held with a Warning Event naming its own claim's fault; the other namespace's pods, made
between them, are allocated by Tangram and run; the allocator never fails a delivery.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane
from tests.e2e.kubecluster import (
    DRIVER,
    NOT_GPU0,
    Node,
    allocator_state,
    claim_of,
    pod,
    started_node,
    template,
    until,
    wait_for_pod,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

ATTR = f'device.attributes["{DRIVER}"]'
HOSTILE_SELECTORS = {
    "division": (f"{ATTR}.index / 0 == 1", "division by zero"),
    "index": (f"[1, 2][{ATTR}.index + 5] == 1", "index out of bounds"),
    "overflow": (f"{ATTR}.index + 9223372036854775807 > 0", "overflow"),
    "mapkey": (f'{{"a": 1}}[{ATTR}.uuid] == 1', "no such key"),
}


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique, decide=True) as started:
        yield started


@pytest.fixture
async def plain_namespace(node: Node) -> AsyncIterator[str]:
    name = f"{node.namespace}-plain"
    await call("create namespace", node.core.create_namespace({"metadata": {"name": name}}))
    try:
        yield name
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", CoreV1Api(node.api).delete_namespace(name))


def request(**exactly: Any) -> dict[str, Any]:
    return {"name": "gpus", "exactly": {"deviceClassName": DRIVER, **exactly}}


def hostile_specs() -> dict[str, dict[str, Any]]:
    specs = {
        name: {"devices": {"requests": [request(selectors=[{"cel": {"expression": expression}}])]}}
        for name, (expression, _) in HOSTILE_SELECTORS.items()
    }
    specs["config"] = {
        "devices": {
            "requests": [request(count=2)],
            "config": [
                {
                    "requests": ["gpus"],
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": "gpu.tangram.dev/v1alpha1",
                            "kind": "TopologyConfig",
                            "interconnect": "warp",
                        },
                    },
                }
            ],
        }
    }
    specs["count"] = {"devices": {"requests": [request(count=9)]}}
    return specs


async def warning(node: Node, namespace: str, pod_name: str) -> str | None:
    events = await node.core.list_namespaced_event(namespace)
    for event in events.items:
        involved = event.involved_object
        if (event.type, event.reason, involved.kind, involved.name) == (
            "Warning",
            "TangramUnschedulable",
            "Pod",
            pod_name,
        ):
            return str(event.message)
    return None


async def test_a_tenants_hostile_claims_fail_alone_and_another_namespaces_pods_run(
    node: Node, plain_namespace: str
) -> None:
    tenant = node.namespace
    hostile = hostile_specs()
    for name, spec in hostile.items():
        await node.resource.create_namespaced_resource_claim_template(tenant, template(name, tenant, spec))
    plain_spec = {"devices": {"requests": [request(count=2, selectors=[{"cel": {"expression": NOT_GPU0}}])]}}
    await node.resource.create_namespaced_resource_claim_template(
        plain_namespace, template("pair", plain_namespace, plain_spec)
    )

    # hostile and plain pods in turn: each plain one is decided after hostile ones were
    plain_pods = [f"plain-{n}" for n in range(3)]
    hostile_names = list(hostile)
    for n, name in enumerate(hostile_names):
        source = {"gpus": {"resourceClaimTemplateName": name}}
        await node.core.create_namespaced_pod(
            tenant, pod(f"hostile-{name}", tenant, None, source, gates=[SCHEDULING_GATE])
        )
        if n < len(plain_pods):
            source = {"gpus": {"resourceClaimTemplateName": "pair"}}
            await node.core.create_namespaced_pod(
                plain_namespace, pod(plain_pods[n], plain_namespace, None, source, gates=[SCHEDULING_GATE])
            )

    plain_node = Node(node.name, plain_namespace, node.cluster, node.api)
    held: list[str] = []
    for name in plain_pods:
        running = await wait_for_pod(plain_node, name, "Running")
        assert running.spec.node_name == node.name
        claim = await claim_of(plain_node, running, "gpus")
        results = claim["status"]["allocation"]["devices"]["results"]
        held += [r["device"] for r in results]
    assert len(held) == len(set(held)) == 6 and "gpu-0" not in held, held

    for name in hostile_names:
        pod_name = f"hostile-{name}"
        message = await until(
            f"a Warning Event on {pod_name}",
            lambda pod_name=pod_name: warning(node, tenant, pod_name),  # type: ignore[misc]
        )
        if name in HOSTILE_SELECTORS:
            assert "CEL runtime error" in message and HOSTILE_SELECTORS[name][1] in message, message
        elif name == "config":
            assert "opaque.parameters" in message and "interconnect" in message, message
        else:
            assert "only 8 devices of this hardware match (needs 9)" in message, message
        found = await node.core.read_namespaced_pod(pod_name, tenant)
        assert [g.name for g in found.spec.scheduling_gates] == [SCHEDULING_GATE]
        assert found.spec.node_name is None

    # the allocator holds exactly the plain claims, and no delivery of any claim failed
    state = await allocator_state(node.cluster)
    assert sorted(state["allocated"].get(node.name, {})) == sorted(held)
    log = node.cluster.service("allocator").log_path.read_text()
    assert "handler failed" not in log and "sent to dead letter" not in log
