"""A test kubelet over the real unix sockets, and a node's worth of events to feed the plugin."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import jsonschema  # type: ignore[import-untyped]
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    MigPlacement,
    NodeHardware,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
)
from tangram.kubelet import InMemoryAllocationSource
from tangram.kubelet.allocations import Pending
from tangram.kubelet.proto import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from tests.support.driver import DRIVER
from tests.support.gpus import h100

NODE = "node-a"
GPU0 = "GPU-00000000-1111-2222-3333-444444444444"
GPU1 = "GPU-55555555-6666-7777-8888-999999999999"
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "libs" / "tangram" / "cdi" / "schema"


def inventory() -> NodeInventory:
    gpus = [
        h100(
            index,
            uuid,
            minor=minor,
            pci_bus_id=f"00000000:{18 + index:02x}:00.0",
            mig_capable=True,
            mig_enabled=index == 1,
        )
        for index, uuid, minor in ((0, GPU0, 0), (1, GPU1, 3))
    ]
    return NodeInventory(key=NODE, hardware=NodeHardware(node=NODE, driver_version="580.95.5", gpus=gpus))


def whole_gpu_allocation(uid: str, *, gpu: int = 0, name: str = "train") -> ClaimAllocated:
    return ClaimAllocated(
        key=uid,
        namespace="default",
        name=name,
        uid=uid,
        node=NODE,
        devices=[
            AllocatedDevice(
                request="gpu",
                driver=DRIVER,
                pool=NODE,
                device=f"gpu-{gpu}",
                gpu_index=gpu,
                gpu_uuid=(GPU0, GPU1)[gpu],
            )
        ],
    )


def mig_allocation(uid: str, *, start: int = 0, command_id: str = "cmd-1") -> ClaimAllocated:
    return ClaimAllocated(
        key=uid,
        namespace="ml",
        name="embed",
        uid=uid,
        node=NODE,
        devices=[
            AllocatedDevice(
                request="mig",
                driver=DRIVER,
                pool=NODE,
                device=f"gpu-1-mig-1g10gb-{start}",
                gpu_index=1,
                gpu_uuid=GPU1,
                profile="1g.10gb",
                profile_id=19,
                placement=MigPlacement(start=start, size=1),
                partition_command=command_id,
            )
        ],
        partitions=[command_id],
    )


def partition_applied(uid: str, *, start: int = 0, command_id: str = "cmd-1") -> PartitionApplied:
    return PartitionApplied(
        key=NODE,
        command_id=command_id,
        node=NODE,
        action="create",
        gpu_uuid=GPU1,
        gpu_index=1,
        profile="1g.10gb",
        placement=MigPlacement(start=start, size=1),
        claim_uid=uid,
        mig_uuid=f"MIG-0000000{start}-aaaa-bbbb-cccc-dddddddddddd",
        gpu_instance_id=13 - start,
        compute_instance_id=0,
        gi_cap_minor=120 + start,
        ci_cap_minor=121 + start,
    )


def partition_failed(uid: str, *, start: int = 0, command_id: str = "cmd-1") -> PartitionFailed:
    return PartitionFailed(
        key=NODE,
        command_id=command_id,
        node=NODE,
        action="create",
        gpu_uuid=GPU1,
        profile="1g.10gb",
        placement=MigPlacement(start=start, size=1),
        claim_uid=uid,
        nvml_error="NVML_ERROR_INSUFFICIENT_RESOURCES",
        reason="the placement is taken",
    )


def schema_validator() -> jsonschema.Draft7Validator:
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    return jsonschema.Draft7Validator(json.loads((SCHEMA_DIR / "schema.json").read_text()), registry=registry)


@dataclass
class PreparedAnswer:
    error: str
    devices: list[tuple[list[str], str, str, list[str]]] = field(default_factory=list)
    share_ids: list[str] = field(default_factory=list)  # per device; "" when not a share (or v1beta1)


class TestKubelet:
    """Plays kubelet: finds plugins in plugins_registry and calls them over their unix sockets."""

    __test__ = False

    def __init__(self, kubelet_root: Path) -> None:
        self.root = kubelet_root
        self._channels: list[grpc.aio.Channel] = []

    def _channel(self, path: str) -> grpc.aio.Channel:
        channel = grpc.aio.insecure_channel(f"unix://{path}")
        self._channels.append(channel)
        return channel

    def registration_sockets(self) -> list[str]:
        return sorted(p.name for p in (self.root / "plugins_registry").glob("*.sock"))

    async def get_info(self, socket_name: str) -> Any:
        stub = pluginregistration_pb2_grpc.RegistrationStub(
            self._channel(str(self.root / "plugins_registry" / socket_name))
        )
        return await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)

    async def notify(self, socket_name: str, *, registered: bool, error: str = "") -> None:
        stub = pluginregistration_pb2_grpc.RegistrationStub(
            self._channel(str(self.root / "plugins_registry" / socket_name))
        )
        await stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=5
        )

    def watch_health(self, endpoint: str) -> Any:
        """The health stream kubelet opens on the DRA socket (feature gate ResourceHealthStatus)."""
        stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(self._channel(endpoint))
        return stub.NodeWatchResources(dra_health_v1alpha1_pb2.NodeWatchResourcesRequest())

    def _dra(self, endpoint: str, version: str) -> Any:
        if version == "v1":
            return dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub(self._channel(endpoint))
        return dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub(self._channel(endpoint))

    async def prepare(
        self, endpoint: str, claims: list[tuple[str, str, str]], *, version: str = "v1"
    ) -> dict[str, PreparedAnswer]:
        messages, stub = self._dra(endpoint, version)
        request = messages.NodePrepareResourcesRequest(
            claims=[messages.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        response = await stub.NodePrepareResources(request, timeout=45)
        return {
            uid: PreparedAnswer(
                error=answer.error,
                devices=[
                    (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
                    for d in answer.devices
                ],
                share_ids=[getattr(d, "share_id", "") for d in answer.devices],
            )
            for uid, answer in response.claims.items()
        }

    async def unprepare(
        self, endpoint: str, claims: list[tuple[str, str, str]], *, version: str = "v1"
    ) -> dict[str, str]:
        messages, stub = self._dra(endpoint, version)
        request = messages.NodeUnprepareResourcesRequest(
            claims=[messages.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        response = await stub.NodeUnprepareResources(request, timeout=45)
        return {uid: answer.error for uid, answer in response.claims.items()}

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()


T = TypeVar("T")


class WatchedSource(InMemoryAllocationSource):
    """An allocation source that says when a call waits on it: a test then knows a prepare is
    blocked on a missing event without guessing how long that takes."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.waiting = asyncio.Event()

    async def wait_for(self, attempt: Callable[[], T], timeout_s: float) -> T:
        def watched() -> T:
            try:
                return attempt()
            except Pending:
                self.waiting.set()
                raise

        return await super().wait_for(watched, timeout_s)


def one_gpu_node(
    node: str, uuid: str, *, index: int = 1, health: str = "healthy", reason: str = ""
) -> NodeHardware:
    """A node's inventory of one H100 (GPU `index`), healthy or not as told."""
    gpu = h100(index, uuid, minor=index, pci_bus_id="00000000:19:00.0", health=health, health_reason=reason)
    return NodeHardware(node=node, driver_version="580.95.5", gpus=[gpu])
