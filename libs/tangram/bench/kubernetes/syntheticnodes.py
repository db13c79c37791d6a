"""The synthetic nodes of `tangram bench kubernetes --synthetic-nodes`: Node objects whose
ResourceSlices Tangram's slice publisher writes (in the layout the API server takes, as discovery
would), and, when Tangram decides, NATS and the allocator in its Kubernetes mode with the nodes'
inventories on the bus and every partition command answered at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from tangram import DRIVER_NAME
from tangram.bench.kubernetes.deciders import Decider
from tangram.bench.kubernetes.settling import get_text
from tangram.bench.kubesim import BenchError, until
from tangram.bus import Bus, BusConfig
from tangram.events import (
    NODES_STREAM,
    Event,
    NodeHardware,
    NodeInventory,
    PartitionApplied,
    PartitionRequested,
    subject_token,
)
from tangram.kubernetes.api import KubeApiError, SlicePublisher, call
from tangram.kubernetes.api.layout import detect_layout, layout_slices
from tangram.local.clusterup import install_device_classes
from tangram.local.controlplane import free_ports, register_node
from tangram.local.processes import LocalCluster

SETUP_CONCURRENCY = 16  # Nodes and slices written at once while the fleet is set up
ALLOCATOR_READY_S = 300.0


async def publish_fleet(api: Any, hardware: Sequence[NodeHardware], *, labels: dict[str, str]) -> str:
    """Register every node and publish its ResourceSlices in the layout the server takes; returns
    the layout's Kubernetes version."""
    await install_device_classes(api)
    layout = await detect_layout(api, node=hardware[0].node, driver=DRIVER_NAME)
    slots = asyncio.Semaphore(SETUP_CONCURRENCY)

    async def one(hw: NodeHardware) -> None:
        async with slots:
            await register_node(api, hw.node, labels=labels)
            slices = layout_slices(layout, hw, generation=1, driver=DRIVER_NAME)
            report = await SlicePublisher(api, node=hw.node, driver=DRIVER_NAME).sync(slices)
            if not report.ok:
                raise BenchError(f"ResourceSlices of {hw.node} not published: {report.error}")

    await asyncio.gather(*(one(hw) for hw in hardware))
    return str(layout.k8s_version)


async def remove_fleet(api: Any, names: Sequence[str]) -> None:
    """Nodes go (their slices with them: the publisher makes each Node their owner)."""
    core = CoreV1Api(api)
    slots = asyncio.Semaphore(SETUP_CONCURRENCY)

    async def one(name: str) -> None:
        async with slots:
            with contextlib.suppress(KubeApiError):
                await call(f"delete Node {name}", core.delete_node(name))

    await asyncio.gather(*(one(name) for name in names))


@dataclass(frozen=True)
class DecidingAllocator:
    cluster: LocalCluster
    health_port: int  # /metrics and /state


@contextlib.asynccontextmanager
async def deciding_allocator(
    kubeconfig: Path, hardware: Sequence[NodeHardware], decider: Decider
) -> AsyncIterator[DecidingAllocator | None]:
    """For Tangram: NATS and the allocator in its Kubernetes mode, the nodes' inventories on the
    bus, yielded once the allocator holds every GPU. For kube-scheduler alone: nothing."""
    if not decider.allocator_args:
        yield None
        return
    [port] = free_ports(1)
    cluster = LocalCluster(
        [], kubeconfig=kubeconfig, allocator_args=(*decider.allocator_args, "--health-port", str(port))
    )
    cluster.start()
    try:
        bus = await Bus.connect(BusConfig(servers=cluster.urls, name="bench", producer="bench"), wait_s=30)
        stop = asyncio.Event()
        partitioners: asyncio.Task[None] | None = None
        try:
            await bus.ensure_streams()
            for hw in hardware:
                await bus.publish(NodeInventory(key=subject_token(hw.node), hardware=hw))
            partitioners = asyncio.create_task(answer_partitions(bus, stop))
            names = {hw.node for hw in hardware}

            async def holds_every_node() -> bool:
                dead = cluster.dead()
                if dead:
                    raise BenchError("allocator exited: " + "; ".join(dead))
                state = await _state(port)
                return state is not None and names <= set(state.get("allocated") or {})

            await until(
                "the allocator holding every node's inventory", holds_every_node, ALLOCATOR_READY_S, every=0.5
            )
            yield DecidingAllocator(cluster, port)
        finally:
            stop.set()
            if partitioners is not None:
                partitioners.cancel()
                await asyncio.gather(partitioners, return_exceptions=True)
            await bus.close()
    finally:
        cluster.stop()


async def answer_partitions(bus: Bus, stop: asyncio.Event) -> None:
    """The synthetic nodes' partitioners, answering every command at once and always with success
    (as scheduler_perf's nodes have no kubelet): a MIG instance Tangram asks for exists the moment
    it is asked for, one it gives up is gone. Without this, Tangram's MIG decisions would wait for
    nodes that do not exist, while kube-scheduler's need nothing of the node to bind."""
    commands: asyncio.Queue[PartitionRequested] = asyncio.Queue()

    def each(event: Event) -> None:
        if isinstance(event, PartitionRequested):
            commands.put_nowait(event)

    async def answer() -> None:
        while True:
            command = await commands.get()
            await bus.publish(instant_result(command))

    answering = asyncio.create_task(answer())
    try:
        await bus.follow(NODES_STREAM, "tangram.node.*.partition.requested", each, stop=stop)
    finally:
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)


def instant_result(command: PartitionRequested) -> PartitionApplied:
    """What a node's partitioner reports once a command is carried out, made up for a node with no
    GPUs: the instance's ids follow from its placement, its UUID from the command."""
    made = command.action == "create"
    return PartitionApplied(
        key=subject_token(command.node),
        event_id=f"{command.command_id}-result",
        producer="bench",
        command_id=command.command_id,
        node=command.node,
        claim_uid=command.claim_uid,
        action=command.action,
        gpu_uuid=command.gpu_uuid,
        gpu_index=command.gpu_index,
        profile=command.profile,
        placement=command.placement,
        mig_uuid=f"MIG-synthetic-{command.command_id}" if made else command.mig_uuid,
        gpu_instance_id=command.placement.start + 1 if made else -1,
        compute_instance_id=0 if made else -1,
    )


async def _state(port: int) -> dict[str, Any] | None:
    """What the allocator's ledger holds (its /state); None while it does not answer."""
    text = await get_text(f"http://127.0.0.1:{port}/state")
    found: dict[str, Any] | None = None if text is None else json.loads(text)
    return found
