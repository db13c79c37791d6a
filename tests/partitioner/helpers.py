"""Shared set-up of the partitioner tests: simulated nodes, an executor, a Partitioner without NATS."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pynvml
from nats.aio.msg import Msg

from services.partitioner.partitioner import Partitioner
from services.partitioner.service import run
from services.partitioner.settings import PartitionerSettings
from tangram.bus import Bus
from tangram.events import (
    Event,
    MigPlacement,
    NodeHardware,
    PartitionRequested,
    decode,
    subject_token,
)
from tangram.nvml import SimNvml, parse_mig_minors, render_mig_minors
from tangram.nvml.inventory import read_node_hardware
from tangram.partitioning import MigExecutor, PartitionLedger
from tangram.service import ServiceContext

NODE = "node-a"
MINORS = parse_mig_minors(render_mig_minors())


def sim(machine: str, state_file: Path | None = None) -> SimNvml:
    nvml = SimNvml.from_machine(machine, state_file=state_file)
    nvml.nvmlInit()
    return nvml


def enable_mig_with_reset(nvml: SimNvml, gpu: int) -> None:
    """What an operator does on Ampere: set MIG mode, then reset the GPU."""
    device = nvml.nvmlDeviceGetHandleByIndex(gpu)
    assert (
        nvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_ERROR_RESET_REQUIRED
    )
    nvml.sim_reset_gpu(gpu)


def gpu_uuid(nvml: SimNvml, gpu: int) -> str:
    uuid: str = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(gpu))
    return uuid


class Collected:
    """Stands in for the bus: keeps what the partitioner publishes."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


def partitioner(
    nvml: SimNvml,
    collected: Collected,
    *,
    ledger: PartitionLedger | None = None,
    warm_pool: dict[str, int] | None = None,
    claim_release_wait_s: float = 0.0,
    log_lag_s: float = 0.3,
) -> Partitioner:
    def read() -> NodeHardware:
        return read_node_hardware(nvml, NODE)

    return Partitioner(
        node=NODE,
        executor=MigExecutor(nvml, minors=MINORS),
        ledger=ledger or PartitionLedger(NODE),
        read_hardware=read,
        publish=collected,
        producer=f"partitioner@{NODE}",
        warm_pool=warm_pool,
        claim_release_wait_s=claim_release_wait_s,
        log_lag_s=log_lag_s,
    )


def command(
    command_id: str,
    nvml: SimNvml,
    *,
    action: str = "create",
    gpu: int = 0,
    profile: str,
    profile_id: int,
    start: int,
    size: int,
    claim_uid: str = "claim-1",
    mig_uuid: str = "",
    node: str = NODE,
) -> PartitionRequested:
    return PartitionRequested(
        key=subject_token(node),
        command_id=command_id,
        node=node,
        action=action,  # type: ignore[arg-type]
        gpu_uuid=gpu_uuid(nvml, gpu),
        gpu_index=gpu,
        profile=profile,
        profile_id=profile_id,
        placement=MigPlacement(start=start, size=size),
        claim_uid=claim_uid,
        mig_uuid=mig_uuid,
    )


class Inbox:
    def __init__(self) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        # partition results read while waiting for another command's, by command id
        self.results: dict[str, Event] = {}

    async def deliver(self, msg: Msg) -> None:
        self.events.put_nowait(decode(msg.data))

    async def next(self, kind: type[Event], timeout: float = 60.0) -> Event:
        while True:
            event = await asyncio.wait_for(self.events.get(), timeout)
            if isinstance(event, kind):
                return event


@asynccontextmanager
async def running(bus: Bus, settings: PartitionerSettings) -> AsyncIterator[ServiceContext]:
    ctx = ServiceContext(name="partitioner", bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(run(ctx, settings))
    ready = asyncio.create_task(ctx.ready.wait())
    await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED, timeout=30)
    if not ready.done():
        ready.cancel()
        await asyncio.gather(ready, return_exceptions=True)
        await task  # raises the start-up failure
        raise AssertionError("the partitioner did not become ready")
    try:
        yield ctx
    finally:
        ctx.stop.set()
        await task


async def subscribe(bus: Bus, subject: str) -> Inbox:
    inbox = Inbox()
    await bus.nats.subscribe(subject, cb=inbox.deliver)
    return inbox
