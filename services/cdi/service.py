"""Wires the kubelet plugin to its claim source: the allocator's events on the bus, or, in
Kubernetes, the API server, with the bus carrying this node's partition commands and results."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from services.cdi.settings import CdiSettings
from tangram.bus import node_claim_sources
from tangram.cdi.driver import DriverFiles, discover_driver
from tangram.events import (
    INVENTORY_STREAM,
    ClaimPrepared,
    ClaimUnprepared,
    Event,
    NodeInventory,
    PartitionRequested,
    subject_token,
)
from tangram.imex import ImexDomains
from tangram.imex.domains import REAL_DAEMON_COMMAND, SIMULATED_DAEMON_COMMAND
from tangram.kubelet import (
    AllocationSource,
    HealthBoard,
    InMemoryAllocationSource,
    PluginConfig,
    build_plugin,
)
from tangram.kubelet.kubesource import ApiClaimReader, KubeAllocationSource
from tangram.kubelet.statuswriter import ClaimStatusWriter
from tangram.kubernetes.api import connect
from tangram.kubernetes.api.nodeaddresses import NodeAddresses
from tangram.nvml import open_backend
from tangram.service import ServiceContext, first, follow_all, settle
from tangram.sharing import REAL_CONTROL_COMMAND, SIMULATED_CONTROL_COMMAND, SharingManager

log = logging.getLogger("tangram.cdi")


def follow_sources(node: str) -> list[tuple[str, tuple[str, ...]]]:
    """What resolves this node's claims: its inventory, the decisions, its partition results."""
    return [(INVENTORY_STREAM, (f"tangram.inventory.{subject_token(node)}",)), *node_claim_sources(node)]


async def find_driver(settings: CdiSettings, nvml_version: str | None) -> DriverFiles:
    """The driver files the specs mount; DriverRootError (fatal at start) rather than a partial spec."""
    root = settings.driver_root_mount or settings.driver_root
    driver = await asyncio.to_thread(discover_driver, root, expected_version=nvml_version)
    log.info(
        "driver files found",
        extra={
            "driver_root": str(root),
            "driver_version": driver.version,
            "libraries": len(driver.libraries),
            "binaries": len(driver.binaries),
            "firmware": len(driver.firmware),
        },
    )
    return driver


@contextlib.asynccontextmanager
async def kube_api(settings: CdiSettings) -> AsyncIterator[Any]:
    """The API server's client with --kubernetes, else None."""
    if not settings.kubernetes:
        yield None
        return
    api = await connect(kubeconfig=settings.kubeconfig)
    try:
        yield api
    finally:
        await api.close()


def claim_source(
    ctx: ServiceContext, settings: CdiSettings, view: InMemoryAllocationSource, api: Any
) -> AllocationSource:
    if api is None:
        return view

    async def send(command: PartitionRequested) -> object:
        return await ctx.bus.publish(command)

    return KubeAllocationSource(
        node=settings.node_name,
        driver=settings.driver_name,
        reader=ApiClaimReader(api),
        view=view,
        send=send,
        producer=f"cdi@{settings.node_name}",
    )


def claim_status(settings: CdiSettings, view: InMemoryAllocationSource, api: Any) -> ClaimStatusWriter | None:
    """In Kubernetes, what the node prepared is written to each claim's status.devices (with its
    GPU's health, from the node's inventory), for `kubectl get resourceclaim` to show."""
    if api is None:
        return None
    return ClaimStatusWriter(
        api, driver=settings.driver_name, node=settings.node_name, hardware=lambda: view.hardware
    )


def sharing_manager(settings: CdiSettings) -> SharingManager | None:
    """The node's MPS daemons and compute modes, where the service has NVML to set them with."""
    if not settings.sharing:
        return None
    nvml = open_backend(sim=settings.sim_machine, state_file=settings.state_file, real=settings.real)
    control = settings.mps_control or (
        SIMULATED_CONTROL_COMMAND if settings.sim_machine is not None else REAL_CONTROL_COMMAND
    )
    return SharingManager(nvml, root=settings.mps_root, control_command=control)


def imex_domains(settings: CdiSettings, api: Any) -> ImexDomains:
    """The IMEX daemon of the NVLink domain the node serves: NVIDIA's, or the stand-in on a
    simulated node, whose channel device nodes are plain files in its simulated driver root."""
    simulated = settings.sim_machine is not None
    command = settings.imex_daemon or (SIMULATED_DAEMON_COMMAND if simulated else REAL_DAEMON_COMMAND)
    return ImexDomains(
        node=settings.node_name,
        root=settings.imex_root,
        dev_root=settings.driver_root_mount or settings.driver_root,
        command=command,
        simulated=simulated,
        # in Kubernetes, peers are listed by their Nodes' addresses: node names need not resolve
        addresses=NodeAddresses(api) if api is not None else None,
    )


async def run(ctx: ServiceContext, settings: CdiSettings) -> None:
    view = InMemoryAllocationSource(settings.node_name, driver=settings.driver_name)
    health = HealthBoard(settings.node_name, driver=settings.driver_name)
    nvml_version: list[str] = []  # the driver version discovery read from NVML, once its inventory is in

    def observe(event: Event) -> None:
        if isinstance(event, NodeInventory) and event.hardware.node == settings.node_name:
            nvml_version[:] = [event.hardware.driver_version]
            health.update(event.hardware)
        view.observe(event)

    followers, caught_up = follow_all(ctx.bus, follow_sources(settings.node_name), observe, stop=ctx.stop)
    try:
        await first(caught_up, followers)
        driver = await find_driver(settings, nvml_version[0] if nvml_version else None)
        config = PluginConfig(
            node_name=settings.node_name,
            driver_name=settings.driver_name,
            kubelet_root=settings.kubelet_root,
            cdi_dir=settings.cdi_dir,
            driver_root=settings.driver_root,
            cdi_hook_path=settings.cdi_hook_path,
            resolve_timeout_s=settings.resolve_timeout_s,
        )

        async def publish(event: ClaimPrepared | ClaimUnprepared) -> None:
            await ctx.bus.publish(event)

        async with kube_api(settings) as api:
            plugin = await build_plugin(
                config,
                claim_source(ctx, settings, view, api),
                on_event=publish,
                producer=f"cdi@{settings.node_name}",
                driver=driver,
                health=health,
                sharing=await asyncio.to_thread(sharing_manager, settings),
                imex=imex_domains(settings, api),
                status=claim_status(settings, view, api),
            )
            async with plugin:
                ctx.readiness.append(plugin.registration_problem)
                ctx.ready.set()
                log.info(
                    "kubelet plugin serving",
                    extra={"dra_socket": str(config.dra_socket), "kubernetes": settings.kubernetes},
                )
                await ctx.stop.wait()
    finally:
        ctx.stop.set()
        await settle(followers)
