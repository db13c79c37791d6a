"""Publishes the node's inventory at start, on change and on GPU health events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

import msgspec
from prometheus_client import Counter, Gauge

from services.discovery.health import XidWatcher, is_critical
from services.discovery.settings import DiscoverySettings
from services.discovery.slices import SliceSync, slice_sync
from tangram.events import DeviceHealthChanged, NodeHardware, NodeInventory, subject_token
from tangram.nvml import NvmlBackend, open_backend
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.migminors import MigMinorsError, load_mig_minors
from tangram.service import ServiceContext

log = logging.getLogger("tangram.discovery")

PUBLISHED = Counter("tangram_discovery_inventories_published_total", "Inventories published")
GPUS = Gauge("tangram_discovery_gpus", "GPUs on this node by health", ["health"])
XIDS = Counter("tangram_discovery_xid_events_total", "XID events seen", ["xid"])


class InventoryPublisher:
    """Reads NVML, publishes when the hardware picture changed (or when asked to)."""

    def __init__(
        self,
        ctx: ServiceContext,
        nvml: NvmlBackend,
        node: str,
        minors: Mapping[str, int] | None,
        slices: SliceSync | None = None,
    ) -> None:
        self._ctx = ctx
        self._slices = slices
        self._minors = minors
        self._nvml = nvml
        self._node = node
        self._token = subject_token(node)
        self._last: NodeHardware | None = None
        self._generation = 0
        self.health: dict[int, tuple[str, str]] = {}
        self.changed = asyncio.Event()

    async def refresh(self) -> bool:
        hardware = await asyncio.to_thread(
            read_node_hardware, self._nvml, self._node, health=dict(self.health), minors=self._minors
        )
        if self._slices is not None:
            hardware = msgspec.structs.replace(
                hardware, network_block=await self._slices.topology.network_block()
            )
        if hardware == self._last:
            return False
        self._generation += 1
        await self._ctx.bus.publish(
            NodeInventory(
                key=self._token,
                producer=f"discovery@{self._node}",
                hardware=hardware,
                generation=self._generation,
            )
        )
        self._last = hardware
        PUBLISHED.inc()
        unhealthy = sum(1 for gpu in hardware.gpus if gpu.health != "healthy")
        GPUS.labels("healthy").set(len(hardware.gpus) - unhealthy)
        GPUS.labels("unhealthy").set(unhealthy)
        log.info(
            "inventory published",
            extra={"gpus": len(hardware.gpus), "generation": self._generation, "unhealthy": unhealthy},
        )
        if self._slices is not None:
            await self._slices.publish(hardware, self._generation)
        return True

    def gpu_uuid(self, index: int) -> str:
        if self._last is not None:
            for gpu in self._last.gpus:
                if gpu.index == index:
                    return gpu.uuid
        return ""


async def run(ctx: ServiceContext, settings: DiscoverySettings) -> None:
    nvml = await asyncio.to_thread(
        open_backend, sim=settings.sim, state_file=settings.state_file, real=settings.real
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            slices = await stack.enter_async_context(slice_sync(settings)) if settings.kubernetes else None
            await _serve(ctx, settings, nvml, slices)
    finally:
        await asyncio.to_thread(nvml.nvmlShutdown)


async def _serve(
    ctx: ServiceContext, settings: DiscoverySettings, nvml: NvmlBackend, slices: SliceSync | None
) -> None:
    publisher = InventoryPublisher(ctx, nvml, settings.node_name, _minors(settings), slices)
    loop = asyncio.get_running_loop()
    xids: asyncio.Queue[tuple[int, int]] = asyncio.Queue()

    def on_xid(index: int, xid: int) -> None:
        loop.call_soon_threadsafe(xids.put_nowait, (index, xid))

    watcher = XidWatcher(nvml, on_xid)
    await asyncio.to_thread(watcher.start)
    try:
        await publisher.refresh()
        if slices is not None:
            ctx.readiness.append(slices.readiness_problem)
        ctx.ready.set()
        while not ctx.stop.is_set():
            with contextlib.suppress(TimeoutError):
                index, xid = await asyncio.wait_for(xids.get(), settings.refresh_s)
                await _handle_xid(ctx, publisher, settings.node_name, index, xid)
            if not ctx.stop.is_set() and not await publisher.refresh() and slices is not None:
                await slices.retry_if_due()
    finally:
        await asyncio.to_thread(watcher.stop)


def _minors(settings: DiscoverySettings) -> Mapping[str, int] | None:
    """Without the table, MIG instances are published without capability minors (and logged)."""
    try:
        return load_mig_minors(settings.mig_minors_file, simulated=settings.sim is not None)
    except MigMinorsError as error:
        log.warning("MIG capability minors unavailable", extra={"error": str(error)})
        return None


async def _handle_xid(
    ctx: ServiceContext, publisher: InventoryPublisher, node: str, index: int, xid: int
) -> None:
    XIDS.labels(str(xid)).inc()
    if not is_critical(xid):
        log.info("application XID ignored", extra={"gpu": index, "xid": xid})
        return
    reason = f"XID {xid}"
    publisher.health[index] = ("unhealthy", reason)
    log.warning("GPU marked unhealthy", extra={"gpu": index, "xid": xid})
    await ctx.bus.publish(
        DeviceHealthChanged(
            key=subject_token(node),
            producer=f"discovery@{node}",
            node=node,
            gpu_uuid=publisher.gpu_uuid(index),
            healthy=False,
            reason=reason,
            xid=xid,
        )
    )
