"""The allocator service through a real nats-server: decides, survives restarts, never decides twice."""

from __future__ import annotations

import asyncio

import msgspec
from prometheus_client import REGISTRY

from services.allocator.service import run
from services.allocator.settings import AllocatorSettings
from tangram.bus import Bus
from tangram.events import (
    DEADLETTER_STREAM,
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    DeadLetter,
    PartitionRequested,
)
from tangram.local.natsserver import NatsServer
from tangram.service import ServiceContext

from .helpers import allocator, decisions, gpus, inventory, log, log_until, mig, request


async def test_decides_claims_and_sends_partition_commands(bus: Bus, nats_server: NatsServer) -> None:
    await bus.publish(inventory("dgx-h100", "node-1"))
    async with allocator(bus, nats_server.url):
        await bus.publish(request(1, gpus(4)))
        await bus.publish(request(2, mig("2g.20gb")))
        await bus.publish(request(3, gpus(9)))
        events = await log_until(bus, lambda e: len(decisions(e)) == 3)
    by_uid = {e.uid: e for e in decisions(events)}  # type: ignore[attr-defined]
    four, two_g, nine = (by_uid[request(n, {}).uid] for n in (1, 2, 3))
    assert isinstance(four, ClaimAllocated) and len(four.devices) == 4
    assert isinstance(two_g, ClaimAllocated) and two_g.devices[0].profile == "2g.20gb"
    assert isinstance(nine, ClaimFailed) and "0/1 nodes fit" in nine.reason
    commands = [e for e in await log(bus, NODES_STREAM) if isinstance(e, PartitionRequested)]
    assert [c.command_id for c in commands] == two_g.partitions
    assert commands[0].subject == "tangram.node.node-1.partition.requested"
    # the dashboard's gauges: 8 GPUs, 4 taken whole, one cut for 2g.20gb (2 of its 8 memory slices)
    assert REGISTRY.get_sample_value("tangram_allocator_free_gpus") == 3
    assert REGISTRY.get_sample_value("tangram_allocator_stranded_gpus") == 6 / 8


async def test_restart_rebuilds_state_and_never_decides_a_claim_twice(
    bus: Bus, nats_server: NatsServer
) -> None:
    await bus.publish(inventory("l40s-8", "node-1"))
    async with allocator(bus, nats_server.url):
        for n in range(6):
            await bus.publish(request(n, gpus(1)))
        await log_until(bus, lambda e: len(decisions(e)) == 6)
    async with allocator(bus, nats_server.url):
        # The same claims again with new event ids (a client retrying), then claims that need more GPUs.
        for n in range(6):
            await bus.publish(request(n, gpus(1)))
        await bus.publish(request(10, gpus(2)))
        await bus.publish(request(11, gpus(1)))
        events = await log_until(bus, lambda e: len(decisions(e)) == 8)
    results = decisions(events)
    assert sorted(e.uid for e in results) == sorted({e.uid for e in results})  # type: ignore[attr-defined]
    devices = [d.device for e in results if isinstance(e, ClaimAllocated) for d in e.devices]
    assert len(devices) == len(set(devices)) == 8
    assert [type(e).__name__ for e in results[-2:]] == ["ClaimAllocated", "ClaimFailed"]


async def test_a_release_logged_while_no_allocator_ran_still_destroys_the_claims_instance(
    bus: Bus, nats_server: NatsServer
) -> None:
    """The next allocator folds the release while rebuilding: that must not count as acting on it."""
    await bus.publish(inventory("dgx-h100", "node-1"))
    async with allocator(bus, nats_server.url):
        await bus.publish(request(1, mig("1g.10gb")))
        [allocated] = decisions(await log_until(bus, lambda e: len(decisions(e)) == 1))
    assert isinstance(allocated, ClaimAllocated)
    await bus.publish(ClaimReleased(key=allocated.uid, namespace="team", name="claim-1", uid=allocated.uid))
    async with allocator(bus, nats_server.url):
        commands = await log_until(
            bus,
            lambda events: any(isinstance(e, PartitionRequested) and e.action == "destroy" for e in events),
            NODES_STREAM,
        )
    [create] = [c for c in commands if isinstance(c, PartitionRequested) and c.action == "create"]
    [destroy] = [c for c in commands if isinstance(c, PartitionRequested) and c.action == "destroy"]
    assert destroy.claim_uid == allocated.uid
    assert (destroy.gpu_uuid, destroy.placement) == (create.gpu_uuid, create.placement)


async def test_bad_claims_fail_with_a_reason_and_garbage_goes_to_dead_letter(
    bus: Bus, nats_server: NatsServer
) -> None:
    await bus.publish(inventory("l40s-8", "node-1"))
    async with allocator(bus, nats_server.url):
        bad = request(1, {"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "nope"}}]}})
        await bus.publish(bad)
        await bus.jetstream.publish("tangram.claim.requested.junk", b'{"type": "claim.requested"}')
        await bus.publish(
            request(2, {"devices": {"requests": [{"name": "g", "exactly": {"count": "many"}}]}})
        )
        events = await log_until(bus, lambda e: len(decisions(e)) == 2)
        letters = await log_until(bus, lambda e: len(e) == 1, DEADLETTER_STREAM)
    unknown_class, invalid = decisions(events)
    assert isinstance(unknown_class, ClaimFailed) and "nope" in unknown_class.reason
    assert isinstance(invalid, ClaimFailed) and "invalid claim" in invalid.reason
    [letter] = letters
    assert isinstance(letter, DeadLetter) and letter.consumer == "allocator"
    assert msgspec.json.decode(letter.data) == {"type": "claim.requested"}


async def test_a_second_allocator_waits_then_takes_over_without_deciding_twice(
    bus: Bus, nats_server: NatsServer
) -> None:
    await bus.publish(inventory("l40s-8", "node-1"))
    settings = AllocatorSettings(nats_urls=(nats_server.url,))
    first = ServiceContext(name="allocator", bus=bus, stop=asyncio.Event())
    second = ServiceContext(name="allocator", bus=bus, stop=asyncio.Event())
    leading = asyncio.create_task(run(first, settings))
    await asyncio.wait_for(first.ready.wait(), 30)
    following = asyncio.create_task(run(second, settings))
    for n in range(3):
        await bus.publish(request(n, gpus(2)))
    await log_until(bus, lambda e: len(decisions(e)) == 3)
    assert not second.ready.is_set()  # a follower takes no claims

    first.stop.set()  # graceful stop hands the lease over at once
    await leading
    await asyncio.wait_for(second.ready.wait(), 30)
    await bus.publish(request(3, gpus(2)))  # the last 2 of the 8 GPUs
    await bus.publish(request(4, gpus(1)))  # nothing left
    events = await log_until(bus, lambda e: len(decisions(e)) == 5)
    second.stop.set()
    await following
    results = decisions(events)
    assert len({e.uid for e in results}) == 5  # type: ignore[attr-defined]
    devices = [d.device for e in results if isinstance(e, ClaimAllocated) for d in e.devices]
    assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
    assert isinstance(results[-1], ClaimFailed)
