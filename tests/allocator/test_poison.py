"""Poison through a real nats-server: what a peer publishes can fail a message, never the allocator."""

from __future__ import annotations

import hashlib
import json

from prometheus_client import REGISTRY

from tangram.bus import Bus
from tangram.bus.deadletters import PREFIX_BYTES
from tangram.events import CLAIMS_STREAM, DEADLETTER_STREAM, INVENTORY_STREAM, ClaimAllocated, DeadLetter
from tangram.local.natsserver import NatsServer

from .helpers import allocator, decisions, gpus, inventory, log_until, request

DEPTH = 1000
INVENTORY = INVENTORY_STREAM


def deep_claim() -> bytes:
    """About 2.5 KB: a claim whose spec nests 1,000 lists deep (the recursion limit of CPython)."""
    uid = "00000000-0000-4000-8000-00000000dee9"
    head = {"type": "claim.requested", "key": uid, "namespace": "x", "name": "deep", "uid": uid}
    text = json.dumps(head)[:-1] + ', "spec": {"devices": ' + "[" * DEPTH + "]" * DEPTH + "}}"
    return text.encode()


def big_garbage() -> bytes:
    """Over 780 KB: whole, its dead letter (base64) would exceed the server's 1 MB max_payload."""
    return b'{"type": "claim.requested", "key": "' + b"\xfe" * 800_000 + b'"}'


def skipped(stream: str, why: str) -> float:
    value = REGISTRY.get_sample_value("tangram_bus_skipped_total", {"stream": stream, "why": why})
    return value or 0.0


async def letters(bus: Bus, count: int) -> list[DeadLetter]:
    found = await log_until(bus, lambda e: len(e) >= count, DEADLETTER_STREAM)
    assert all(isinstance(e, DeadLetter) for e in found)
    return sorted(found, key=lambda e: e.original_sequence)  # type: ignore[attr-defined]


def check_letters(found: list[DeadLetter], deep: bytes, big: bytes) -> None:
    deep_letter, big_letter = found
    assert deep_letter.consumer == "allocator"
    assert deep_letter.original_subject == "tangram.claim.requested.deep"
    assert f"nested deeper than 64 levels ({len(deep)} bytes)" in deep_letter.reason
    assert deep_letter.data == deep and not deep_letter.truncated
    assert deep_letter.sha256 == hashlib.sha256(deep).hexdigest()

    assert big_letter.original_subject == "tangram.claim.requested.big"
    assert "undecodable event" in big_letter.reason and "UTF-8" in big_letter.reason
    assert big_letter.truncated
    assert big_letter.size == len(big)
    assert big_letter.sha256 == hashlib.sha256(big).hexdigest()
    assert big_letter.data == big[:PREFIX_BYTES]
    assert big_letter.original_stream == CLAIMS_STREAM and big_letter.original_sequence > 0


async def test_deep_and_oversized_messages_are_dead_lettered_and_the_allocator_goes_on(
    bus: Bus, nats_server: NatsServer
) -> None:
    deep, big = deep_claim(), big_garbage()
    assert 2_000 < len(deep) < 3_000 and len(big) > 780_000
    await bus.publish(inventory("l40s-8", "node-1"))
    async with allocator(bus, nats_server.url) as ctx:
        await bus.jetstream.publish("tangram.claim.requested.deep", deep)
        await bus.jetstream.publish("tangram.claim.requested.big", big)
        await bus.publish(request(1, gpus(2)))
        events = await log_until(bus, lambda e: len(decisions(e)) == 1)
        found = await letters(bus, 2)
        assert not ctx.stop.is_set()
        # Still deciding after the poison: a second claim gets the next two GPUs.
        await bus.publish(request(2, gpus(2)))
        events = await log_until(bus, lambda e: len(decisions(e)) == 2)
    check_letters(found, deep, big)
    first, second = decisions(events)
    assert isinstance(first, ClaimAllocated) and isinstance(second, ClaimAllocated)
    assert {d.device for d in first.devices}.isdisjoint(d.device for d in second.devices)


async def test_poison_already_in_the_log_is_skipped_at_start_and_dead_lettered(
    bus: Bus, nats_server: NatsServer
) -> None:
    deep, big = deep_claim(), big_garbage()
    await bus.publish(inventory("l40s-8", "node-1"))
    # Before the allocator starts: its rebuild replays all of this, its consumer then reads the
    # requests; the decision subject is read by the rebuild alone.
    await bus.jetstream.publish("tangram.claim.requested.deep", deep)
    await bus.jetstream.publish("tangram.claim.requested.big", big)
    await bus.jetstream.publish("tangram.claim.allocated.deep", deep.replace(b"requested", b"allocated"))
    await bus.jetstream.publish("tangram.inventory.node-2", deep)
    await bus.publish(request(1, gpus(8)))
    claims_before, inventory_before = skipped(CLAIMS_STREAM, "undecodable"), skipped(INVENTORY, "undecodable")
    async with allocator(bus, nats_server.url):
        # Read before this test replays the log itself: what the rebuild (and the inventory
        # follow) went past. Claims: both requests and the decision; inventory: the rebuild once
        # (the inventory follow dead-letters what it cannot decode instead of skipping it).
        assert skipped(CLAIMS_STREAM, "undecodable") - claims_before == 3
        assert skipped(INVENTORY, "undecodable") - inventory_before == 1
        events = await log_until(bus, lambda e: len(decisions(e)) == 1)
        found = await letters(bus, 3)
    followed = [letter for letter in found if letter.consumer != "allocator"]
    check_letters([letter for letter in found if letter.consumer == "allocator"], deep, big)
    # The allocator's inventory follow dead-letters the deep inventory under its own name.
    [inventory_letter] = followed
    assert inventory_letter.consumer.endswith("-follow")
    assert inventory_letter.original_subject == "tangram.inventory.node-2"
    [allocated] = decisions(events)
    assert isinstance(allocated, ClaimAllocated) and len(allocated.devices) == 8
    claims_before = skipped(CLAIMS_STREAM, "undecodable")
    # A restart that folds the whole log (no image: the first start's image holds the poison's
    # place already) replays the same poison, and still starts: the claim stays decided once.
    async with allocator(bus, nats_server.url, ledger_image=False):
        assert skipped(CLAIMS_STREAM, "undecodable") - claims_before == 3
        await bus.publish(request(2, gpus(1)))
        events = await log_until(bus, lambda e: len(decisions(e)) == 2)
    assert [type(e).__name__ for e in decisions(events)] == ["ClaimAllocated", "ClaimFailed"]
    claims_before = skipped(CLAIMS_STREAM, "undecodable")
    # A restart from the ledger image the first start took folds only the log after it: the
    # poison lies before it, and is not read again. The claims stay decided as they were.
    async with allocator(bus, nats_server.url):
        assert skipped(CLAIMS_STREAM, "undecodable") == claims_before
        await bus.publish(request(3, gpus(8)))
        events = await log_until(bus, lambda e: len(decisions(e)) == 3)
    assert [type(e).__name__ for e in decisions(events)] == ["ClaimAllocated", "ClaimFailed", "ClaimFailed"]
