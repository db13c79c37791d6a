"""Wires the kubelet plugin to the bus: allocations and partition results in, prepare events out."""

from __future__ import annotations

import logging

from services.cdi.settings import CdiSettings
from tangram.bus import node_claim_sources
from tangram.events import INVENTORY_STREAM, ClaimPrepared, ClaimUnprepared, subject_token
from tangram.kubelet import InMemoryAllocationSource, PluginConfig, build_plugin
from tangram.service import ServiceContext, first, follow_all, settle

log = logging.getLogger("tangram.cdi")


def follow_sources(node: str) -> list[tuple[str, tuple[str, ...]]]:
    """What resolves this node's claims: its inventory, the decisions, its partition results."""
    return [(INVENTORY_STREAM, (f"tangram.inventory.{subject_token(node)}",)), *node_claim_sources(node)]


async def run(ctx: ServiceContext, settings: CdiSettings) -> None:
    source = InMemoryAllocationSource(settings.node_name)
    followers, caught_up = follow_all(
        ctx.bus, follow_sources(settings.node_name), source.observe, stop=ctx.stop
    )
    try:
        await first(caught_up, followers)
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
        await settle(followers)
