"""kubelet's DRA health service: each device's health from the node's inventory, over the real socket."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from tangram.events import NodeHardware
from tangram.kubelet.health import HealthBoard, health_of
from tangram.kubelet.proto import dra_health_v1alpha1_pb2 as health_pb2
from tests.allocator.helpers import hardware as simulated
from tests.kubelet.fakes import NODE, inventory
from tests.kubelet.harness import PluginHarness


def with_gpu_health(hardware: NodeHardware, index: int, health: str) -> NodeHardware:
    gpus = [msgspec.structs.replace(g, health=health) if g.index == index else g for g in hardware.gpus]
    return msgspec.structs.replace(hardware, gpus=gpus)


def statuses(response: Any) -> dict[str, int]:
    assert {d.device.pool_name for d in response.devices} <= {NODE}
    return {d.device.device_name: d.health for d in response.devices}


def test_a_failing_gpu_makes_its_whole_device_and_its_mig_devices_unhealthy() -> None:
    hardware = with_gpu_health(simulated("dgx-h100", NODE), 1, "unhealthy")
    health = health_of(hardware)
    assert health["gpu-0"] == "healthy" and health["gpu-1"] == "unhealthy"
    gpu1_mig = [name for name in health if name.startswith("gpu-1-mig-")]
    assert gpu1_mig and all(health[name] == "unhealthy" for name in gpu1_mig)
    assert all(status == "healthy" for name, status in health.items() if name.startswith("gpu-0"))


def test_a_device_no_longer_advertised_is_reported_unknown_once() -> None:
    board = HealthBoard(NODE)
    hardware = inventory().hardware
    assert board.update(hardware, now=100) is True
    assert board.update(hardware, now=200) is False  # nothing changed, nothing to send
    gone = msgspec.structs.replace(hardware, gpus=[g for g in hardware.gpus if g.index == 0])
    assert board.update(gone, now=300) is True
    unknown = {d.device: d.since for d in board.snapshot() if d.status == "unknown"}
    assert "gpu-1" in unknown and unknown["gpu-1"] == 300
    assert all(name.startswith("gpu-1") for name in unknown)
    assert {d.device: d.since for d in board.snapshot()}["gpu-0"] == 100  # unchanged since it was seen
    assert board.update(gone, now=400) is True  # the unknown ones are dropped after one report
    assert all(d.status != "unknown" for d in board.snapshot())
    assert board.update(hardware, now=500) is True


async def test_kubelet_watches_device_health_change_over_the_dra_socket(harness: PluginHarness) -> None:
    assert harness.plugin is not None
    board = harness.plugin.health
    hardware = inventory().hardware
    board.update(hardware)
    stream = harness.kubelet.watch_health(harness.endpoint)
    try:
        first = statuses(await asyncio.wait_for(stream.read(), 10))
        assert first["gpu-0"] == health_pb2.HEALTHY and first["gpu-1"] == health_pb2.HEALTHY
        assert len(first) == len(health_of(hardware))
        board.update(with_gpu_health(hardware, 0, "unhealthy"))  # an ECC error on GPU 0
        second = statuses(await asyncio.wait_for(stream.read(), 10))
        assert second["gpu-0"] == health_pb2.UNHEALTHY and second["gpu-1"] == health_pb2.HEALTHY
    finally:
        stream.cancel()
