"""Leader election over a real JetStream key-value bucket."""

from __future__ import annotations

import asyncio

import pytest

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


async def test_one_leader_at_a_time_while_it_renews(leases: tuple[LeaderLease, LeaderLease]) -> None:
    a, b = leases
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    assert await a.acquire(stop_a) is True
    holding = asyncio.create_task(a.hold(stop_a))
    contender = asyncio.create_task(b.acquire(stop_b))
    await asyncio.sleep(3 * BUCKET.ttl_s)  # three TTLs: the lease would have expired unless renewed
    stop_b.set()
    assert await contender is False
    assert (a.held, b.held) == (True, False)
    stop_a.set()
    await holding


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


async def test_a_leader_whose_lease_expired_unheld_takes_it_back_instead_of_stopping(
    bus: Bus, leases: tuple[LeaderLease, LeaderLease]
) -> None:
    """Renewals that could not reach NATS for a TTL: the key is gone, nobody else holds it."""
    a, _ = leases
    stop = asyncio.Event()
    assert await a.acquire(stop)
    kv = await bus.jetstream.key_value(BUCKET.bucket)
    await kv.purge("allocator")  # what the TTL does to a key not rewritten in time
    holding = asyncio.create_task(a.hold(stop))
    await asyncio.sleep(2 * a.renew_every_s)  # two renewals: the first finds the key gone
    assert not holding.done() and a.held
    assert (await kv.get("allocator")).value == b"holder-a"
    stop.set()
    await holding
