"""The allocator's start from its ledger image, through a real nats-server: the image written after
each rebuild, restored at the next with only the log after it folded, and set aside, for the whole
log, when it cannot be trusted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec
import pytest
from prometheus_client import REGISTRY

from services.allocator.rebuilding import rebuilt_ledger
from services.allocator.settings import AllocatorSettings
from tangram.allocation.image import LogMark, decode_image, encode_image, image_of
from tangram.allocation.ledger import Ledger
from tangram.bus import Bus
from tangram.bus.client import StreamExtent
from tangram.bus.declarations import IMAGE_BUCKET, IMAGE_NAME
from tangram.eventlog.rebuild import image_misfit
from tangram.events import CLAIMS_STREAM, NODES_STREAM, ClaimAllocated, Event, PartitionRequested
from tangram.local.natsserver import NatsServer
from tangram.service import ServiceContext
from tests.support.polling import until

from .helpers import (
    allocator,
    applied,
    decisions,
    gpus,
    inventory,
    ledger_on,
    log,
    log_until,
    mig,
    released,
    request,
)


def settings(url: str, *, image: bool = True) -> AllocatorSettings:
    return AllocatorSettings(nats_urls=(url,), ledger_image=image)


async def rebuilt(bus: Bus, url: str, *, image: bool = True) -> Ledger:
    ctx = ServiceContext(name="allocator", bus=bus, stop=asyncio.Event())
    ledger = await asyncio.wait_for(rebuilt_ledger(ctx, settings(url, image=image)), 60)
    assert ledger is not None
    return ledger


async def stored_image(bus: Bus) -> bytes | None:
    return await bus.get_object(IMAGE_BUCKET.bucket, IMAGE_NAME)


async def history(bus: Bus, url: str, first: int, count: int) -> None:
    """Claims decided by a running allocator, MIG ones with their creates answered, and some released."""
    async with allocator(bus, url):
        before = len(decisions(await log(bus)))
        asked = [request(n, mig("1g.10gb") if n % 2 else gpus(1)) for n in range(first, first + count)]
        for claim in asked:
            await bus.publish(claim)
        await log_until(bus, lambda e: len(decisions(e)) >= before + count)
        nodes = await log(bus, NODES_STREAM)
        answered = {e.command_id for e in nodes if not isinstance(e, PartitionRequested)}
        creates = [c for c in nodes if isinstance(c, PartitionRequested) and c.action == "create"]
        for command in creates:
            if command.command_id not in answered:
                await bus.publish(applied(command, f"MIG-{command.command_id[:12]}"))
        for claim in asked[::3]:
            await bus.publish(released(claim))
        await log_until(bus, lambda e: sum(type(x).__name__ == "ClaimReleased" for x in e) >= len(asked[::3]))


def outcomes(events: list[Event]) -> list[tuple[str, str, list[str]]]:
    return [
        (type(e).__name__, e.uid, [d.device for d in e.devices] if isinstance(e, ClaimAllocated) else [])
        for e in events
        if not isinstance(e, PartitionRequested)
    ]


async def test_a_restart_restores_the_image_and_folds_only_the_log_after_it(
    bus: Bus, nats_server: NatsServer
) -> None:
    url = nats_server.url
    await bus.publish(inventory("dgx-h100", "node-1"))
    await history(bus, url, 1, 6)  # the allocator's start wrote an image of the inventory alone
    first = decode_image(await stored_image(bus) or b"")
    after_first = (await bus.stream_extent(CLAIMS_STREAM)).last_seq
    assert first.log[CLAIMS_STREAM].sequence < after_first
    await history(bus, url, 10, 6)  # restored that image, folded the first history, wrote another
    second = decode_image(await stored_image(bus) or b"")
    assert second.log[CLAIMS_STREAM].sequence == after_first
    assert second.log[NODES_STREAM].created == (await bus.stream_extent(NODES_STREAM)).created
    whole = await rebuilt(bus, url, image=False)
    whole_events = REGISTRY.get_sample_value("tangram_allocator_rebuild_events")
    from_image = await rebuilt(bus, url)
    assert REGISTRY.get_sample_value("tangram_allocator_rebuild_from_image") == 1
    tail_events = REGISTRY.get_sample_value("tangram_allocator_rebuild_events")
    assert whole_events is not None and tail_events is not None and tail_events < whole_events
    assert from_image.snapshot() == whole.snapshot()
    assert from_image.slot_attempts.saved() == whole.slot_attempts.saved()
    for n in range(20, 28):
        asked = request(n, mig("1g.10gb") if n % 3 else gpus(2))
        assert outcomes(from_image.apply(asked)) == outcomes(whole.apply(asked))


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        (lambda image: b"\x00not json", "not a ledger image"),
        (lambda image: image.replace(b'"schema":"', b'"schema":"0', 1), "a ledger image of schema"),
        (
            lambda image: image.replace(b'"conflicts":[]', b'"conflicts":[7]', 1),
            "an invalid ledger image",
        ),
        (lambda image: _marked(image, sequence=10**9), "and the stream ends at"),
        (lambda image: _marked(image, created="2001-01-01T00:00:00+00:00"), "was made again since"),
    ],
    ids=["bytes", "other-schema", "wrong-field", "past-the-stream", "stream-made-again"],
)
async def test_an_image_that_cannot_be_trusted_is_set_aside_for_the_whole_log(
    bus: Bus,
    nats_server: NatsServer,
    caplog: pytest.LogCaptureFixture,
    stored: Callable[[bytes], bytes],
    reason: str,
) -> None:
    """A restart never fails, nor decides from a wrong state, for a bad image: it logs why it sets
    the image aside, folds the whole log, and writes a good image in its place."""
    url = nats_server.url
    await bus.publish(inventory("dgx-h100", "node-1"))
    await history(bus, url, 1, 4)
    good = await stored_image(bus)
    assert good is not None
    whole = await rebuilt(bus, url, image=False)
    await bus.put_object(IMAGE_BUCKET.bucket, IMAGE_NAME, stored(good))
    with caplog.at_level(logging.WARNING, logger="tangram.allocator"):
        ledger = await rebuilt(bus, url)
    [set_aside] = [r for r in caplog.records if "image" in r.getMessage()]
    assert reason in str(getattr(set_aside, "error", ""))
    assert REGISTRY.get_sample_value("tangram_allocator_rebuild_from_image") == 0
    assert ledger.snapshot() == whole.snapshot()
    # a good image in its place, where the streams end now
    written = decode_image(await stored_image(bus) or b"")
    for stream in (CLAIMS_STREAM, NODES_STREAM):
        extent = await bus.stream_extent(stream)
        assert (written.log[stream].sequence, written.log[stream].created) == (
            extent.last_seq,
            extent.created,
        )


def _marked(data: bytes, **mark: object) -> bytes:
    """The image with its place in the claims stream changed."""
    image = decode_image(data)
    claims = msgspec.structs.replace(image.log[CLAIMS_STREAM], **mark)
    return encode_image(msgspec.structs.replace(image, log={**image.log, CLAIMS_STREAM: claims}))


def test_an_image_fits_streams_whose_node_results_after_it_aged_out_but_not_claims_lost() -> None:
    image = image_of(ledger_on("dgx-h100"), {
        CLAIMS_STREAM: LogMark(sequence=10, created="c"), NODES_STREAM: LogMark(sequence=5, created="n"),
    })  # fmt: skip

    def extents(claims_first: int, nodes_first: int) -> dict[str, StreamExtent]:
        return {
            CLAIMS_STREAM: StreamExtent(first_seq=claims_first, last_seq=20, messages=10, created="c"),
            NODES_STREAM: StreamExtent(first_seq=nodes_first, last_seq=30, messages=10, created="n"),
        }

    assert image_misfit(image, extents(1, 1)) is None
    assert image_misfit(image, extents(1, 21)) is None  # results of 30 days ago are gone either way
    assert image_misfit(image, extents(12, 1)) == (
        f"{CLAIMS_STREAM} no longer holds the events after it (it starts at 12)"
    )


async def test_a_leader_takes_the_image_again_as_the_log_grows(bus: Bus, nats_server: NatsServer) -> None:
    """However long one leader leads, the next start folds a short tail: the image is taken again,
    apart from the live ledger, once the claims log has grown enough since it."""
    await bus.publish(inventory("dgx-h100", "node-1"))
    async with allocator(bus, nats_server.url, image_every_s=0.05, image_after_events=1):
        for n in range(1, 6):
            await bus.publish(request(n, gpus(1)))
        await log_until(bus, lambda e: len(decisions(e)) == 5)
        end = (await bus.stream_extent(CLAIMS_STREAM)).last_seq

        async def imaged_to_the_end() -> bool:
            image = await stored_image(bus)
            return image is not None and decode_image(image).log[CLAIMS_STREAM].sequence == end

        await until("the image taken again up to the end of the claims log", imaged_to_the_end, 30)
    image = decode_image(await stored_image(bus) or b"")
    assert sorted(uid for uid, state in image.decided.items() if state == "allocated") == [
        request(n, gpus(1)).uid for n in range(1, 6)
    ]
