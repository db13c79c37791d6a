"""Wires the kubelet plugin to the bus: allocations and partition results in, prepare events out."""

from __future__ import annotations

import asyncio
import logging

from services.cdi.settings import CdiSettings
from tangram.events import (
    CLAIMS_STREAM,
    INVENTORY_STREAM,
    NODES_STREAM,
    ClaimPrepared,
    ClaimUnprepared,
    subject_token,
)
from tangram.kubelet import InMemoryAllocationSource, PluginConfig, build_plugin
from tangram.service import ServiceContext

log = logging.getLogger("tangram.cdi")


def follow_subjects(node: str) -> list[tuple[str, tuple[str, ...]]]:
    """(stream, subjects) pairs whose history and live events resolve this node's claims."""
    token = subject_token(node)
    return [
        (INVENTORY_STREAM, (f"tangram.inventory.{token}",)),
        (
            CLAIMS_STREAM,
            (
                "tangram.claim.allocated.>",
                "tangram.claim.failed.>",
                "tangram.claim.released.>",
            ),
        ),
        (
            NODES_STREAM,
            (
                f"tangram.node.{token}.partition.applied",
                f"tangram.node.{token}.partition.failed",
            ),
        ),
    ]


async def run(ctx: ServiceContext, settings: CdiSettings) -> None:
    source = InMemoryAllocationSource(settings.node_name)
    followers = []
    caught_up = []
    for stream, subjects in follow_subjects(settings.node_name):
        done = asyncio.Event()
        caught_up.append(done)
        followers.append(
            asyncio.create_task(
                ctx.bus.follow(stream, subjects, source.observe, stop=ctx.stop, caught_up=done)
            )
        )
    try:
        await asyncio.gather(*(event.wait() for event in caught_up))
        config = PluginConfig(
            node_name=settings.node_name,
            driver_name=settings.driver_name,
            kubelet_root=settings.kubelet_root,
            cdi_dir=settings.cdi_dir,
            driver_root=settings.driver_root,
            resolve_timeout_s=settings.resolve_timeout_s,
        )

        async def publish(event: ClaimPrepared | ClaimUnprepared) -> None:
            await ctx.bus.publish(event)

        plugin = await build_plugin(config, source, on_event=publish, producer=f"cdi@{settings.node_name}")
        async with plugin:
            ctx.ready.set()
            log.info("kubelet plugin serving", extra={"dra_socket": str(config.dra_socket)})
            await ctx.stop.wait()
    finally:
        ctx.stop.set()
        await asyncio.gather(*followers, return_exceptions=True)
