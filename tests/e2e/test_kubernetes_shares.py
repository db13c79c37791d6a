"""Shares of GPUs decided by Tangram on the real control plane: pods of shared.gpu.tangram.dev
packed onto one GPU under MPS, each container's CDI edits carrying its pipe directory and limits,
the device's control daemon running while any share is prepared; a share that does not fit waits
with a reason naming memory; an exclusive claim never gets a shared GPU; MPS shares of a MIG
instance made on demand.

Where the API server serves consumable capacity (1.36 and later) the claims ask
`capacity.requests.memory` and the allocation carries shareID and consumedCapacity; on 1.34 the
same share is asked in Tangram's SharingConfig, and Tangram decides it all the same.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tangram.kubernetes.api import call_json
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane, Release
from tangram.sharing.daemons import PID_FILE, process_alive
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

SHARED = "shared.gpu.tangram.dev"
GPU0 = 'device.attributes["gpu.tangram.dev"].index == 0'


def share_template(
    name: str, namespace: str, release: Release, memory: str, *selectors: str
) -> dict[str, Any]:
    """A claim of one share of `memory`: asked as consumable capacity where the server serves it,
    else in Tangram's SharingConfig."""
    exactly: dict[str, Any] = {"deviceClassName": SHARED}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "share", "exactly": exactly}]}
    parameters: dict[str, Any] = {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "SharingConfig"}
    if release.dra_alpha:
        parameters["memory"] = memory
    else:
        exactly["capacity"] = {"requests": {"memory": memory}}
    devices["config"] = [{"requests": ["share"], "opaque": {"driver": DRIVER, "parameters": parameters}}]
    return template(name, namespace, {"devices": devices})


def uses(template_name: str) -> dict[str, dict[str, str]]:
    return {"share": {"resourceClaimTemplateName": template_name}}


async def running_claim(node: Node, name: str, entry: str = "share") -> dict[str, Any]:
    return await claim_of(node, await wait_for_pod(node, name, "Running"), entry)


async def device_status(node: Node, claim: str) -> dict[str, Any]:
    """The node's one entry in the claim's status.devices, as the API server serves it."""

    async def written() -> dict[str, Any] | None:
        found = await call_json(
            f"read ResourceClaim {claim}",
            node.resource.read_namespaced_resource_claim(claim, node.namespace, _preload_content=False),
        )
        entries = [e for e in found["status"].get("devices", []) if e["driver"] == DRIVER]
        return entries[0] if len(entries) == 1 else None

    entry: dict[str, Any] = await until(f"the device status of claim {claim}", written)
    return entry


def daemon_pid(node: Node, device_uuid: str) -> int:
    return int((node.cluster.mps_root(node.name) / device_uuid / "pipe" / PID_FILE).read_text())


def share_edits(node: Node, uid: str) -> dict[str, Any]:
    [device] = json.loads(node.spec_text(uid))["devices"]
    return dict(device["containerEdits"])


async def unschedulable_message(node: Node, pod_name: str) -> str | None:
    events = await node.core.list_namespaced_event(node.namespace)
    for e in events.items:
        if (
            e.reason == "TangramUnschedulable"
            and e.involved_object.kind == "Pod"
            and e.involved_object.name == pod_name
        ):
            return str(e.message)
    return None


@pytest.fixture
async def l40s(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique, decide=True, machine="l40s-8") as started:
        yield started


@pytest.fixture
async def h200(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique, decide=True) as started:
        yield started


async def test_four_10gib_pods_share_one_l40s_under_mps_and_a_fifth_waits_naming_memory(
    l40s: Node, release: Release
) -> None:
    node, ns = l40s, l40s.namespace
    await node.resource.create_namespaced_resource_claim_template(
        ns, share_template("ten", ns, release, "10Gi", GPU0)
    )
    names = [f"embedder-{i}" for i in range(4)]
    for name in names:
        await node.core.create_namespaced_pod(ns, pod(name, ns, None, uses("ten"), gates=[SCHEDULING_GATE]))
    claims = {name: await running_claim(node, name) for name in names}
    gpu_uuid = ""
    pipes = set()
    for name, claim in claims.items():
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["pool"], result["device"]) == (node.name, "gpu-0-shared"), name
        if release.dra_alpha:
            assert "shareID" not in result and "consumedCapacity" not in result  # dropped by 1.34
        else:
            assert len(result["shareID"]) == 36
            assert result["consumedCapacity"] == {"memory": "10Gi"}
        edits = share_edits(node, claim["metadata"]["uid"])
        env = dict(e.split("=", 1) for e in edits["env"])
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
        assert [m["containerPath"] for m in edits["mounts"]] == [env["CUDA_MPS_PIPE_DIRECTORY"]]
        pipes.add(env["CUDA_MPS_PIPE_DIRECTORY"])
        gpu_uuid = env["CUDA_MPS_PIPE_DIRECTORY"].split("/")[-2]
    assert len(pipes) == 1  # one daemon for the one GPU the four share
    pid = daemon_pid(node, gpu_uuid)
    assert process_alive(pid)
    if not release.dra_alpha:
        shares = {
            r["shareID"] for c in claims.values() for r in c["status"]["allocation"]["devices"]["results"]
        }
        assert len(shares) == 4
    # what kubectl shows of each share: its GPU, the shareID where the allocation carries one, and
    # the limits its container runs under
    for name, claim in claims.items():
        [result] = claim["status"]["allocation"]["devices"]["results"]
        entry = await device_status(node, claim["metadata"]["name"])
        assert entry.get("shareID") == result.get("shareID"), name
        assert entry["data"]["uuid"] == gpu_uuid
        assert entry["data"]["sharing"] == {
            "strategy": "MPS",
            "memory": "10Gi",
            "activeThreadPercentage": 100,
            "pinnedMemoryLimit": "10240Mi",
        }

    # a fifth 10 GiB share does not fit on GPU 0 (46068 MiB less 40 GiB left): it waits, saying so
    await node.core.create_namespaced_pod(ns, pod("fifth", ns, None, uses("ten"), gates=[SCHEDULING_GATE]))
    message = await until("the fifth share's reason on its pod", lambda: unschedulable_message(node, "fifth"))
    assert "no shared device has room for a share of 10 GiB (MPS)" in message
    assert "gpu-0-shared has 4.988 GiB of memory" in message
    waiting = await node.core.read_namespaced_pod("fifth", ns)
    assert [g.name for g in waiting.spec.scheduling_gates] == [SCHEDULING_GATE]

    # an exclusive GPU is never the shared one
    whole = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    await node.resource.create_namespaced_resource_claim_template(
        ns, template("whole", ns, {"devices": {"requests": [whole]}})
    )
    await node.core.create_namespaced_pod(
        ns, pod("trainer", ns, None, {"gpu": {"resourceClaimTemplateName": "whole"}}, gates=[SCHEDULING_GATE])
    )
    [exclusive] = (await running_claim(node, "trainer", "gpu"))["status"]["allocation"]["devices"]["results"]
    assert exclusive["device"] not in ("gpu-0", "gpu-0-shared")

    # the daemon runs while any share is prepared, and stops after the last; the fifth then fits
    for name in names[:3]:
        await node.core.delete_namespaced_pod(name, ns)
    fifth = await running_claim(node, "fifth")
    assert [r["device"] for r in fifth["status"]["allocation"]["devices"]["results"]] == ["gpu-0-shared"]
    assert process_alive(pid)
    for name in (names[3], "fifth"):
        await node.core.delete_namespaced_pod(name, ns)

    async def stopped() -> bool:
        return not process_alive(pid)

    await until("the MPS control daemon stopped after the last share", stopped)


async def test_mps_shares_of_a_mig_instance_made_on_demand(h200: Node, release: Release) -> None:
    node, ns = h200, h200.namespace
    await node.resource.create_namespaced_resource_claim_template(
        ns, share_template("small", ns, release, "10Gi", NOT_GPU0)
    )
    await node.resource.create_namespaced_resource_claim_template(
        ns, share_template("tiny", ns, release, "4Gi", NOT_GPU0)
    )
    before = node.mig_uuids()
    await node.core.create_namespaced_pod(
        ns, pod("reranker", ns, None, uses("small"), gates=[SCHEDULING_GATE])
    )
    first = await running_claim(node, "reranker")
    [result] = first["status"]["allocation"]["devices"]["results"]
    # the smallest instance a 10 GiB share fits: a 1g.18gb placement, shared
    assert "-mig-1g-18gb-" in result["device"] and result["device"].endswith("-shared")
    [made] = node.mig_uuids() - before
    await node.core.create_namespaced_pod(
        ns, pod("embedder", ns, None, uses("tiny"), gates=[SCHEDULING_GATE])
    )
    second = await running_claim(node, "embedder")
    assert [r["device"] for r in second["status"]["allocation"]["devices"]["results"]] == [result["device"]]
    assert node.mig_uuids() - before == {made}  # joined the instance, made none
    for claim, limit in ((first, "0=10240M"), (second, "0=4096M")):
        env = dict(e.split("=", 1) for e in share_edits(node, claim["metadata"]["uid"])["env"])
        assert env["CUDA_MPS_PIPE_DIRECTORY"].split("/")[-2] == made
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
    pid = daemon_pid(node, made)
    assert process_alive(pid)

    await node.core.delete_namespaced_pod("reranker", ns)

    async def first_unprepared() -> bool:
        return not (
            node.cluster.cdi_dir(node.name) / f"{DRIVER}-claim_{first['metadata']['uid']}.json"
        ).exists()

    await until("the first share unprepared", first_unprepared)
    assert made in node.mig_uuids()  # kept for the share still prepared
    assert process_alive(pid)
    await node.core.delete_namespaced_pod("embedder", ns)

    async def destroyed() -> bool:
        return made not in node.mig_uuids() and not process_alive(pid)

    await until("the instance destroyed and its daemon stopped after the last share", destroyed)


def legacy_gpu_pod(name: str, namespace: str) -> dict[str, Any]:
    """A manifest written for NVIDIA's device plugin: `nvidia.com/gpu: 1`, no claim, no gate."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }


async def test_a_pod_asking_nvidia_com_gpu_gets_a_tangram_gpu_where_the_server_maps_extended_resources(
    l40s: Node, release: Release
) -> None:
    node, ns = l40s, l40s.namespace
    await node.core.create_namespaced_pod(ns, legacy_gpu_pod("legacy", ns))
    if release.dra_alpha:
        # 1.34: extended resources served by DeviceClasses are alpha and off; no node offers the
        # resource, so kube-scheduler says so and the pod waits (NVIDIA's device plugin's route)
        async def insufficient() -> str | None:
            found = await node.core.read_namespaced_pod("legacy", ns)
            for condition in found.status.conditions or []:
                if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                    return str(condition.message)
            return None

        message = await until("kube-scheduler's reason", insufficient)
        assert "Insufficient nvidia.com/gpu" in message
        return
    running = await wait_for_pod(node, "legacy", "Running")
    assert running.spec.node_name == node.name
    name = running.status.extended_resource_claim_status.resource_claim_name
    claim = dict(
        node.api.sanitize_for_serialization(await node.resource.read_namespaced_resource_claim(name, ns))
    )
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == node.name
    assert result["device"] in {f"gpu-{i}" for i in range(8)}  # a whole GPU, never a share host
    assert f"/dev/nvidia{result['device'].removeprefix('gpu-')}" in node.spec_text(claim["metadata"]["uid"])

    # Tangram holds what kube-scheduler gave, so it never gives that GPU to anybody else
    async def adopted() -> bool:
        state = await allocator_state(node.cluster)
        return state["allocated"].get(node.name, {}).get(result["device"]) == claim["metadata"]["uid"]

    await until("the allocator holds the GPU kube-scheduler gave", adopted)


async def test_kube_scheduler_counts_shares_by_consumable_capacity_and_the_node_enforces_them(
    l40s: Node, release: Release
) -> None:
    """No gate: kube-scheduler decides (the fallback path). Where the server serves consumable
    capacity it packs four 10 GiB shares on GPU 0's share host and refuses a fifth; the node runs
    them under MPS with their limits all the same. On 1.34 no share host is published, so
    kube-scheduler has nothing to share and says so."""
    node, ns = l40s, l40s.namespace
    await node.resource.create_namespaced_resource_claim_template(
        ns, share_template("ten", ns, release, "10Gi", GPU0)
    )
    if release.dra_alpha:
        await node.core.create_namespaced_pod(ns, pod("lone", ns, node.name, uses("ten")))

        async def refused() -> str | None:
            found = await node.core.read_namespaced_pod("lone", ns)
            for condition in found.status.conditions or []:
                if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                    return str(condition.message)
            return None

        assert "cannot allocate all claims" in await until("kube-scheduler's reason", refused)
        return
    # One pod at a time: with several claims being bound at once, kube-scheduler can find the
    # share host short for a moment and leave the pod unschedulable until its next periodic
    # retry, minutes later; what is tested is its count of what the running shares consume.
    for name in [f"by-kube-{i}" for i in range(4)]:
        await node.core.create_namespaced_pod(ns, pod(name, ns, node.name, uses("ten")))
        claim = await running_claim(node, name)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0-shared"
        assert result["consumedCapacity"] == {"memory": "10Gi"}
        env = dict(e.split("=", 1) for e in share_edits(node, claim["metadata"]["uid"])["env"])
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    await node.core.create_namespaced_pod(ns, pod("fifth", ns, node.name, uses("ten")))

    async def refused_fifth() -> str | None:
        found = await node.core.read_namespaced_pod("fifth", ns)
        for condition in found.status.conditions or []:
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return str(condition.message)
        return None

    assert "cannot allocate all claims" in await until("the fifth share refused", refused_fifth)
