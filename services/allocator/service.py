"""Rebuilds the ledger from JetStream, then decides live claims and reacts to partition results."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any, get_args

from prometheus_client import Counter, Gauge, Histogram

from services.allocator.rebuilding import rebuilt_ledger
from services.allocator.settings import AllocatorSettings
from services.allocator.waiting import WaitingClaims
from tangram.allocation.ledger import Ledger
from tangram.bus import (
    LeaderLease,
    Poison,
    allocator_consumer,
    allocator_results_consumer,
)
from tangram.events import (
    INVENTORY_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    FailureCause,
    PartitionApplied,
    PartitionFailed,
)
from tangram.service import ServiceContext, first, reached, settle

if TYPE_CHECKING:
    from services.allocator.kubernetes import ClaimBridge

log = logging.getLogger("tangram.allocator")

DECISIONS = Counter("tangram_allocator_decisions_total", "Claims decided", ["outcome"])
DECISION_SECONDS = Histogram(
    "tangram_allocator_decision_seconds",
    "Time to decide one claim",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)
FREE_GPUS = Gauge("tangram_allocator_free_gpus", "Whole GPUs with nothing allocated")
LEADER = Gauge("tangram_allocator_leader", "1 while this allocator leads (decides), else 0")
WAITING = Gauge(
    "tangram_allocator_waiting_claims", "Claims whose latest decision failed, by its cause", ["cause"]
)
OLDEST_WAITING = Gauge(
    "tangram_allocator_oldest_waiting_claim_seconds",
    "How long the claim waiting longest has waited since its first failed decision (this leader's)",
)
STRANDED_GPUS = Gauge(
    "tangram_allocator_stranded_gpus",
    "Free capacity, in GPUs, on partially used GPUs: no whole-GPU claim can use it",
)


def _log_reused_instances(ledger: Ledger, allocated: ClaimAllocated) -> None:
    """A MIG device given without a create names an instance the allocator saw on the node."""
    node = ledger.fleet.node(allocated.node)
    for device in allocated.devices:
        if device.placement is None or device.partition_command or node is None:
            continue
        seen = [
            inst.uuid
            for inst in node.existing.get(device.gpu_index, ())
            if inst.start == device.placement.start and inst.profile_id == device.profile_id
        ]
        log.info(
            "existing MIG instance reused",
            extra={
                "claim": allocated.uid,
                "device": device.device,
                "node": allocated.node,
                "instances": seen,
            },
        )


def _log_claim(what: str, event: ClaimAllocated | ClaimFailed | ClaimReleased, **told: object) -> None:
    """One line per decision and release, naming the claim's uid: what a claim's story is traced by."""
    log.info(what, extra={"claim": f"{event.namespace}/{event.name}", "uid": event.uid, **told})


async def _closing(api: Any, stop: asyncio.Event) -> None:
    """Close the Kubernetes client when the service stops."""
    try:
        await stop.wait()
    finally:
        await api.close()


async def resend_unanswered_destroys(ctx: ServiceContext, ledger: Ledger) -> None:
    """Send again the destroys of released claims that the log holds no result for.

    The previous leader may have died between reading a release and sending its destroys; its
    consumer would deliver the release again, but only once the acknowledgement wait has run out.
    A destroy it did send is not run twice: same Msg-Id, and the node answers a command once.
    """
    commands = [command for pending in ledger.unanswered_destroys.values() for command in pending.values()]
    for command in commands:
        await ctx.bus.publish(command)
    if commands:
        log.info("destroys of released claims sent again", extra={"commands": len(commands)})


def holder_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def run(ctx: ServiceContext, settings: AllocatorSettings) -> None:
    """Follow until elected, then lead: one allocator decides at a time (the others stay unready)."""
    lease = LeaderLease(ctx.bus, "allocator", holder_id())
    if not await lease.acquire(ctx.stop):
        return
    try:
        await lead(ctx, settings, lease)
    finally:
        await lease.release()


async def lead(ctx: ServiceContext, settings: AllocatorSettings, lease: LeaderLease) -> None:
    # Renewals start with the lease, not after the rebuild: a long log must not let it expire.
    tasks = [asyncio.create_task(lease.hold(ctx.stop))]
    LEADER.set(1)
    try:
        await first(_serve(ctx, settings, tasks, holder=lease.holder), tasks)
    finally:
        LEADER.set(0)
        ctx.stop.set()
        await settle(tasks)


async def _serve(
    ctx: ServiceContext, settings: AllocatorSettings, tasks: list[asyncio.Task[None]], *, holder: str
) -> None:
    ledger = await rebuilt_ledger(ctx, settings, tasks)
    if ledger is None:
        return
    await resend_unanswered_destroys(ctx, ledger)
    if ctx.health is not None:
        ctx.health.state = ledger.snapshot
    # Read when scraped: walking every GPU of the fleet after each decision cost more than the
    # decision itself at hundreds of nodes.
    FREE_GPUS.set_function(lambda: ledger.fleet.metrics().free_gpus)
    STRANDED_GPUS.set_function(lambda: ledger.fleet.metrics().stranded_gpus)
    waiting = WaitingClaims()
    for cause in get_args(FailureCause):
        WAITING.labels(cause).set_function(functools.partial(waiting.count, cause))
    OLDEST_WAITING.set_function(waiting.oldest_s)
    # The fleet state is long-lived: move it out of the collector's way so that full collections
    # do not walk it (a pause of hundreds of ms at 1,000 nodes) in the middle of decisions.
    gc.collect()
    gc.freeze()
    bridge: ClaimBridge | None = None
    if settings.kubernetes:
        # Imported only when deciding in Kubernetes: the client is slow to import, and an
        # allocator without it starts (and stops) as fast as before.
        from services.allocator.alive import AliveLease  # noqa: PLC0415 - only with --kubernetes
        from services.allocator.kubernetes import ClaimBridge  # noqa: PLC0415 - only with --kubernetes
        from tangram.kubernetes.api import connect  # noqa: PLC0415 - only with --kubernetes
        from tangram.kubernetes.objects.alive import own_namespace  # noqa: PLC0415 - only with --kubernetes

        api = await connect(kubeconfig=settings.kubeconfig)
        tasks.append(asyncio.create_task(_closing(api, ctx.stop)))
        # Alive while leading: the admission webhook keeps the gates of pods Tangram cannot place
        # yet while this Lease is fresh, and lifts them only once it goes stale.
        alive = AliveLease(api, namespace=own_namespace(settings.kubernetes_namespace), holder=holder)
        tasks.append(asyncio.create_task(alive.run(ctx.stop)))
        bridge = ClaimBridge(api, ledger, ctx.bus.publish, producer=ctx.bus.config.producer)

    async def handle(event: Event) -> None:
        if isinstance(event, PartitionApplied | PartitionFailed):
            unanswered = ledger.unanswered(event)
            if unanswered is not None:
                raise Poison(unanswered)
        started = time.perf_counter()
        frees = isinstance(event, ClaimReleased) and ledger.frees_capacity(event.uid)
        outputs = ledger.apply(event)
        waiting.observe(event, outputs)
        if isinstance(event, ClaimRequested) and event.allocation is None and outputs:
            DECISION_SECONDS.observe(time.perf_counter() - started)
            outcome = "allocated" if any(isinstance(o, ClaimAllocated) for o in outputs) else "failed"
            DECISIONS.labels(outcome).inc()
        for conflict in ledger.conflicts:
            log.error("allocated twice, by Tangram and outside it", extra={"conflict": conflict})
        ledger.conflicts.clear()
        for output in outputs:
            if isinstance(output, ClaimAllocated):
                _log_reused_instances(ledger, output)
            await ctx.bus.publish(output)
            if isinstance(output, ClaimAllocated):
                _log_claim("claim allocated", output, node=output.node, partitions=list(output.partitions))
            elif isinstance(output, ClaimFailed):
                _log_claim("claim failed", output, reason=output.reason)
        if isinstance(event, ClaimReleased):
            _log_claim("claim released", event, deleted=event.deleted, freed=frees)
        if bridge is not None:
            bridge.notice(event, outputs, frees=frees)

    def observe_inventory(event: Event) -> None:
        ledger.observe(event)
        if bridge is not None:
            bridge.inventory_seen()

    inventory_caught_up = asyncio.Event()
    claims_ready = asyncio.Event()
    results_ready = asyncio.Event()
    tasks.append(
        asyncio.create_task(
            ctx.bus.follow(
                INVENTORY_STREAM,
                "tangram.inventory.>",
                observe_inventory,
                stop=ctx.stop,
                caught_up=inventory_caught_up,
                on_position=ledger.folded,
            )
        )
    )
    if not await reached(inventory_caught_up, ctx.stop, tasks):
        return
    tasks.append(
        asyncio.create_task(ctx.bus.consume(allocator_consumer(), handle, stop=ctx.stop, ready=claims_ready))
    )
    tasks.append(
        asyncio.create_task(
            ctx.bus.consume(
                allocator_results_consumer(),
                handle,
                stop=ctx.stop,
                ready=results_ready,
                on_position=ledger.folded,
            )
        )
    )
    if not await reached(claims_ready, ctx.stop, tasks) or not await reached(results_ready, ctx.stop, tasks):
        return
    if bridge is not None:
        # Started once the log is folded: what it asks and releases is judged against the ledger.
        tasks.append(asyncio.create_task(bridge.run(ctx.stop)))
        if not await reached(bridge.synced, ctx.stop, tasks):
            return
    ctx.ready.set()
    log.info("allocator ready", extra={"policy": settings.policy, "nodes": len(ledger.fleet.node_names)})
    await first(ctx.stop.wait(), tasks)
