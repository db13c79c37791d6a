"""Priority and preemption of Tangram's claims on the real control plane.

Pods carry a PriorityClass (the API server's Priority admission sets `spec.priority` and
`spec.preemptionPolicy`); Tangram asks their claims by priority, and a claim that does not fit
preempts the cheapest claims of lower priority: their pods are evicted through the Eviction API
(a PodDisruptionBudget that forbids it keeps its pod), Events on both sides name the other, and
the preemptor runs on the devices they freed. Equal priority and `preemptionPolicy: Never` wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import PolicyV1Api, SchedulingV1Api

from tangram.kubernetes.api import KubeApiError
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane
from tests.e2e.kubecluster import (
    Node,
    claim_of,
    gpus_template,
    pod,
    pod_events,
    pod_gone,
    started_node,
    until,
    wait_for_pod,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

CLASSES = {"low": (100, "PreemptLowerPriority"), "high": (1000, "PreemptLowerPriority")}
WAITING = {"low-never": (100, "Never"), "high-never": (1000, "Never")}


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    scheduling = SchedulingV1Api(kube)
    made = []
    for suffix, (value, policy) in {**CLASSES, **WAITING}.items():
        name = f"{unique}-{suffix}"
        await scheduling.create_priority_class(
            {"metadata": {"name": name}, "value": value, "preemptionPolicy": policy}
        )
        made.append(name)
    try:
        async with started_node(controlplane, kube, unique, decide=True) as started:
            yield started
    finally:
        for name in made:
            with contextlib.suppress(KubeApiError, Exception):
                await scheduling.delete_priority_class(name)


async def run(node: Node, name: str, gpus: int, priority: str, labels: dict[str, str] | None = None) -> None:
    """A gated pod of `gpus` whole GPUs (never GPU 0) at PriorityClass `<namespace>-<priority>`."""
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template(name, ns, gpus))
    manifest = pod(name, ns, None, {"gpus": {"resourceClaimTemplateName": name}}, gates=[SCHEDULING_GATE])
    manifest["spec"]["priorityClassName"] = f"{ns}-{priority}"
    if labels:
        manifest["metadata"]["labels"] = labels
    await node.core.create_namespaced_pod(ns, manifest)


async def devices_of(node: Node, name: str) -> set[str]:
    claim = await claim_of(node, await wait_for_pod(node, name, "Running"), "gpus")
    return {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}


async def said(node: Node, pod_name: str, reason: str) -> str:
    async def first() -> str | None:
        messages = await pod_events(node, pod_name, reason)
        return messages[0] if messages else None

    message: str = await until(f"a {reason} Event on pod {pod_name}", first)
    return message


async def still_gated(node: Node, name: str) -> bool:
    found = await node.core.read_namespaced_pod(name, node.namespace)
    return [g.name for g in found.spec.scheduling_gates or []] == [SCHEDULING_GATE]


async def test_a_high_priority_pod_preempts_the_cheapest_victim_a_budget_allows_and_runs_on_its_devices(
    node: Node,
) -> None:
    ns = node.namespace
    # GPUs 1-7: a 4-GPU and a 3-GPU pod of low priority; a budget keeps the 3-GPU one
    await run(node, "batch", 4, "low")
    await run(node, "kept", 3, "low", labels={"app": "kept"})
    batch, kept = await devices_of(node, "batch"), await devices_of(node, "kept")
    await PolicyV1Api(node.api).create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "kept"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kept"}}},
        },
    )

    # an equal priority and a pod that never preempts both wait, preempting nothing
    await run(node, "equal", 3, "low")
    await run(node, "polite", 3, "high-never")
    for name in ("equal", "polite"):
        message = await said(node, name, "TangramUnschedulable")
        assert "preempting" not in message, message
        assert await still_gated(node, name)
    for name in ("equal", "polite"):
        await node.core.delete_namespaced_pod(name, ns)

    # 3 GPUs at high priority: preempting "kept" alone would do (and is what the rules pick
    # without the budget), but the budget forbids it: "batch" is evicted instead
    await run(node, "urgent", 3, "high")
    preempting = await said(node, "urgent", "TangramPreempting")
    assert f"preempting pod {ns}/batch (priority 100)" in preempting, preempting
    preempted = await said(node, "batch", "TangramPreempted")
    assert f"preempted by pod {ns}/urgent (priority 1000)" in preempted, preempted
    urgent = await devices_of(node, "urgent")
    assert len(urgent) == 3 and urgent <= batch, (urgent, batch)
    assert await pod_gone(node, "batch")
    assert await devices_of(node, "kept") == kept  # untouched, still running
    assert not await pod_events(node, "kept", "TangramPreempted")


async def test_under_contention_the_highest_priority_waiting_is_placed_first(node: Node) -> None:
    ns = node.namespace
    await run(node, "filler", 7, "low")
    await devices_of(node, "filler")
    # waiting in arrival order: two low-priority pods, then a high-priority one (none preempts)
    for name, priority in (
        ("first-low", "low-never"),
        ("second-low", "low-never"),
        ("late-high", "high-never"),
    ):
        await run(node, name, 4, priority)
        await said(node, name, "TangramUnschedulable")
    await node.core.delete_namespaced_pod("filler", ns)
    # 7 GPUs free fit one 4-GPU claim: the late high-priority one, not the first to arrive
    assert len(await devices_of(node, "late-high")) == 4
    assert await still_gated(node, "first-low") and await still_gated(node, "second-low")


async def test_a_priority_written_into_the_pod_spec_by_hand_is_refused_and_preempts_nothing(
    node: Node,
) -> None:
    """The priority Tangram reads is the API server's word (its Priority admission, from a
    PriorityClass an administrator made): a tenant cannot claim one by writing it."""
    ns = node.namespace
    await run(node, "victim", 7, "low")
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template("forged", ns, 7))
    manifest = pod(
        "forged", ns, None, {"gpus": {"resourceClaimTemplateName": "forged"}}, gates=[SCHEDULING_GATE]
    )
    manifest["spec"]["priority"] = 2_000_000_000
    with pytest.raises(Exception, match="priority") as refused:
        await node.core.create_namespaced_pod(ns, manifest)
    assert "403" in str(refused.value) or "Forbidden" in str(refused.value)
    assert len(await devices_of(node, "victim")) == 7
    assert not await pod_events(node, "victim", "TangramPreempted")


async def test_kube_scheduler_alone_preempts_nothing_for_a_device_claim(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    """The comparison: with kube-scheduler deciding (no gate), a high-priority pod whose claim the
    node's GPUs cannot hold while a low-priority pod uses them stays Pending, and the low-priority
    pod runs on: the DRA plugin of these releases does not preempt for device claims."""
    scheduling = SchedulingV1Api(kube)
    for suffix, (value, policy) in CLASSES.items():
        await scheduling.create_priority_class(
            {"metadata": {"name": f"{unique}-{suffix}"}, "value": value, "preemptionPolicy": policy}
        )
    try:
        async with started_node(controlplane, kube, unique) as node:
            ns = node.namespace
            for name, priority in (("holder", "low"), ("urgent", "high")):
                await node.resource.create_namespaced_resource_claim_template(ns, gpus_template(name, ns, 7))
                manifest = pod(name, ns, None, {"gpus": {"resourceClaimTemplateName": name}})
                manifest["spec"]["priorityClassName"] = f"{unique}-{priority}"
                await node.core.create_namespaced_pod(ns, manifest)
                if name == "holder":
                    await wait_for_pod(node, "holder", "Running")
            message = await said(node, "urgent", "FailedScheduling")
            assert "cannot allocate all claims" in message or "resourceclaim" in message.lower(), message
            assert (await node.core.read_namespaced_pod("holder", ns)).status.phase == "Running"
            assert not await pod_gone(node, "holder")
            found = await node.core.read_namespaced_pod("urgent", ns)
            assert found.status.phase == "Pending" and not found.status.nominated_node_name
            # gone before this node goes: a pending pod left behind would be bound by kube-scheduler
            # to the next test's node (the control plane is shared), taking its GPUs
            for name in ("urgent", "holder"):
                await node.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            for name in ("urgent", "holder"):
                await until(f"pod {name} gone", lambda name=name: pod_gone(node, name))
    finally:
        for suffix in CLASSES:
            with contextlib.suppress(KubeApiError, Exception):
                await scheduling.delete_priority_class(f"{unique}-{suffix}")
