"""Simulated nodes and claims for the allocator service tests, and the allocator run against them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec

from services.allocator.service import run
from services.allocator.settings import AllocatorSettings
from tangram.allocation import DeviceClass, FleetState
from tangram.allocation.ledger import Ledger
from tangram.bus import Bus
from tangram.events import (
    CLAIMS_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    GangMember,
    NodeHardware,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    subject_token,
)
from tangram.events.envelope import new_event_id
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.nvml import SimNvml
from tangram.nvml.inventory import read_node_hardware
from tangram.service import ServiceContext
from tests.support.polling import until

# The shipped DeviceClasses, by name: what the allocator decides with by default.
CLASSES = {c.name: c for c in (DeviceClass.from_manifest(m) for m in load_shipped_device_classes())}


def hardware(machine: str, node: str) -> NodeHardware:
    nvml = SimNvml.from_machine(machine)
    nvml.nvmlInit()
    return read_node_hardware(nvml, node)


def inventory(machine: str, node: str) -> NodeInventory:
    return NodeInventory(key=subject_token(node), hardware=hardware(machine, node))


def gpus(count: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tangram.dev", "count": count}}]
        }
    }


def mig(profile: str) -> dict[str, Any]:
    expression = f'device.attributes["gpu.tangram.dev"].profile == "{profile}"'
    return {
        "devices": {
            "requests": [
                {
                    "name": "mig",
                    "exactly": {
                        "deviceClassName": "mig.gpu.tangram.dev",
                        "selectors": [{"cel": {"expression": expression}}],
                    },
                }
            ]
        }
    }


def applied(command: PartitionRequested, mig_uuid: str) -> PartitionApplied:
    """The node's answer that it carried out `command` (naming the instance `mig_uuid`)."""
    return PartitionApplied(
        key=command.key, command_id=command.command_id, node=command.node, action=command.action,
        gpu_uuid=command.gpu_uuid, gpu_index=command.gpu_index, profile=command.profile,
        placement=command.placement, claim_uid=command.claim_uid, mig_uuid=mig_uuid,
    )  # fmt: skip


def ledger_on(machine: str, node: str = "n1") -> Ledger:
    """A ledger with the shipped classes that knows one node of `machine`."""
    book = Ledger(fleet=FleetState(), classes=CLASSES)
    book.apply(inventory(machine, node), live=False)
    return book


def refused(command: PartitionRequested, reason: str = "slices in use") -> PartitionFailed:
    """The node's answer that it could not carry out `command`."""
    return PartitionFailed(
        key=command.key, command_id=command.command_id, node=command.node, action=command.action,
        gpu_uuid=command.gpu_uuid, profile=command.profile, placement=command.placement,
        claim_uid=command.claim_uid, nvml_error="NVML_ERROR_INSUFFICIENT_RESOURCES", reason=reason,
    )  # fmt: skip


def released(claim: ClaimRequested | ClaimAllocated) -> ClaimReleased:
    return ClaimReleased(key=claim.uid, namespace=claim.namespace, name=claim.name, uid=claim.uid)


def again(event: ClaimRequested, attempt: int) -> ClaimRequested:
    """The claim asked again with a later attempt, as a new message."""
    return msgspec.structs.replace(event, attempt=attempt, event_id=new_event_id(), time=datetime.now(UTC))


def request(n: int, spec: dict[str, Any], namespace: str = "team") -> ClaimRequested:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimRequested(key=uid, namespace=namespace, name=f"claim-{n}", uid=uid, spec=spec)


@asynccontextmanager
async def allocator(bus: Bus, url: str, **settings: Any) -> AsyncIterator[ServiceContext]:
    ctx = ServiceContext(name="allocator", bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(run(ctx, AllocatorSettings(nats_urls=(url,), **settings)))
    await asyncio.wait_for(ctx.ready.wait(), 30)
    try:
        yield ctx
    finally:
        ctx.stop.set()
        await task


async def log(bus: Bus, stream: str = CLAIMS_STREAM) -> list[Event]:
    return [e async for _, e in bus.replay(stream)]


async def log_until(
    bus: Bus, predicate: Callable[[list[Event]], bool], stream: str = CLAIMS_STREAM
) -> list[Event]:
    """The stream's log, once `predicate` holds for it."""

    async def matching() -> tuple[list[Event]] | None:
        events = await log(bus, stream)
        return (events,) if predicate(events) else None

    found: tuple[list[Event]] = await until(f"the {stream} log to match", matching, 30, every=0.05)
    return found[0]


def decisions(events: list[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, ClaimAllocated | ClaimFailed)]


def member(
    n: int, group: str, size: int, count: int = 4, *, nvlink: bool = False, attempt: int = 0
) -> ClaimRequested:
    """Claim n of a pod of `group` (`size` pods), asking `count` whole GPUs."""
    gang = GangMember(group=group, size=size, pod=f"{group}-pod-{n}", nvlink_domain=nvlink)
    return msgspec.structs.replace(request(n, gpus(count)), gang=gang, attempt=attempt)


def of(kind: type, outputs: list[Event]) -> list:
    return [o for o in outputs if isinstance(o, kind)]
