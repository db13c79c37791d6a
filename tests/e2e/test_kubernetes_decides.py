"""Tangram decides the claims of pods held by its scheduling gate, against the real control plane.

The gate is written into the pod as admission adds it. The allocator writes the claim's
allocation naming the node, removes the gate, kube-scheduler binds the pod to that node, and the
test kubelet prepares it; a claim that cannot be placed gets an Event and is allocated once
capacity frees; deleting the pod releases the claim and destroys its MIG instance.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane
from tests.e2e.kubecluster import (
    DRIVER,
    MIG_1G,
    NOT_GPU0,
    Node,
    allocator_state,
    claim_of,
    gpus_template,
    leading_allocator,
    pod,
    started_node,
    template,
    until,
    wait_for_pod,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique, decide=True) as started:
        yield started


def mig_template(namespace: str) -> dict[str, Any]:
    request = {
        "name": "mig",
        "exactly": {"deviceClassName": "mig.gpu.tangram.dev", "selectors": [{"cel": {"expression": MIG_1G}}]},
    }
    return template("small", namespace, {"devices": {"requests": [request]}})


async def gone(check: Any) -> bool:
    try:
        await check
    except Exception:
        return True
    return False


async def test_tangram_allocates_the_gated_pods_claim_and_kube_scheduler_places_it_there(node: Node) -> None:
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, mig_template(ns))
    before = node.mig_uuids()
    await node.core.create_namespaced_pod(
        ns, pod("worker", ns, None, {"mig": {"resourceClaimTemplateName": "small"}}, gates=[SCHEDULING_GATE])
    )

    async def allocated_claim() -> dict[str, Any] | None:
        found = await node.core.read_namespaced_pod("worker", ns)
        if not found.status.resource_claim_statuses:
            return None
        claim = await claim_of(node, found, "mig")
        return claim if (claim.get("status") or {}).get("allocation") else None

    claim = await until("Tangram writes the claim's allocation", allocated_claim)
    allocation = claim["status"]["allocation"]
    [result] = allocation["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == node.name and "-mig-1g-18gb-" in result["device"]
    assert allocation["nodeSelector"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
    ]

    running = await wait_for_pod(node, "worker", "Running")
    assert running.spec.node_name == node.name
    assert not running.spec.scheduling_gates
    [made] = node.mig_uuids() - before
    assert made in node.spec_text(claim["metadata"]["uid"])

    await node.core.delete_namespaced_pod("worker", ns)
    await until("the pod removed", lambda: gone(node.core.read_namespaced_pod("worker", ns)))

    async def destroyed() -> bool:
        return made not in node.mig_uuids()

    await until("the MIG instance destroyed", destroyed)
    await until(
        "the claim deleted with its pod",
        lambda: gone(node.resource.read_namespaced_resource_claim(claim["metadata"]["name"], ns)),
    )

    async def released() -> bool:
        state = await allocator_state(node.cluster)
        uid = claim["metadata"]["uid"]
        return uid in state["released"] and uid not in state["allocated"].get(node.name, {}).values()

    await until("the allocator released the deleted claim", released)


async def test_a_claim_that_cannot_be_placed_gets_an_event_and_is_allocated_once_capacity_frees(
    node: Node,
) -> None:
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template("seven", ns, 7))
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template("one", ns, 1))
    await node.core.create_namespaced_pod(
        ns, pod("holder", ns, None, {"gpus": {"resourceClaimTemplateName": "seven"}}, gates=[SCHEDULING_GATE])
    )
    await wait_for_pod(node, "holder", "Running")
    await node.core.create_namespaced_pod(
        ns, pod("waiter", ns, None, {"gpus": {"resourceClaimTemplateName": "one"}}, gates=[SCHEDULING_GATE])
    )

    async def warned() -> dict[str, str] | None:
        events = await node.core.list_namespaced_event(ns)
        found = {
            e.involved_object.kind: e.message
            for e in events.items
            if e.reason == "TangramUnschedulable" and e.type == "Warning"
        }
        return found if {"ResourceClaim", "Pod"} <= set(found) else None

    messages = await until("a Warning Event on the claim and on the pod", warned)
    # the allocator's per-node reason, word for word
    assert (
        "0/1 nodes fit" in messages["ResourceClaim"] and "not enough free GPUs" in messages["ResourceClaim"]
    )
    assert messages["Pod"] == messages["ResourceClaim"]
    waiting = await node.core.read_namespaced_pod("waiter", ns)
    assert [g.name for g in waiting.spec.scheduling_gates] == [SCHEDULING_GATE]
    assert waiting.spec.node_name is None

    await node.core.delete_namespaced_pod("holder", ns)
    running = await wait_for_pod(node, "waiter", "Running")
    assert running.spec.node_name == node.name
    claim = await claim_of(node, running, "gpus")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == node.name


async def test_a_restarted_allocator_resyncs_without_giving_anything_twice(node: Node) -> None:
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, mig_template(ns))
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template("pair", ns, 2))
    use = {"mig": {"resourceClaimTemplateName": "small"}}
    await node.core.create_namespaced_pod(ns, pod("first", ns, None, use, gates=[SCHEDULING_GATE]))
    first = await wait_for_pod(node, "first", "Running")
    first_claim = await claim_of(node, first, "mig")

    node.cluster.crash("allocator")
    # While it is down: claims made (one that kube-scheduler allocates since no gate holds its pod,
    # one gated for Tangram) and a claim deleted. The pair is placed while the first claim still
    # holds its GPU: a whole GPU whose instance belonged to a claim deleted while the allocator is
    # down waits for the allocator's release (at most the partitioner's log lag), which this test
    # is not about.
    await node.core.create_namespaced_pod(
        ns, pod("by-kube", ns, node.name, {"gpus": {"resourceClaimTemplateName": "pair"}})
    )
    await wait_for_pod(node, "by-kube", "Running")
    await node.core.delete_namespaced_pod("first", ns)
    await node.core.create_namespaced_pod(ns, pod("second", ns, None, use, gates=[SCHEDULING_GATE]))
    node.cluster.restart("allocator")
    await node.core.create_namespaced_pod(ns, pod("third", ns, None, use, gates=[SCHEDULING_GATE]))

    pods = {name: await wait_for_pod(node, name, "Running") for name in ("second", "third", "by-kube")}
    await until(
        "the first pod's claim deleted",
        lambda: gone(node.resource.read_namespaced_resource_claim(first_claim["metadata"]["name"], ns)),
    )
    held: list[tuple[str, str]] = []
    owners: dict[str, str] = {}
    for name, found in pods.items():
        entry = "gpus" if name == "by-kube" else "mig"
        claim = await claim_of(node, found, entry)
        results = claim["status"]["allocation"]["devices"]["results"]
        held += [(r["pool"], r["device"]) for r in results]
        owners.update({r["device"]: claim["metadata"]["uid"] for r in results})
    assert len(held) == len(set(held)) == 4, held

    # The restarted allocator's ledger holds exactly what the API server says: kube-scheduler's
    # pair adopted, the deleted claim's instance released, each device once.
    async def ledger_agrees() -> dict[str, str] | None:
        state = await allocator_state(node.cluster)
        allocated = state["allocated"].get(node.name, {})
        return allocated if allocated == owners else None

    await until("the allocator's ledger holds what the API server holds", ledger_agrees)
    # the MIG slices of two 1g claims and a whole GPU pair never overlap either: distinct GPUs
    # for the pair, and the 1g devices are on GPUs the pair does not hold
    pair_gpus = {d for p, d in held if "-mig-" not in d}
    assert all(not any(d.startswith(g + "-") for g in pair_gpus) for _, d in held if "-mig-" in d), held


@pytest.fixture
async def two_allocators(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique, decide=True, allocators=2) as started:
        yield started


async def test_a_standby_allocator_takes_over_and_loses_or_duplicates_nothing(two_allocators: Node) -> None:
    node = two_allocators
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, mig_template(ns))
    use = {"mig": {"resourceClaimTemplateName": "small"}}
    await node.core.create_namespaced_pod(ns, pod("first", ns, None, use, gates=[SCHEDULING_GATE]))
    first = await wait_for_pod(node, "first", "Running")
    first_claim = await claim_of(node, first, "mig")
    first_device = first_claim["status"]["allocation"]["devices"]["results"][0]["device"]

    async def leader() -> str | None:
        return leading_allocator(node.cluster)

    killed = await until("an allocator leads", leader)
    node.cluster.crash(killed)
    # While no allocator leads (until the lease expires), pods arrive and the first one goes.
    for name in ("second", "third"):
        await node.core.create_namespaced_pod(ns, pod(name, ns, None, use, gates=[SCHEDULING_GATE]))
    await node.core.delete_namespaced_pod("first", ns)

    standby = await until("the standby allocator leads", leader)
    assert standby != killed
    pods = {name: await wait_for_pod(node, name, "Running") for name in ("second", "third")}
    await until(
        "the first pod's claim deleted",
        lambda: gone(node.resource.read_namespaced_resource_claim(first_claim["metadata"]["name"], ns)),
    )
    owners: dict[str, str] = {}
    for found in pods.values():
        claim = await claim_of(node, found, "mig")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] not in owners
        owners[result["device"]] = claim["metadata"]["uid"]
    assert len(owners) == 2

    async def ledger_agrees() -> dict[str, str] | None:
        state = await allocator_state(node.cluster, standby)
        allocated = state["allocated"].get(node.name, {})
        return allocated if allocated == owners else None

    held = await until("the new leader's ledger holds exactly the live claims", ledger_agrees)
    assert first_device not in held or held[first_device] != first_claim["metadata"]["uid"]


async def test_a_class_made_in_the_cluster_is_tangrams_and_a_mixed_claim_is_left_to_kube_scheduler(
    node: Node,
) -> None:
    ns = node.namespace
    mine, other = f"{ns}.gpu.example.com", f"{ns}.example.com"
    await node.resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": mine},
            "spec": {
                "selectors": [
                    {"cel": {"expression": f'device.driver == "{DRIVER}" && {NOT_GPU0}'}},
                    {"cel": {"expression": 'device.attributes["gpu.tangram.dev"].type == "gpu"'}},
                ]
            },
        }
    )
    await node.resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": other},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{other}"'}}]},
        }
    )
    await node.resource.create_resource_slice(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{ns}-other"},
            "spec": {
                "driver": other,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "nic-0"}],
            },
        }
    )
    try:
        gpu = {"name": "gpu", "exactly": {"deviceClassName": mine}}
        nic = {"name": "nic", "exactly": {"deviceClassName": other}}

        async def make(name: str, requests: list[dict[str, Any]]) -> None:
            await node.resource.create_namespaced_resource_claim(
                ns,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"devices": {"requests": requests}},
                },
            )
            claims = {"c": {"resourceClaimName": name}}
            await node.core.create_namespaced_pod(
                ns, pod(f"{name}-user", ns, node.name, claims, gates=[SCHEDULING_GATE])
            )

        # The mixed claim is kube-scheduler's: the gate goes, kube-scheduler allocates both devices.
        # (It comes first: two deciders racing for one device is the window docs/kubernetes-claims.md
        # describes, not what this test is about.)
        await make("mixed", [gpu, nic])

        async def allocated_mixed() -> dict[str, Any] | None:
            claim = await node.resource.read_namespaced_resource_claim("mixed", ns)
            found = dict(node.api.sanitize_for_serialization(claim))
            return found if (found.get("status") or {}).get("allocation") else None

        mixed = await until("kube-scheduler allocates the mixed claim", allocated_mixed)
        drivers = sorted(r["driver"] for r in mixed["status"]["allocation"]["devices"]["results"])
        assert drivers == sorted([DRIVER, other])
        [gpu_device] = [
            r["device"] for r in mixed["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER
        ]

        # the allocator holds kube-scheduler's GPU as taken
        async def adopted() -> bool:
            state = await allocator_state(node.cluster)
            return state["allocated"].get(node.name, {}).get(gpu_device) == mixed["metadata"]["uid"]

        await until("the allocator adopts kube-scheduler's allocation", adopted)

        # the custom class is Tangram's: Tangram allocates while the pod is gated, never that GPU
        await make("custom", [gpu])
        custom = await wait_for_pod(node, "custom-user", "Running")
        assert custom.spec.node_name == node.name
        custom_claim = await node.resource.read_namespaced_resource_claim("custom", ns)
        custom_devices = [r.device for r in custom_claim.status.allocation.devices.results]
        assert len(custom_devices) == 1 and gpu_device not in custom_devices
    finally:
        for name in ("custom-user", "mixed-user"):
            with contextlib.suppress(Exception):
                await node.core.delete_namespaced_pod(name, ns)
        await node.resource.delete_device_class(mine)
        await node.resource.delete_device_class(other)
        await node.resource.delete_resource_slice(f"{ns}-other")
