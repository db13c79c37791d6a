"""Leader election over a real JetStream key-value bucket."""

from __future__ import annotations

import asyncio

import nats.js.errors
import pytest
from nats.js.kv import KeyValue

from tangram.bus import Bus, LeaderLease, LeadershipLost
from tangram.bus.declarations import KeyValueSpec

BUCKET = KeyValueSpec(bucket="test-leader", description="test", ttl_s=1.0)


@pytest.fixture
async def leases(bus: Bus) -> tuple[LeaderLease, LeaderLease]:
    await bus.ensure_streams(streams=(), key_values=(BUCKET,))
    return (
        LeaderLease(bus, "allocator", "holder-a", bucket=BUCKET),
        LeaderLease(bus, "allocator", "holder-b", bucket=BUCKET),
    )


async def test_one_leader_at_a_time_while_it_renews(bus: Bus) -> None:
    # Renewals every TTL/3 leave 2 s of slack before the lease would lapse on a loaded machine.
    bucket = KeyValueSpec(bucket="test-leader-renews", description="test", ttl_s=3.0)
    await bus.ensure_streams(streams=(), key_values=(bucket,))
    a = LeaderLease(bus, "allocator", "holder-a", bucket=bucket)
    b = LeaderLease(bus, "allocator", "holder-b", bucket=bucket)
    kv = await bus.jetstream.key_value(bucket.bucket)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    assert await a.acquire(stop_a) is True
    first = (await kv.get("allocator")).revision
    holding = asyncio.create_task(a.hold(stop_a))
    contender = asyncio.create_task(b.acquire(stop_b))
    # Four renewals span more than one TTL: without them the lease would have expired.
    while (await kv.get("allocator")).revision < first + 4:
        assert not holding.done() and not contender.done()
        await asyncio.sleep(0.1)
    stop_b.set()
    assert await contender is False
    assert (a.held, b.held) == (True, False)
    stop_a.set()
    await holding


async def expired(kv: KeyValue, key: str) -> None:
    """Until the bucket no longer holds the key (its TTL passed without a renewal)."""
    while True:
        try:
            await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return
        await asyncio.sleep(0.05)


async def test_a_late_renewal_keeps_a_lease_nobody_took(
    bus: Bus, leases: tuple[LeaderLease, LeaderLease]
) -> None:
    a, _ = leases
    kv = await bus.jetstream.key_value(BUCKET.bucket)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    await asyncio.wait_for(expired(kv, "allocator"), 30)  # a stalled past its TTL, as a starved process
    holding = asyncio.create_task(a.hold(stop))
    try:
        while True:
            try:
                if (await kv.get("allocator")).value == b"holder-a":
                    break
            except nats.js.errors.KeyNotFoundError:
                pass
            assert not holding.done(), holding.exception()
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await holding
    assert a.held


async def test_a_late_renewal_after_someone_else_led_loses_the_lease(
    bus: Bus, leases: tuple[LeaderLease, LeaderLease]
) -> None:
    a, b = leases
    kv = await bus.jetstream.key_value(BUCKET.bucket)
    never = asyncio.Event()
    assert await a.acquire(never)
    await asyncio.wait_for(expired(kv, "allocator"), 30)
    assert await asyncio.wait_for(b.acquire(never), 30)  # b led while a was stalled ...
    await b.release()  # ... and stepped down: the key is free again, but a missed b's reign
    with pytest.raises(LeadershipLost, match="the allocator lease was taken over"):
        await asyncio.wait_for(a.hold(never), 30)
    assert not a.held
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("allocator")  # a gave back the lease it re-created for a moment


async def test_release_hands_over_without_waiting_for_the_ttl(
    leases: tuple[LeaderLease, LeaderLease],
) -> None:
    a, b = leases
    never = asyncio.Event()
    assert await a.acquire(never)
    await a.release()
    assert await asyncio.wait_for(b.acquire(never), BUCKET.ttl_s / 2) is True
    assert (a.held, b.held) == (False, True)


async def test_a_crashed_leader_is_replaced_and_finds_out_it_lost(
    leases: tuple[LeaderLease, LeaderLease],
) -> None:
    a, b = leases
    never = asyncio.Event()
    assert await a.acquire(never)  # ... and then a stops renewing, as a killed process would
    assert await asyncio.wait_for(b.acquire(never), 10 * BUCKET.ttl_s) is True
    with pytest.raises(LeadershipLost, match="the allocator lease was taken over"):
        await asyncio.wait_for(a.hold(never), 5 * BUCKET.ttl_s)
    assert (a.held, b.held) == (False, True)
