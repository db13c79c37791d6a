"""Groups of pods (gangs) on the real control plane: a group's pods run all together or none does,
and two groups that cannot both fit never deadlock. kube-scheduler alone, the comparison, places
such groups pod by pod and leaves both half-placed, each holding GPUs the other waits for.

The node is a simulated HGX H200 whose GPUs 1-7 the claims here may take (GPU 0 keeps MIG
instances Kubernetes does not know of).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import CustomObjectsApi

from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import NEWEST, ControlPlane
from tests.e2e.kubecluster import (
    Node,
    claim_of,
    gang_member,
    gpus_template,
    pod,
    started_node,
    until,
    wait_for_pod,
    why,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique, decide=True) as started:
        yield started


async def allocated(node: Node, name: str) -> bool:
    """Whether the claim of the pod's "gpus" entry exists and is allocated."""
    found = await node.core.read_namespaced_pod(name, node.namespace)
    statuses = found.status.resource_claim_statuses or []
    names = [s.resource_claim_name for s in statuses if s.name == "gpus" and s.resource_claim_name]
    if not names:
        return False
    claim = await node.resource.read_namespaced_resource_claim(names[0], node.namespace)
    return claim.status is not None and claim.status.allocation is not None


async def said(node: Node, pod_names: list[str], reason: str, containing: str) -> str:
    """The message of an Event on one of `pod_names` (the first found) with that reason and text."""

    async def found() -> str | None:
        events = await node.core.list_namespaced_event(node.namespace)
        for e in events.items:
            if e.reason == reason and e.involved_object.name in pod_names and containing in str(e.message):
                return str(e.message)
        return None

    try:
        message: str = await until(f"a {reason} Event on pod {pod_names} saying {containing!r}", found)
    except AssertionError as error:
        raise AssertionError(f"{error}:\n{await why(node, pod_names[-1])}") from None
    return message


async def gone(node: Node, names: list[str]) -> None:
    for name in names:
        await node.core.delete_namespaced_pod(name, node.namespace, grace_period_seconds=0)

    async def all_gone() -> bool:
        listed = await node.core.list_namespaced_pod(node.namespace)
        return not {p.metadata.name for p in listed.items} & set(names)

    await until(f"pods {names} gone", all_gone)


async def devices(node: Node, name: str) -> set[str]:
    claim = await claim_of(node, await wait_for_pod(node, name, "Running"), "gpus")
    return {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}


async def test_a_group_of_four_runs_only_when_all_four_fit_never_partly(node: Node) -> None:
    await gang_member(node, "filler", 4, None, 1)
    await devices(node, "filler")
    # 3 GPUs free: three of the four 1-GPU pods would fit, and none may hold one
    names = [f"train-{i}" for i in range(4)]
    for name in names:
        await gang_member(node, name, 1, "train", 4)
    message = await said(node, [names[0]], "TangramUnschedulable", "do not all fit")
    assert "group train: its 4 claims do not all fit on the fleet at once, so none is allocated" in message
    for name in names:
        found = await node.core.read_namespaced_pod(name, node.namespace)
        assert [g.name for g in found.spec.scheduling_gates or []] == [SCHEDULING_GATE], name
        assert not await allocated(node, name), name

    await gone(node, ["filler"])
    placed = [await devices(node, name) for name in names]
    assert all(len(d) == 1 for d in placed) and len(set().union(*placed)) == 4


async def test_two_groups_that_cannot_both_fit_do_not_deadlock(node: Node) -> None:
    """Pods of two groups of two 3-GPU pods arrive interleaved on 7 GPUs: one group runs whole,
    the other waits holding nothing, and runs once the first is gone."""
    for name, group in (("a-0", "a"), ("b-0", "b"), ("a-1", "a"), ("b-1", "b")):
        await gang_member(node, name, 3, group, 2)

    async def one_group_running() -> str | None:
        for group in ("a", "b"):
            phases = [
                (await node.core.read_namespaced_pod(f"{group}-{i}", node.namespace)).status.phase
                for i in (0, 1)
            ]
            if phases == ["Running", "Running"]:
                return group
        return None

    first: str = await until("one group's two pods running", one_group_running)
    other = "b" if first == "a" else "a"
    await said(node, [f"{other}-0"], "TangramUnschedulable", "do not all fit")
    assert not await allocated(node, f"{other}-0") and not await allocated(node, f"{other}-1")

    await gone(node, [f"{first}-0", f"{first}-1"])
    assert len((await devices(node, f"{other}-0")) | (await devices(node, f"{other}-1"))) == 6


async def test_kube_scheduler_alone_places_two_groups_pod_by_pod_and_both_wait_for_ever(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    """The comparison: without Tangram's gate, kube-scheduler places each pod as it comes. The
    first pod of each group runs, holding 3 GPUs; the second pod of each finds 1 GPU free and
    waits, and neither group can ever run whole: a deadlock only deleting a group ends."""
    async with started_node(controlplane, kube, unique) as node:
        for name, group in (("a-0", "a"), ("b-0", "b")):
            await gang_member(node, name, 3, group, 2, gated=False)
            await wait_for_pod(node, name, "Running")
        for name, group in (("a-1", "a"), ("b-1", "b")):
            await gang_member(node, name, 3, group, 2, gated=False)
        for name in ("a-1", "b-1"):

            async def refused(name: str = name) -> bool:
                events = await node.core.list_namespaced_event(node.namespace)
                return any(
                    e.reason == "FailedScheduling" and e.involved_object.name == name for e in events.items
                )

            await until(f"kube-scheduler refusing pod {name}", refused)
            assert (await node.core.read_namespaced_pod(name, node.namespace)).status.phase == "Pending"
        for name in ("a-0", "b-0"):
            assert (await node.core.read_namespaced_pod(name, node.namespace)).status.phase == "Running"
        # gone before this node goes: a pending pod left behind would be bound to the next test's node
        await gone(node, ["a-1", "b-1", "a-0", "b-0"])


@pytest.mark.parametrize("release", [NEWEST], ids=[NEWEST.minor], indirect=True)
async def test_a_pod_group_of_the_workload_api_is_placed_whole(node: Node) -> None:
    """Kubernetes 1.37 with GenericWorkload: pods name a PodGroup (gang scheduling, minCount 3) in
    their spec.schedulingGroup, and no label. Two of them wait for the third holding nothing; with
    the third, the three run together."""
    ns = node.namespace
    group = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "trainer", "namespace": ns},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}},
    }
    await CustomObjectsApi(node.api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1beta1", ns, "podgroups", group
    )
    names = [f"wl-{i}" for i in range(3)]

    async def create(name: str) -> None:
        await node.resource.create_namespaced_resource_claim_template(ns, gpus_template(name, ns, 2))
        manifest = pod(name, ns, None, {"gpus": {"resourceClaimTemplateName": name}}, gates=[SCHEDULING_GATE])
        manifest["spec"]["schedulingGroup"] = {"podGroupName": "trainer"}
        await node.core.create_namespaced_pod(ns, manifest)

    for name in names[:2]:
        await create(name)
    # Said on the pod whose claim was asked second, which need not be the one created second.
    message = await said(node, names[:2], "TangramUnschedulable", "2 of its 3 pods")
    assert "group trainer: 2 of its 3 pods have all their claims asked" in message
    assert not await allocated(node, names[0]) and not await allocated(node, names[1])
    await create(names[2])
    placed = [await devices(node, name) for name in names]
    assert all(len(d) == 2 for d in placed) and len(set().union(*placed)) == 6
