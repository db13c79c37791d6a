"""What `kubectl get resourceclaim -o yaml` shows of a prepared claim, on the real control plane:
the node writes each device it prepared to the claim's status.devices (its UUID, the one the
container gets, and its MIG profile, Ready, and its GPU's health, which follows the GPU failing),
leaves another driver's entries as that driver wrote them, and removes its own at unprepare. The
chart's node role is what it takes: a node's token writes the claims allocated to its own node,
and, from Kubernetes 1.36, no other node's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api, RbacAuthorizationV1Api, ResourceV1Api

from tangram.cdi.devices import ClaimRef, ResolvedAllocation, ResolvedDevice
from tangram.kubelet.client import ClaimHandle, KubeletClient
from tangram.kubelet.statuswriter import ClaimStatusWriter
from tangram.kubernetes.api import KubeApiError, call, call_json, connect
from tangram.local.admission import apply, delete, render, service_account_kubeconfig
from tangram.local.controlplane import ControlPlane, register_node
from tests.e2e.kubecluster import (
    DRIVER,
    MIG_1G,
    NOT_GPU0,
    Node,
    pod,
    started_node,
    template,
    until,
    wait_for_pod,
)
from tests.partitioner.helpers import sim

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

NIC_DRIVER_SUFFIX = ".example.com"


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique) as started:
        yield started


async def read_claim(node: Node, name: str) -> dict[str, Any]:
    """The claim as the API server serves it (status.devices[].data as written, not a model)."""
    return await call_json(
        f"read ResourceClaim {name}",
        node.resource.read_namespaced_resource_claim(name, node.namespace, _preload_content=False),
    )


async def claim_name(node: Node, pod_name: str, entry: str) -> str:
    found = await node.core.read_namespaced_pod(pod_name, node.namespace)
    [name] = [s.resource_claim_name for s in found.status.resource_claim_statuses if s.name == entry]
    return str(name)


def tangram_entries(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in (claim.get("status") or {}).get("devices") or [] if e["driver"] == DRIVER]


async def entries_of(node: Node, name: str, wanted: int = 1) -> list[dict[str, Any]]:
    async def written() -> list[dict[str, Any]] | None:
        found = tangram_entries(await read_claim(node, name))
        return found if len(found) == wanted else None

    found: list[dict[str, Any]] = await until(f"the node's entries in claim {name}", written)
    return found


def conditions(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in entry["conditions"]}


def visible_uuids(spec_text: str) -> list[str]:
    """The UUIDs the container is given, as its CDI spec names them."""
    for variable in json.loads(spec_text)["containerEdits"]["env"]:
        name, _, value = variable.partition("=")
        if name in ("NVIDIA_VISIBLE_DEVICES", "TANGRAM_VISIBLE_DEVICES") and value != "void":
            return value.split(",")
    raise AssertionError(f"no visible devices in {spec_text}")


async def slice_attribute(node: Node, device: str, attribute: str) -> str:
    """An attribute of a device in the node's ResourceSlices (the node's inventory, as published)."""
    slices = await node.resource.list_resource_slice(field_selector=f"spec.nodeName={node.name}")
    for published in slices.items:
        for found in published.spec.devices or []:
            if found.name == device:
                # the driver's own attributes are published without its domain
                return str(found.attributes[attribute].string)
    raise AssertionError(f"device {device} is not in the slices of node {node.name}")


async def test_kubectl_shows_the_prepared_gpu_and_mig_device_and_the_gpu_failing(node: Node) -> None:
    ns = node.namespace
    whole = {
        "name": "gpu",
        "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": {"expression": NOT_GPU0}}]},
    }
    mig = {
        "name": "mig",
        "exactly": {"deviceClassName": f"mig.{DRIVER}", "selectors": [{"cel": {"expression": MIG_1G}}]},
    }
    await node.resource.create_namespaced_resource_claim_template(
        ns, template("whole", ns, {"devices": {"requests": [whole]}})
    )
    await node.resource.create_namespaced_resource_claim_template(
        ns, template("small", ns, {"devices": {"requests": [mig]}})
    )
    before = node.mig_uuids()
    await node.core.create_namespaced_pod(
        ns, pod("trainer", ns, node.name, {"gpu": {"resourceClaimTemplateName": "whole"}})
    )
    await node.core.create_namespaced_pod(
        ns, pod("notebook", ns, node.name, {"mig": {"resourceClaimTemplateName": "small"}})
    )
    await wait_for_pod(node, "trainer", "Running")
    await wait_for_pod(node, "notebook", "Running")

    # the whole GPU: the UUID its container gets, which is the GPU's in the node's slices
    whole_name = await claim_name(node, "trainer", "gpu")
    [gpu] = await entries_of(node, whole_name)
    whole_claim = await read_claim(node, whole_name)
    [result] = whole_claim["status"]["allocation"]["devices"]["results"]
    assert (gpu["pool"], gpu["device"]) == (node.name, result["device"])
    assert visible_uuids(node.spec_text(whole_claim["metadata"]["uid"])) == [gpu["data"]["uuid"]]
    assert (
        gpu["data"]["uuid"] == gpu["data"]["gpuUUID"] == await slice_attribute(node, result["device"], "uuid")
    )
    assert "profile" not in gpu["data"]
    ready = conditions(gpu)["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Prepared")
    # the API server keeps no generation for claims: then the condition names none either
    assert ready.get("observedGeneration") == whole_claim["metadata"].get("generation")
    assert conditions(gpu)["Healthy"]["status"] == "True"

    # the MIG device: the instance made for it, on the GPU the slices name as its parent
    mig_name = await claim_name(node, "notebook", "mig")
    [instance] = await entries_of(node, mig_name)
    mig_claim = await read_claim(node, mig_name)
    [made] = node.mig_uuids() - before
    assert instance["data"]["uuid"] == made
    assert visible_uuids(node.spec_text(mig_claim["metadata"]["uid"])) == [made]
    assert instance["data"]["profile"] == "1g.18gb"
    assert isinstance(instance["data"]["gpuInstanceId"], int)
    assert instance["data"]["gpuUUID"] == await slice_attribute(node, instance["device"], "parentUUID")
    assert conditions(instance)["Ready"]["status"] == "True"

    # the whole GPU fails (a critical XID): its claim says so, with the reason; the MIG device's
    # GPU is another one and stays healthy
    failing = gpu["data"]["gpuIndex"]
    assert failing != instance["data"]["gpuIndex"]
    sim(node.machine, node.cluster.state_file(node.name)).sim_inject_xid(failing, 79)

    async def told() -> dict[str, Any] | None:
        [entry] = tangram_entries(await read_claim(node, whole_name))
        healthy = conditions(entry)["Healthy"]
        return healthy if healthy["status"] == "False" else None

    healthy = await until("the claim told of its failed GPU", told)
    assert healthy["reason"] == "GpuUnhealthy" and healthy["message"].endswith("is unhealthy: XID 79")
    assert f"({gpu['data']['gpuUUID']})" in healthy["message"]
    # Ready did not change, nor when it last did
    [entry] = tangram_entries(await read_claim(node, whole_name))
    assert conditions(entry)["Ready"] == ready
    [other] = tangram_entries(await read_claim(node, mig_name))
    assert conditions(other)["Healthy"]["status"] == "True"


async def test_another_drivers_entry_survives_and_unprepare_removes_only_tangrams(node: Node) -> None:
    ns = node.namespace
    other = f"{ns}{NIC_DRIVER_SUFFIX}"
    await node.resource.create_resource_slice(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{ns}-nic"},
            "spec": {
                "driver": other,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "nic-0"}],
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
    try:
        await node.resource.create_namespaced_resource_claim(
            ns,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "mixed", "namespace": ns},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": DRIVER,
                                    "selectors": [{"cel": {"expression": NOT_GPU0}}],
                                },
                            },
                            {"name": "nic", "exactly": {"deviceClassName": other}},
                        ]
                    }
                },
            },
        )
        await node.core.create_namespaced_pod(
            ns, pod("mixed-user", ns, node.name, {"both": {"resourceClaimName": "mixed"}})
        )
        await wait_for_pod(node, "mixed-user", "Running")
        [ours] = await entries_of(node, "mixed")

        # the other driver writes its entry, as its own node plugin would
        nic = {
            "driver": other,
            "pool": node.name,
            "device": "nic-0",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "LinkUp",
                    "message": "carrier detected",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "data": {"mtu": 9000},
            "networkData": {
                "interfaceName": "net1",
                "ips": ["10.9.0.7/24"],
                "hardwareAddress": "02:00:00:00:00:01",
            },
        }

        async def nic_written() -> bool:
            claim = await read_claim(node, "mixed")
            claim["status"]["devices"] = [*claim["status"].get("devices", []), nic]
            try:
                await call_json(
                    "write the nic's status",
                    node.resource.replace_namespaced_resource_claim_status(
                        "mixed", ns, claim, _preload_content=False
                    ),
                )
            except KubeApiError as error:
                if error.conflict:
                    return False
                raise
            return True

        await until("the other driver's entry written", nic_written)
        claim = await read_claim(node, "mixed")
        uid = claim["metadata"]["uid"]

        def theirs(found: dict[str, Any]) -> list[dict[str, Any]]:
            return [e for e in found["status"].get("devices", []) if e["driver"] == other]

        assert theirs(claim) == [nic] and tangram_entries(claim) == [ours]

        # kubelet unprepares (the claim stays allocated, the pod is still there): Tangram's entry
        # goes, the other driver's stays exactly as that driver wrote it
        handle = ClaimHandle(namespace=ns, uid=uid, name="mixed")
        async with KubeletClient(node.cluster.dra_socket(node.name)) as kubelet:
            assert (await kubelet.unprepare([handle]))[uid] == ""
            claim = await read_claim(node, "mixed")
            assert claim["status"]["allocation"] is not None
            assert tangram_entries(claim) == [] and theirs(claim) == [nic]

            # and prepared again, it is back, the other driver's entry still untouched
            assert (await kubelet.prepare([handle]))[uid].error == ""
            claim = await read_claim(node, "mixed")
            [back] = tangram_entries(claim)
            assert (back["device"], back["data"]) == (ours["device"], ours["data"])
            assert theirs(claim) == [nic]
    finally:
        await node.resource.delete_device_class(other)
        await node.resource.delete_resource_slice(f"{ns}-nic")


# --- the chart's node role and claim status policy on the real API server ---------------------

GPU_UUID = "GPU-1b5c0000-0000-4000-8000-000000000001"
NIC = {
    "driver": "nic.example.com",
    "device": "nic-0",
    "data": {"mtu": 9000},
    "networkData": {"interfaceName": "net1"},
}


def allocated_on(node_name: str) -> dict[str, Any]:
    """A claim's status once allocated a GPU and a NIC on `node_name`, as kube-scheduler writes it
    for node-local slices, with the NIC driver's own entry."""
    return {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node_name, "device": "gpu-1"},
                    {"request": "nic", "driver": NIC["driver"], "pool": node_name, "device": "nic-0"},
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            },
        },
        "devices": [{**NIC, "pool": node_name}],
    }


def prepared_on(node_name: str, claim: dict[str, Any]) -> ResolvedAllocation:
    metadata = claim["metadata"]
    device = ResolvedDevice(
        request="gpu", pool=node_name, device="gpu-1", gpu_index=1, gpu_uuid=GPU_UUID, gpu_minor=1
    )
    ref = ClaimRef(namespace=metadata["namespace"], name=metadata["name"], uid=metadata["uid"])
    return ResolvedAllocation(claim=ref, devices=[device])


def from_1_36(controlplane: ControlPlane) -> bool:
    return int(controlplane.release.minor.split(".")[1]) >= 36


async def test_a_nodes_token_writes_its_own_entries_and_nothing_else_of_a_claims_status(
    controlplane: ControlPlane, kube: Any, unique: str, tmp_path: Path
) -> None:
    suffix = unique.rsplit("-", 1)[-1]
    mine, theirs = f"sa-{suffix}", f"sb-{suffix}"
    core, resource, rbac = CoreV1Api(kube), ResourceV1Api(kube), RbacAuthorizationV1Api(kube)
    # the chart's node role and claim status policy as they render for a release in this test's
    # namespace, under cluster-wide names this test owns
    rendered = {
        (o["kind"], o["metadata"]["name"]): o
        for o in render(namespace=unique, kube_version=f"{controlplane.release.minor}.0")
    }
    role = rendered[("ClusterRole", "tangram-node")]
    role["metadata"] = {"name": f"{unique}-node"}
    policy = rendered[("ValidatingAdmissionPolicy", "tangram-resourceclaim-status-own-node")]
    policy["metadata"] = {"name": f"{unique}-claims"}
    binding = rendered[("ValidatingAdmissionPolicyBinding", "tangram-resourceclaim-status-own-node")]
    binding["metadata"] = {"name": f"{unique}-claims"}
    binding["spec"]["policyName"] = f"{unique}-claims"
    for name in (mine, theirs):
        await register_node(kube, name)
    await call("create namespace", core.create_namespace({"metadata": {"name": unique}}))
    as_node = None
    try:
        await rbac.create_cluster_role(role)
        await rbac.create_cluster_role_binding(
            {
                "metadata": {"name": f"{unique}-node"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{unique}-node",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "tangram-node", "namespace": unique}],
            }
        )
        await apply(kube, policy)
        await apply(kube, binding)
        await core.create_namespaced_service_account(unique, {"metadata": {"name": "tangram-node"}})
        # the node pod on node `mine`, whose token cdi uses, as the kubelet projects it
        node_pod = await call_json(
            "create the node pod",
            core.create_namespaced_pod(
                unique,
                {
                    "metadata": {"name": "tangram-node"},
                    "spec": {
                        "nodeName": mine,
                        "serviceAccountName": "tangram-node",
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "cdi", "image": "ghcr.io/tangram-gpu/tangram-node:0.1.0"}],
                    },
                },
                _preload_content=False,
            ),
        )
        kubeconfig = await service_account_kubeconfig(
            controlplane, kube, unique, "tangram-node", tmp_path / "node.kubeconfig", pod=node_pod
        )
        claims = {}
        for name, on in (("ours", mine), ("elsewhere", theirs)):
            requests = [
                {"name": "gpu", "exactly": {"deviceClassName": DRIVER}},
                {"name": "nic", "exactly": {"deviceClassName": NIC["driver"]}},
            ]
            created = await call_json(
                f"create claim {name}",
                resource.create_namespaced_resource_claim(
                    unique,
                    {"metadata": {"name": name}, "spec": {"devices": {"requests": requests}}},
                    _preload_content=False,
                ),
            )
            created["status"] = allocated_on(on)
            claims[name] = await call_json(
                f"allocate claim {name}",
                resource.replace_namespaced_resource_claim_status(
                    name, unique, created, _preload_content=False
                ),
            )

        async def read(name: str) -> dict[str, Any]:
            return await call_json(
                f"read claim {name}",
                resource.read_namespaced_resource_claim(name, unique, _preload_content=False),
            )

        as_node = await connect(kubeconfig=kubeconfig)
        writer = ClaimStatusWriter(as_node, driver=DRIVER, node=mine)

        async def refused(name: str, change: Any) -> str | None:
            """The node's token writes `change` of the claim's status: the API server's reason
            for refusing it, None when it was written."""
            claim = await read(name)
            change(claim["status"])
            try:
                await call_json(
                    f"write claim {name} as the node",
                    ResourceV1Api(as_node).replace_namespaced_resource_claim_status(
                        name, unique, claim, _preload_content=False
                    ),
                )
            except KubeApiError as error:
                if error.conflict:
                    return None
                return str(error)
            return None

        # an entry of another node's pool: from 1.36 the API server's per-driver check refuses it;
        # before, the chart's policy does (once the API server has loaded it: until then the
        # write goes through, and each try changes the entry again)
        tries = iter(range(1000))

        def forge_theirs(status: dict[str, Any]) -> None:
            forged = {
                "driver": DRIVER,
                "pool": theirs,
                "device": "gpu-1",
                "data": {"uuid": f"forged-{next(tries)}"},
            }
            status["devices"] = [e for e in status["devices"] if e["driver"] != DRIVER] + [forged]

        why = await until(
            "the node's token refused another node's entry", lambda: refused("elsewhere", forge_theirs)
        )
        if from_1_36(controlplane):
            assert 'requires resource="resourceclaims/driver"' in why, why
        else:
            assert f"node {mine} may change only gpu.tangram.dev entries of its own pool" in why, why

        # the node's own entry, written by cdi's writer: the other driver's entry stays as it was
        assert await writer.prepared(prepared_on(mine, claims["ours"])) == "written"
        nic, entry = (await read("ours"))["status"]["devices"]
        # (the API server writes out an entry's conditions even when it has none)
        assert {k: v for k, v in nic.items() if v is not None} == {**NIC, "pool": mine}
        # what the node wrote comes back as written: writing it again changes nothing
        assert await writer.prepared(prepared_on(mine, claims["ours"])) == "unchanged"
        assert (entry["pool"], entry["device"], entry["data"]["gpuUUID"]) == (mine, "gpu-1", GPU_UUID)
        # and for the claim of another node's pool, cdi's writer writes nothing at all
        assert await writer.prepared(prepared_on(mine, claims["elsewhere"])) == "unchanged"

        # the node's token cannot remove or alter another driver's entry of its own node's claim...
        def drop_nic(status: dict[str, Any]) -> None:
            status["devices"] = [e for e in status["devices"] if e["driver"] != NIC["driver"]]

        def alter_nic(status: dict[str, Any]) -> None:
            status["devices"][0]["data"] = {"mtu": 1500}

        # ...nor take its allocation away (a set allocation cannot be changed, only removed) or say
        # who it is reserved for
        def deallocate(status: dict[str, Any]) -> None:
            del status["allocation"], status["devices"]

        def reserve(status: dict[str, Any]) -> None:
            status["reservedFor"] = [
                {"resource": "pods", "name": "intruder", "uid": "7c1e0000-0000-4000-8000-00000000000f"}
            ]

        for change in (drop_nic, alter_nic):
            why = await refused("ours", change)
            assert why is not None, change.__name__
            assert (
                "resourceclaims/driver" if from_1_36(controlplane) else "may change only gpu.tangram.dev"
            ) in why
        for change in (deallocate, reserve):
            why = await refused("ours", change)
            assert why is not None, change.__name__
            assert (
                "resourceclaims/binding"
                if from_1_36(controlplane)
                else "may not change a claim's status.allocation"
            ) in why
        assert (await read("ours"))["status"]["devices"] == [nic, entry]

        assert await writer.unprepared(prepared_on(mine, claims["ours"]).claim) == "written"
        assert (await read("ours"))["status"]["devices"] == [nic]
    finally:
        if as_node is not None:
            await as_node.close()
        cleanups = [
            lambda: delete(kube, binding),
            lambda: delete(kube, policy),
            lambda: rbac.delete_cluster_role_binding(f"{unique}-node"),
            lambda: rbac.delete_cluster_role(f"{unique}-node"),
            lambda: core.delete_namespace(unique),
            lambda: core.delete_node(mine),
            lambda: core.delete_node(theirs),
        ]
        for cleanup in cleanups:
            with contextlib.suppress(KubeApiError):
                await call("clean up", cleanup())
