"""The entries a node writes to a prepared claim's status.devices, and how they merge with what
other drivers and other nodes wrote: pure functions, no API server."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest

from tangram.cdi.devices import ClaimRef, ResolvedAllocation, ResolvedDevice
from tangram.events import DeviceShare
from tangram.kubelet.devicestatus import (
    GpuHealth,
    device_entries,
    gpu_health,
    status_devices,
    with_entries,
    without_entries,
)
from tests.kubelet.fakes import one_gpu_node
from tests.support.driver import DRIVER

NODE = "node-a"
OTHER_NODE = "node-b"
CLAIM = ClaimRef(namespace="ml", name="train", uid="7c1e0000-0000-4000-8000-000000000001")
GPU1 = "GPU-55555555-6666-7777-8888-999999999999"
GPU2 = "GPU-aaaaaaaa-6666-7777-8888-999999999999"
MIG = "MIG-11111111-2222-3333-4444-555555555555"
SHARE_ID = "5e2a0000-0000-4000-8000-0000000000aa"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LATER = datetime(2026, 3, 1, 12, 5, 0, tzinfo=UTC)
NIC = {
    "driver": "nic.example.com",
    "pool": NODE,
    "device": "nic-0",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Up",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
    "data": {"mtu": 9000},
    "networkData": {"interfaceName": "net1", "ips": ["10.9.0.7/24"]},
}
HEALTHY = {GPU1: GpuHealth(index=1, healthy=True), GPU2: GpuHealth(index=2, healthy=True)}

WHOLE = ResolvedDevice(request="gpu", pool=NODE, device="gpu-1", gpu_index=1, gpu_uuid=GPU1, gpu_minor=1)
MIG_DEVICE = ResolvedDevice(
    request="mig",
    pool=NODE,
    device="gpu-2-mig-1g-18gb-3",
    gpu_index=2,
    gpu_uuid=GPU2,
    gpu_minor=2,
    mig_uuid=MIG,
    profile="1g.18gb",
    gpu_instance_id=9,
)


def claim(*results: dict[str, Any], devices: list[Any] | None = None, generation: int = 1) -> dict[str, Any]:
    """A claim as the API server serves it after kube-scheduler allocated it."""
    status: dict[str, Any] = {"allocation": {"devices": {"results": list(results)}}}
    if devices is not None:
        status["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": CLAIM.name,
            "namespace": CLAIM.namespace,
            "uid": CLAIM.uid,
            "generation": generation,
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": name, "exactly": {"deviceClassName": DRIVER}} for name in ("gpu", "mig", "nic")
                ]
            }
        },
        "status": status,
    }


def result(
    device: str, request: str = "gpu", *, driver: str = DRIVER, pool: str = NODE, **more: Any
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **more}


def prepared(*devices: ResolvedDevice) -> ResolvedAllocation:
    return ResolvedAllocation(claim=CLAIM, devices=list(devices))


def entries(body: dict[str, Any], allocation: ResolvedAllocation, **kw: Any) -> list[dict[str, Any]]:
    options: dict[str, Any] = {"driver": DRIVER, "pool": NODE, "health": HEALTHY, "now": NOW}
    options.update(kw)
    return device_entries(body, allocation, **options)


def test_a_whole_gpu_shows_its_uuid_and_is_ready_and_healthy() -> None:
    [entry] = entries(claim(result("gpu-1")), prepared(WHOLE))
    assert entry == {
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-1",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": f"prepared on node {NODE}",
                "lastTransitionTime": "2026-03-01T12:00:00Z",
                "observedGeneration": 1,
            },
            {
                "type": "Healthy",
                "status": "True",
                "reason": "GpuHealthy",
                "message": f"GPU 1 ({GPU1}) is healthy",
                "lastTransitionTime": "2026-03-01T12:00:00Z",
                "observedGeneration": 1,
            },
        ],
        "data": {"uuid": GPU1, "gpuUUID": GPU1, "gpuIndex": 1},
    }


def test_a_mig_device_shows_the_mig_uuid_its_gpu_profile_and_gpu_instance() -> None:
    [entry] = entries(claim(result("gpu-2-mig-1g-18gb-3", "mig")), prepared(MIG_DEVICE))
    assert entry["device"] == "gpu-2-mig-1g-18gb-3"
    assert entry["data"] == {
        "uuid": MIG,
        "gpuUUID": GPU2,
        "gpuIndex": 2,
        "profile": "1g.18gb",
        "gpuInstanceId": 9,
    }


def test_an_mps_share_shows_its_share_id_and_the_limits_its_client_runs_under() -> None:
    share = DeviceShare(id=SHARE_ID, strategy="MPS", memory_bytes=10 * 2**30, compute_percent=25)
    device = ResolvedDevice(
        request="gpu", pool=NODE, device="gpu-1-shared", gpu_index=1, gpu_uuid=GPU1, gpu_minor=1, share=share
    )
    [entry] = entries(claim(result("gpu-1-shared", shareID=SHARE_ID)), prepared(device))
    assert entry["shareID"] == SHARE_ID
    assert entry["data"]["sharing"] == {
        "strategy": "MPS",
        "memory": "10Gi",
        "activeThreadPercentage": 25,
        "pinnedMemoryLimit": "10240Mi",
    }


def test_a_time_slicing_share_shows_its_slice_and_no_mps_limits() -> None:
    share = DeviceShare(id=SHARE_ID, strategy="TimeSlicing", memory_bytes=2**30, time_slice="Long")
    device = ResolvedDevice(
        request="gpu", pool=NODE, device="gpu-1-shared", gpu_index=1, gpu_uuid=GPU1, gpu_minor=1, share=share
    )
    [entry] = entries(claim(result("gpu-1-shared", shareID=SHARE_ID)), prepared(device))
    assert entry["data"]["sharing"] == {"strategy": "TimeSlicing", "memory": "1Gi", "timeSlice": "Long"}


def test_a_share_whose_allocation_lost_its_share_id_is_written_without_one() -> None:
    # the API server dropped shareID (consumable capacity off): it would refuse an entry keyed by
    # the id the node derived, since no allocated device carries it
    share = DeviceShare(id=SHARE_ID, memory_bytes=2**30)
    device = ResolvedDevice(
        request="gpu", pool=NODE, device="gpu-1-shared", gpu_index=1, gpu_uuid=GPU1, gpu_minor=1, share=share
    )
    [entry] = entries(claim(result("gpu-1-shared")), prepared(device))
    assert "shareID" not in entry and entry["data"]["sharing"]["strategy"] == "MPS"


def test_a_gpu_tainted_for_an_xid_is_unhealthy_with_the_reason() -> None:
    health = {GPU1: GpuHealth(index=1, healthy=False, reason="XID 79")}
    [entry] = entries(claim(result("gpu-1")), prepared(WHOLE), health=health)
    [ready, healthy] = entry["conditions"]
    assert ready["status"] == "True"
    assert (healthy["type"], healthy["status"], healthy["reason"]) == ("Healthy", "False", "GpuUnhealthy")
    assert healthy["message"] == f"GPU 1 ({GPU1}) is unhealthy: XID 79"


def test_a_gpu_gone_from_the_inventory_is_unknown_and_no_inventory_says_nothing() -> None:
    [gone] = entries(claim(result("gpu-1")), prepared(WHOLE), health={})
    assert [(c["type"], c["status"], c["reason"]) for c in gone["conditions"]] == [
        ("Ready", "True", "Prepared"),
        ("Healthy", "Unknown", "GpuNotInInventory"),
    ]
    [unknown] = entries(claim(result("gpu-1")), prepared(WHOLE), health=None)
    assert [c["type"] for c in unknown["conditions"]] == ["Ready"]


def test_health_is_read_from_the_inventory_by_gpu_uuid() -> None:
    hardware = one_gpu_node(NODE, GPU1, index=3, health="unhealthy", reason="XID 48")
    assert gpu_health(hardware) == {GPU1: GpuHealth(index=3, healthy=False, reason="XID 48")}
    assert gpu_health(None) is None


def test_no_observed_generation_when_the_claim_has_none() -> None:
    body = claim(result("gpu-1"))
    del body["metadata"]["generation"]
    [entry] = entries(body, prepared(WHOLE))
    assert all("observedGeneration" not in c for c in entry["conditions"])


# --- the trust boundary: only what this node prepared ----------------------------------------


def test_a_claim_allocated_on_another_nodes_pool_gets_no_entry_from_this_node() -> None:
    # an attacker's claim naming a device of this driver in another node's pool, asked of this
    # node: nothing of this node's is written for it
    other = ResolvedDevice(
        request="gpu", pool=OTHER_NODE, device="gpu-1", gpu_index=1, gpu_uuid=GPU1, gpu_minor=1
    )
    body = claim(result("gpu-1", pool=OTHER_NODE))
    assert entries(body, prepared(WHOLE)) == []
    assert entries(body, prepared(other)) == []
    assert with_entries(status_devices(body), [], driver=DRIVER, pool=NODE) is None


def test_a_claim_made_again_under_the_same_name_gets_nothing() -> None:
    body = claim(result("gpu-1"))
    body["metadata"]["uid"] = "7c1e0000-0000-4000-8000-0000000000ff"
    assert entries(body, prepared(WHOLE)) == []


def test_only_devices_this_node_prepared_get_entries() -> None:
    # a result of this node's pool the node did not prepare (another request's device), and a
    # result of another driver in the same pool, are not this node's to describe
    body = claim(
        result("gpu-1"),
        result("gpu-2", "mig"),
        result("nic-0", "nic", driver="nic.example.com"),
    )
    assert [e["device"] for e in entries(body, prepared(WHOLE))] == ["gpu-1"]


def test_other_drivers_and_other_nodes_entries_are_kept_exactly() -> None:
    theirs = [
        copy.deepcopy(NIC),
        {"driver": DRIVER, "pool": OTHER_NODE, "device": "gpu-1", "data": {"uuid": "GPU-other"}},
    ]
    body = claim(result("gpu-1"), devices=copy.deepcopy(theirs))
    ours = entries(body, prepared(WHOLE))
    merged = with_entries(status_devices(body), ours, driver=DRIVER, pool=NODE)
    assert merged is not None
    assert merged[:2] == theirs and merged[2:] == ours
    # removing this node's entries leaves theirs alone, and a claim with none of ours is not written
    assert without_entries(merged, driver=DRIVER, pool=NODE) == theirs
    assert without_entries(theirs, driver=DRIVER, pool=NODE) is None


def test_this_nodes_stale_entries_are_replaced_not_added_to() -> None:
    stale = {"driver": DRIVER, "pool": NODE, "device": "gpu-7", "data": {"uuid": "GPU-gone"}}
    body = claim(result("gpu-1"), devices=[stale, copy.deepcopy(NIC)])
    ours = entries(body, prepared(WHOLE))
    assert with_entries(status_devices(body), ours, driver=DRIVER, pool=NODE) == [NIC, *ours]


def test_writing_the_same_again_changes_nothing_and_keeps_transition_times() -> None:
    body = claim(result("gpu-1"), devices=[copy.deepcopy(NIC)])
    first = with_entries(status_devices(body), entries(body, prepared(WHOLE)), driver=DRIVER, pool=NODE)
    assert first is not None
    body["status"]["devices"] = first
    again = entries(body, prepared(WHOLE), now=LATER)
    assert with_entries(first, again, driver=DRIVER, pool=NODE) is None

    # the GPU fails: only the health condition changes, and only its time moves
    failed = {GPU1: GpuHealth(index=1, healthy=False, reason="XID 79")}
    changed = with_entries(
        first, entries(body, prepared(WHOLE), now=LATER, health=failed), driver=DRIVER, pool=NODE
    )
    assert changed is not None
    [ready, healthy] = changed[1]["conditions"]
    assert ready["lastTransitionTime"] == "2026-03-01T12:00:00Z"
    assert (healthy["status"], healthy["lastTransitionTime"]) == ("False", "2026-03-01T12:05:00Z")


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_the_entries_are_valid_for_the_api_server(version: str) -> None:
    share = DeviceShare(id=SHARE_ID, memory_bytes=2**30, compute_percent=50)
    shared = ResolvedDevice(
        request="nic", pool=NODE, device="gpu-3-shared", gpu_index=1, gpu_uuid=GPU1, gpu_minor=1, share=share
    )
    body = claim(
        result("gpu-1"),
        result("gpu-2-mig-1g-18gb-3", "mig"),
        result("gpu-3-shared", "nic", shareID=SHARE_ID),
        devices=[],
    )
    ours = entries(body, prepared(WHOLE, MIG_DEVICE, shared))
    assert len(ours) == 3
    body["status"]["devices"] = ours
    kubernetes_validate.validate(body, version, strict=True)
