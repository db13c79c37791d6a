"""Slice publishing against a real kube-apiserver, kube-controller-manager and etcd.

What the fake API server cannot show: that the real server keeps what Tangram writes, that the
garbage collector removes slices with their Node, that the watch repairs drift made through the
real API, and that layout detection reads the feature gates off the real server.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pynvml
import pytest
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from services.discovery.settings import DiscoverySettings
from services.discovery.slices import slice_sync
from tangram.kubernetes.api import SlicePublisher, call
from tangram.kubernetes.api.layout import detect_layout
from tangram.local.controlplane import ControlPlane, Release, register_node
from tangram.nvml.inventory import read_node_hardware
from tests.kubernetes.api.helpers import machine_slices, simulated
from tests.support.driver import DRIVER
from tests.support.polling import until

# the first test to use a control plane also pays for starting it (a minute or more on a loaded
# machine), inside its own timeout
pytestmark = [pytest.mark.timeout(300), pytest.mark.controlplane]

POLL_S = 0.1


async def pool(kube: Any, node: str) -> dict[str, Any]:
    """The node's slices as the server holds them, raw JSON by name."""
    response = await ResourceV1Api(kube).list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={DRIVER}", _preload_content=False
    )
    return {item["metadata"]["name"]: item for item in (await response.json())["items"]}


async def test_published_slices_are_owned_by_their_node_and_go_with_it(
    kube: Any, release: Release, unique: str, tmp_path: Path
) -> None:
    node = await register_node(kube, unique)
    slices = machine_slices(
        simulated("hgx-h200", tmp_path / "gpus.json"), unique, generation=1, k8s_version=release.layout
    )

    report = await SlicePublisher(kube, node=unique, driver=DRIVER).sync(slices)

    assert report.ok, report.error
    stored = await pool(kube, unique)
    assert sorted(stored) == sorted(s["metadata"]["name"] for s in slices)
    for resource_slice in slices:
        held = stored[resource_slice["metadata"]["name"]]
        assert held["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": unique, "uid": node.metadata.uid, "controller": True}
        ]
        # 1.34: counter sets beside their devices; 1.35 and later: counters-only slices of their own
        assert held["spec"].get("sharedCounters") == resource_slice["spec"].get("sharedCounters")
        assert [d["name"] for d in held["spec"].get("devices") or []] == [
            d["name"] for d in resource_slice["spec"].get("devices", [])
        ]
    assert any(s["spec"].get("sharedCounters") for s in slices) and any(
        s["spec"].get("devices") for s in slices
    )

    await call("delete Node", CoreV1Api(kube).delete_node(unique))

    async def collected() -> bool:
        return not await pool(kube, unique)

    await until("the garbage collector deletes the slices of a deleted Node", collected, 60, every=POLL_S)


async def test_the_watch_restores_slices_deleted_edited_or_added_by_someone_else(
    kube: Any, release: Release, unique: str, tmp_path: Path
) -> None:
    await register_node(kube, unique)
    slices = machine_slices(
        simulated("l40s-8", tmp_path / "gpus.json"), unique, generation=1, k8s_version=release.layout
    )
    [name] = [s["metadata"]["name"] for s in slices]
    publisher = SlicePublisher(kube, node=unique, driver=DRIVER, backoff_s=0.2)
    assert (await publisher.sync(slices)).ok
    watch = asyncio.create_task(publisher.watch())
    api = ResourceV1Api(kube)
    try:
        # deleted: put back
        await call("delete", api.delete_resource_slice(name))

        async def restored() -> bool:
            return name in await pool(kube, unique)

        await until("a deleted slice is restored", restored, 30, every=POLL_S)

        # edited without touching the hash annotation: the device list is put back
        current = (await pool(kube, unique))[name]
        current["spec"]["devices"] = current["spec"]["devices"][:1]
        await call("replace", api.replace_resource_slice(name, current))

        async def whole_again() -> bool:
            held = (await pool(kube, unique)).get(name)
            return held is not None and len(held["spec"]["devices"]) == 8

        await until("an edited slice gets its eight devices back", whole_again, 30, every=POLL_S)

        # a stranger's slice in the pool: removed
        stranger = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{unique}-stranger"},
            "spec": {
                "driver": DRIVER,
                "nodeName": unique,
                "pool": {"name": unique, "generation": 99, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-99"}],
            },
        }
        await call("create", api.create_resource_slice(stranger))

        async def gone() -> bool:
            return f"{unique}-stranger" not in await pool(kube, unique)

        await until("a slice added to the pool by someone else is deleted", gone, 30, every=POLL_S)
        assert publisher.repairs >= 3
        final = await pool(kube, unique)
        assert list(final) == [name]
        assert [d["name"] for d in final[name]["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)


async def test_layout_detection_reads_the_gates_of_the_server(
    kube: Any, kube_whole_devices: Any, release: Release, unique: str
) -> None:
    with_partitions = await detect_layout(kube, node=unique, driver=DRIVER)
    without = await detect_layout(kube_whole_devices, node=unique, driver=DRIVER)

    assert (with_partitions.k8s_version, with_partitions.partitionable, with_partitions.taints) == (
        release.minor,
        True,
        True,
    )
    assert with_partitions.server_version.startswith(f"v{release.minor}.")
    # consumable capacity: alpha and off on 1.34, beta and on from 1.36
    assert with_partitions.consumable is (not release.dra_alpha)
    assert (without.k8s_version, without.partitionable, without.taints) == (release.minor, False, True)
    assert without.degraded
    # the probes were dry runs: nothing was left behind
    listed = await ResourceV1Api(kube).list_resource_slice(field_selector=f"spec.nodeName={unique}")
    assert listed.items == []


async def test_discovery_degrades_to_whole_gpus_and_existing_instances_without_partitionable_devices(
    controlplane_whole_devices: ControlPlane,
    kube_whole_devices: Any,
    unique: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = simulated("dgx-h100", tmp_path / "gpus.json")
    # GPU 3 already holds a 3g instance at memory slice 4; it is offered, its other placements are not
    gpu = nvml.nvmlDeviceGetHandleByIndex(3)
    nvml.nvmlDeviceSetMigMode(gpu, 1)
    profile = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, 2)  # 3g, profile index 2
    placement = type("Placement", (), {"start": 4, "size": 4})()
    instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, profile.id, placement)
    # with its compute instance, as an instance in use has: only then is it a MIG device with a UUID
    full = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        instance, 2, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )  # the 3g compute instance profile
    nvml.nvmlGpuInstanceCreateComputeInstance(instance, full.id)

    await register_node(kube_whole_devices, unique)
    settings = DiscoverySettings(
        nats_urls=("nats://127.0.0.1:1",),
        node_name=unique,
        sim="dgx-h100",
        state_file=tmp_path / "gpus.json",
        kubernetes=True,
        kubeconfig=controlplane_whole_devices.kubeconfig,
    )
    caplog.set_level(logging.INFO, logger="tangram.kubernetes.api.layout")
    async with slice_sync(settings) as sync:
        report = await sync.publish(read_node_hardware(nvml, unique), 1)
        layout = await sync.layout()

    assert report is not None and report.ok, report
    assert layout is not None and layout.degraded
    assert any("partitionable devices are off" in r.getMessage() for r in caplog.records)
    stored = await pool(kube_whole_devices, unique)
    devices = [d for s in stored.values() for d in s["spec"].get("devices", [])]
    names = sorted(d["name"] for d in devices)
    assert names == sorted([*(f"gpu-{i}" for i in range(8) if i != 3), "gpu-3-mig-3g-40gb-4"])
    assert all("consumesCounters" not in d for d in devices)
    assert all("sharedCounters" not in s["spec"] for s in stored.values())
    [mig] = [d for d in devices if d["name"] == "gpu-3-mig-3g-40gb-4"]
    assert mig["attributes"]["uuid"]["string"].startswith("MIG-")
