"""Wires the partitioner to NVML and the bus: the log folded first, then reconciliation, then commands."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from services.partitioner.partitioner import Partitioner
from services.partitioner.settings import PartitionerSettings
from tangram.bus import node_claim_sources, partitioner_consumer
from tangram.events import Event, NodeHardware, PartitionRequested
from tangram.nvml import NvmlBackend, open_backend
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.migminors import load_mig_minors
from tangram.partitioning import MigExecutor, PartitionLedger
from tangram.service import ServiceContext, first, follow_all, settle

log = logging.getLogger("tangram.partitioner")


def _gpu_of(event: Event) -> str:
    """Commands for one GPU run in log order; commands for different GPUs run side by side."""
    return event.gpu_uuid if isinstance(event, PartitionRequested) else ""


def open_nvml(settings: PartitionerSettings) -> NvmlBackend:
    return open_backend(sim=settings.sim_machine, state_file=settings.state_file, real=settings.real)


def load_minors(settings: PartitionerSettings) -> Mapping[str, int]:
    """The MIG capability minors table: the given file, the driver's, or the simulator's own."""
    return load_mig_minors(settings.mig_minors_file, simulated=settings.sim_machine is not None)


async def run(ctx: ServiceContext, settings: PartitionerSettings) -> None:
    node = settings.node_name
    nvml = await asyncio.to_thread(open_nvml, settings)
    ledger = PartitionLedger(node)
    minors = load_minors(settings)

    def read_hardware() -> NodeHardware:
        return read_node_hardware(nvml, node, minors=minors)

    async def publish(event: Event) -> object:
        return await ctx.bus.publish(event)

    partitioner = Partitioner(
        node=node,
        executor=MigExecutor(nvml, minors=minors),
        ledger=ledger,
        read_hardware=read_hardware,
        publish=publish,
        producer=f"partitioner@{node}",
        warm_pool=settings.warm_pool,
        claim_release_wait_s=settings.claim_release_wait_s,
        stop=ctx.stop,
    )
    tasks: list[asyncio.Task[None]] = []
    try:
        followers, caught_up = follow_all(
            ctx.bus, node_claim_sources(node), partitioner.observe, stop=ctx.stop
        )
        tasks.extend(followers)
        await first(caught_up, tasks)
        findings = await partitioner.reconcile(settings.clean_orphans)
        log.info(
            "reconciled",
            extra={"findings": {f.kind: sum(g.kind == f.kind for g in findings) for f in findings}},
        )
        tasks.append(asyncio.create_task(partitioner.inventory_loop(ctx.stop)))
        bound = asyncio.Event()
        tasks.append(
            asyncio.create_task(
                ctx.bus.consume(
                    partitioner_consumer(node),
                    partitioner.handle,
                    stop=ctx.stop,
                    ready=bound,
                    order_by=_gpu_of,
                    concurrency=settings.workers,
                )
            )
        )
        await first(bound.wait(), tasks)
        ctx.ready.set()
        log.info("partitioner ready", extra={"parallel_gpus": settings.workers})
        await first(ctx.stop.wait(), tasks)
    finally:
        ctx.stop.set()
        try:
            await settle(tasks)
        finally:
            await partitioner.close()
            nvml.nvmlShutdown()
