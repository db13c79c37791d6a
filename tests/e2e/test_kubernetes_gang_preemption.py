"""A group of pods of high priority preempts as one, on the real control plane: two low-priority
pods, one on each of two nodes, leave no node room for the group's pods; both are evicted at once
and the group runs whole on the two nodes they freed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import SchedulingV1Api

from tangram.kubernetes.api import KubeApiError
from tangram.kubernetes.objects.gangs import GANG_LABEL, GANG_SIZE_ANNOTATION
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.kubernetes.objects.preempting import PREEMPTED_REASON
from tangram.local.controlplane import ControlPlane
from tangram.local.processes import SimNode
from tests.e2e.kubecluster import (
    Node,
    gpus_template,
    pod,
    pod_events,
    pod_gone,
    started_fleet,
    until,
    wait_for_pod,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

PRIORITIES = {"low": 100, "high": 1000}


@pytest.fixture
async def fleet(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[list[Node]]:
    scheduling = SchedulingV1Api(kube)
    for suffix, value in PRIORITIES.items():
        await scheduling.create_priority_class({"metadata": {"name": f"{unique}-{suffix}"}, "value": value})
    tag = unique.rsplit("-", 1)[-1]
    sims = [SimNode(f"n{i}-{tag}", "l40s-8") for i in (1, 2)]
    try:
        async with started_fleet(controlplane, kube, unique, sims, decide=True) as nodes:
            yield nodes
    finally:
        for suffix in PRIORITIES:
            with contextlib.suppress(KubeApiError, Exception):
                await scheduling.delete_priority_class(f"{unique}-{suffix}")


async def run(node: Node, name: str, gpus: int, priority: str, group: str | None = None) -> None:
    """A gated pod of `gpus` whole GPUs (GPU 0 of each node is not Kubernetes') at `priority`."""
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template(name, ns, gpus))
    manifest = pod(name, ns, None, {"gpus": {"resourceClaimTemplateName": name}}, gates=[SCHEDULING_GATE])
    manifest["spec"]["priorityClassName"] = f"{ns}-{priority}"
    if group is not None:
        manifest["metadata"]["labels"] = {GANG_LABEL: group}
        manifest["metadata"]["annotations"] = {GANG_SIZE_ANNOTATION: "2"}
    await node.core.create_namespaced_pod(ns, manifest)


async def test_a_high_priority_group_preempts_a_pod_on_each_of_two_nodes_and_runs_whole(
    fleet: list[Node],
) -> None:
    first = fleet[0]
    for i in (1, 2):
        await run(first, f"batch-{i}", 5, "low")
    batch_nodes = {(await wait_for_pod(first, f"batch-{i}", "Running")).spec.node_name for i in (1, 2)}
    assert batch_nodes == {n.name for n in fleet}  # 5 + 5 GPUs fit no one node of 7

    for i in (1, 2):
        await run(first, f"train-{i}", 6, "high", group="train")
    placed = {(await wait_for_pod(first, f"train-{i}", "Running")).spec.node_name for i in (1, 2)}
    assert placed == batch_nodes
    for i in (1, 2):
        assert await until(f"batch-{i} evicted", lambda i=i: pod_gone(first, f"batch-{i}"))
        [message] = await pod_events(first, f"batch-{i}", PREEMPTED_REASON)
        assert "priority 1000" in message, message
