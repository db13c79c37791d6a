"""The node's writes of status.devices to a claim over real HTTP: guarded by the resourceVersion
and retried on conflict, other drivers' and nodes' entries left alone, bounded in time, and never
an error for the caller (a claim gone, a server failing or not serving the field)."""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tangram.cdi.devices import ClaimRef, ResolvedAllocation, ResolvedDevice
from tangram.events import NodeHardware
from tangram.kubelet.statuswriter import ClaimStatusWriter
from tangram.kubernetes.api import connect
from tests.kubelet.fakes import one_gpu_node
from tests.kubernetes.api.apiserver import ApiError, LocalApiServer
from tests.support.driver import DRIVER

NODE = "node-a"
OTHER = "node-b"
GPU1 = "GPU-55555555-6666-7777-8888-999999999999"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NIC = {
    "driver": "nic.example.com",
    "pool": NODE,
    "device": "nic-0",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Up",
            "message": "link up",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
    "data": {"mtu": 9000},
    "networkData": {"interfaceName": "net1", "ips": ["10.9.0.7/24"], "hardwareAddress": "02:00:00:00:00:01"},
}


def resource_claim(name: str, *, pool: str = NODE, devices: list[Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": pool, "device": "gpu-1"},
                    {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "nic-0"},
                ]
            }
        }
    }
    if devices is not None:
        status["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "generation": 1},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER}},
                    {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                ]
            }
        },
        "status": status,
    }


def allocation(stored: dict[str, Any], *, pool: str = NODE) -> ResolvedAllocation:
    ref = ClaimRef(namespace="ml", name=stored["metadata"]["name"], uid=stored["metadata"]["uid"])
    device = ResolvedDevice(request="gpu", pool=pool, device="gpu-1", gpu_index=1, gpu_uuid=GPU1, gpu_minor=1)
    return ResolvedAllocation(claim=ref, devices=[device])


def hardware(health: str = "healthy", reason: str = "") -> NodeHardware:
    return one_gpu_node(NODE, GPU1, health=health, reason=reason)


def writes(result: str) -> float:
    return REGISTRY.get_sample_value("tangram_cdi_claim_status_writes_total", {"result": result}) or 0.0


def puts(server: LocalApiServer) -> list[str]:
    return [path for method, path in server.requests if method == "PUT"]


def ours(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in claim["status"].get("devices") or [] if e["driver"] == DRIVER]


@pytest.fixture(params=["1.34", "1.37"])
async def apiserver(request: pytest.FixtureRequest) -> AsyncIterator[LocalApiServer]:
    server = LocalApiServer(k8s_version=request.param)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def client(apiserver: LocalApiServer) -> AsyncIterator[Any]:
    api = await connect(host=apiserver.url)
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def writer(client: Any) -> ClaimStatusWriter:
    return ClaimStatusWriter(client, driver=DRIVER, node=NODE, hardware=hardware, clock=lambda: NOW)


async def test_the_prepared_device_is_written_and_other_drivers_entries_kept(
    apiserver: LocalApiServer, writer: ClaimStatusWriter
) -> None:
    stored = apiserver.put_claim(resource_claim("train", devices=[copy.deepcopy(NIC)]))
    before = writes("written")
    assert await writer.prepared(allocation(stored)) == "written"
    assert writes("written") == before + 1
    found = apiserver.claim("ml", "train")
    nic, gpu = found["status"]["devices"]
    assert nic == NIC
    assert (gpu["device"], gpu["pool"], gpu["data"]["uuid"]) == ("gpu-1", NODE, GPU1)
    assert [(c["type"], c["status"]) for c in gpu["conditions"]] == [("Ready", "True"), ("Healthy", "True")]
    # the write kept the allocation the claim had
    assert found["status"]["allocation"] == stored["status"]["allocation"]

    # again: nothing changed, nothing written
    assert await writer.prepared(allocation(stored)) == "unchanged"
    assert len(puts(apiserver)) == 1

    assert await writer.unprepared(allocation(stored).claim) == "written"
    assert apiserver.claim("ml", "train")["status"]["devices"] == [NIC]


async def test_a_conflict_is_read_again_and_the_other_writers_entry_survives(
    apiserver: LocalApiServer, writer: ClaimStatusWriter
) -> None:
    stored = apiserver.put_claim(resource_claim("train"))

    def nic_driver_writes(claim: dict[str, Any]) -> None:
        claim["status"]["devices"] = [*(claim["status"].get("devices") or []), copy.deepcopy(NIC)]

    apiserver.race_next_claim_status(nic_driver_writes)
    assert await writer.prepared(allocation(stored)) == "written"
    found = apiserver.claim("ml", "train")
    assert [e["driver"] for e in found["status"]["devices"]] == ["nic.example.com", DRIVER]
    assert found["status"]["devices"][0] == NIC
    assert len(puts(apiserver)) == 2

    # the removal races too, and still leaves the other driver's entry as that driver wrote it
    def nic_driver_rewrites(claim: dict[str, Any]) -> None:
        claim["status"]["devices"][0]["data"] = {"mtu": 1500}

    apiserver.race_next_claim_status(nic_driver_rewrites)
    assert await writer.unprepared(allocation(stored).claim) == "written"
    assert apiserver.claim("ml", "train")["status"]["devices"] == [{**NIC, "data": {"mtu": 1500}}]


async def test_conflicts_at_every_try_give_up_without_raising(
    apiserver: LocalApiServer, writer: ClaimStatusWriter
) -> None:
    stored = apiserver.put_claim(resource_claim("train"))

    def touch(claim: dict[str, Any]) -> None:
        claim["metadata"].setdefault("labels", {})["touched"] = str(len(apiserver.requests))

    apiserver.race_next_claim_status(*[touch] * 10)
    before = writes("conflict")
    assert await writer.prepared(allocation(stored)) == "conflict"
    assert writes("conflict") == before + 1
    assert len(puts(apiserver)) == 4 and ours(apiserver.claim("ml", "train")) == []


async def test_a_failing_or_silent_server_is_counted_not_raised(
    apiserver: LocalApiServer, writer: ClaimStatusWriter, client: Any
) -> None:
    stored = apiserver.put_claim(resource_claim("train"))

    def broken(claim: dict[str, Any]) -> None:
        raise ApiError(500, "InternalError", "etcd is unhappy")

    apiserver.race_next_claim_status(broken)
    failed = writes("failed")
    assert await writer.prepared(allocation(stored)) == "failed"
    assert writes("failed") == failed + 1

    # a server that never answers: the write gives up at its bound
    apiserver.hold_claims()
    quick = ClaimStatusWriter(client, driver=DRIVER, node=NODE, budget_s=0.2)
    try:
        assert await quick.prepared(allocation(stored)) == "failed"
    finally:
        apiserver.release_claims()
    assert writes("failed") == failed + 2
    assert ours(apiserver.claim("ml", "train")) == []


async def test_a_claim_gone_or_made_again_is_not_an_error(
    apiserver: LocalApiServer, writer: ClaimStatusWriter
) -> None:
    stored = apiserver.put_claim(resource_claim("train"))
    apiserver.delete_claim("ml", "train")
    assert await writer.unprepared(allocation(stored).claim) == "gone"
    assert await writer.prepared(allocation(stored)) == "gone"
    again = resource_claim("train")
    again["metadata"]["uid"] = "7c1e0000-0000-4000-8000-0000000000ff"
    apiserver.put_claim(again)
    assert await writer.prepared(allocation(stored)) == "gone"
    assert puts(apiserver) == [] and ours(apiserver.claim("ml", "train")) == []


async def test_a_server_that_drops_the_field_is_told_once(
    apiserver: LocalApiServer, writer: ClaimStatusWriter, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.serves_device_status = False
    first = apiserver.put_claim(resource_claim("one"))
    second = apiserver.put_claim(resource_claim("two"))
    with caplog.at_level(logging.WARNING, logger="tangram.kubelet.statuswriter"):
        assert await writer.prepared(allocation(first)) == "unserved"
        assert await writer.prepared(allocation(second)) == "unserved"
    told = [r for r in caplog.records if "does not keep ResourceClaim status.devices" in r.getMessage()]
    assert len(told) == 1
    assert "devices" not in apiserver.claim("ml", "one")["status"]


async def test_the_gpu_health_written_follows_the_inventory(apiserver: LocalApiServer, client: Any) -> None:
    inventory = [hardware()]
    writer = ClaimStatusWriter(client, driver=DRIVER, node=NODE, hardware=lambda: inventory[0])
    stored = apiserver.put_claim(resource_claim("train"))
    assert await writer.prepared(allocation(stored)) == "written"
    inventory[0] = hardware("unhealthy", "XID 79")
    assert await writer.prepared(allocation(stored)) == "written"
    [entry] = ours(apiserver.claim("ml", "train"))
    healthy = entry["conditions"][1]
    assert (healthy["status"], healthy["reason"]) == ("False", "GpuUnhealthy")
    assert healthy["message"] == f"GPU 1 ({GPU1}) is unhealthy: XID 79"


# --- the trust boundary ----------------------------------------------------------------------


async def test_a_claim_allocated_on_another_nodes_pool_is_never_written(
    apiserver: LocalApiServer, writer: ClaimStatusWriter
) -> None:
    # A claim naming this driver's device in another node's pool, with that node's entry in it,
    # asked of this node (as a prepared allocation of either pool): this node writes nothing,
    # and removes nothing, of it.
    theirs = {"driver": DRIVER, "pool": OTHER, "device": "gpu-1", "data": {"uuid": "GPU-of-node-b"}}
    stored = apiserver.put_claim(
        resource_claim("elsewhere", pool=OTHER, devices=[copy.deepcopy(NIC), theirs])
    )
    for pool in (NODE, OTHER):
        assert await writer.prepared(allocation(stored, pool=pool)) == "unchanged"
    assert await writer.unprepared(allocation(stored).claim) == "unchanged"
    assert puts(apiserver) == []
    assert apiserver.claim("ml", "elsewhere")["status"]["devices"] == [NIC, theirs]
