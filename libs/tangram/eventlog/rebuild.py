"""The allocator's ledger folded from the JetStream log, from its last image where that fits.

The image (`allocation.image`) holds the ledger as the fold of the log up to a point of the claims
and nodes streams; restored, only the log after that point is folded, in the rebuild's order
(`bus.replay.fold_lanes`): the ledger a whole fold would give. An image that cannot be read, is of
another shape, or does not fit the streams as they are now (made again, or the events after it
gone) is set aside, with the reason, for the whole log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass

from tangram.allocation.image import (
    ImageError,
    LedgerImage,
    LogMark,
    decode_image,
    encode_image,
    image_of,
    restored_ledger,
)
from tangram.allocation.ledger import Ledger
from tangram.bus import Bus, BusError, allocator_log_sources, is_transient
from tangram.bus.client import StreamExtent
from tangram.bus.declarations import IMAGE_BUCKET, IMAGE_NAME
from tangram.bus.follow import PositionHook
from tangram.bus.replay import fold_lanes
from tangram.events import CLAIMS_STREAM, INVENTORY_STREAM, NODES_STREAM, Event
from tangram.events.positions import recorded_positions

# The streams an image marks its place in (the inventory stream keeps only each node's last
# inventory, and is folded whole at every start).
IMAGE_STREAMS = (CLAIMS_STREAM, NODES_STREAM)


@dataclass
class Rebuilt:
    ledger: Ledger
    events: int  # events folded
    marks: dict[str, LogMark]  # how far the ledger has folded each of IMAGE_STREAMS
    from_image: bool
    set_aside: str | None = None  # why a stored image was not restored


def image_misfit(image: LedgerImage, extents: Mapping[str, StreamExtent]) -> str | None:
    """Why the image cannot be restored over the streams as they are now; None when it can."""
    for stream in IMAGE_STREAMS:
        mark = image.log.get(stream)
        extent = extents[stream]
        if mark is None:
            return f"it does not say how far it folded {stream}"
        if mark.created != extent.created:
            return f"{stream} was made again since it was taken ({mark.created}, now {extent.created})"
        if mark.sequence > extent.last_seq:
            return f"it folded {stream} to {mark.sequence}, and the stream ends at {extent.last_seq}"
        # The nodes stream ages out after 30 days: an image older than that has folded results
        # a whole fold would no longer see, and is the better start. The claims are kept forever.
        if stream == CLAIMS_STREAM and extent.messages and extent.first_seq > mark.sequence + 1:
            return f"{stream} no longer holds the events after it (it starts at {extent.first_seq})"
    return None


async def stored_image(
    bus: Bus, extents: Mapping[str, StreamExtent]
) -> tuple[LedgerImage | None, str | None]:
    """The stored image if it can be restored; else None, with why it is set aside (None when
    nothing is stored). A transient error reading it is raised: the rebuild is tried again."""
    try:
        data = await bus.get_object(IMAGE_BUCKET.bucket, IMAGE_NAME)
    except BusError as error:
        if is_transient(error):
            raise
        return None, f"it cannot be read: {error}"
    if data is None:
        return None, None
    try:
        image = decode_image(data)
    except ImageError as error:
        return None, str(error)
    misfit = image_misfit(image, extents)
    return (None, misfit) if misfit is not None else (image, None)


async def replay_log(
    bus: Bus,
    each: Callable[[Event], object],
    *,
    on_position: PositionHook | None = None,
    after: Mapping[str, LogMark] | None = None,
) -> int:
    """The allocator's log into `each`, in the rebuild's order (each decision after the node results
    it was made having read); with `after`, only the image's streams, from past their marks."""
    if after is None:
        return await bus.replay_into(
            allocator_log_sources(), each, on_position=on_position, reach=recorded_positions
        )
    return await bus.replay_into(
        [source for source in allocator_log_sources() if source[0] in IMAGE_STREAMS],
        each,
        on_position=on_position,
        reach=recorded_positions,
        starts={stream: after[stream].sequence + 1 for stream in IMAGE_STREAMS},
    )


async def fold_read(
    ledger: Ledger, claims: Iterable[tuple[int, Event]], nodes: Iterable[tuple[int, Event]]
) -> int:
    """Fold stretches of the claims and nodes streams already read, as (sequence, event), in the
    rebuild's order (each decision after the node results it was made having read, then the rest):
    the ledger a rebuild from those stretches holds. Returns how many events were folded."""
    return await fold_lanes(
        [(CLAIMS_STREAM, _listed(claims)), (NODES_STREAM, _listed(nodes))],
        lambda event: ledger.apply(event, live=False),
        on_position=ledger.folded,
        reach=recorded_positions,
    )


async def _listed(events: Iterable[tuple[int, Event]]) -> AsyncIterator[tuple[int, Event]]:
    for item in events:
        yield item


async def rebuild_ledger(bus: Bus, fresh: Callable[[], Ledger], *, use_image: bool = True) -> Rebuilt:
    """The ledger folded from the log: from the stored image when one fits, else whole. `fresh`
    makes an empty ledger (the allocator's classes, policy and producer). Without `use_image`,
    the whole log, and no marks (no image is to be written of it)."""
    extents = {stream: await bus.stream_extent(stream) for stream in IMAGE_STREAMS} if use_image else {}
    image, set_aside = await stored_image(bus, extents) if use_image else (None, None)
    read: dict[str, int] = {}
    ledger = fresh()

    def folded(stream: str, sequence: int) -> None:
        read[stream] = sequence
        ledger.folded(stream, sequence)

    def fold(event: Event) -> None:
        ledger.apply(event, live=False)

    count = 0
    if image is not None:
        # the inventories first, into the fleet the image is restored over
        count = await bus.replay_into([(INVENTORY_STREAM, ())], fold, on_position=read.__setitem__)
        try:
            ledger = restored_ledger(
                image,
                fleet=ledger.fleet,
                classes=ledger.classes,
                policy=ledger.policy,
                producer=ledger.producer,
                forget_after=ledger.deleted.after,
            )
        except ImageError as error:
            image, set_aside, count, ledger = None, str(error), 0, fresh()
        else:
            if INVENTORY_STREAM in read:
                ledger.folded(INVENTORY_STREAM, read[INVENTORY_STREAM])
    if image is None:
        count = await replay_log(bus, fold, on_position=folded)
    else:
        count += await replay_log(bus, fold, on_position=folded, after=image.log)
    # What the replays read, and at least all the streams held when the rebuild began.
    marks = {
        stream: LogMark(sequence=max(extent.last_seq, read.get(stream, 0)), created=extent.created)
        for stream, extent in extents.items()
    }
    return Rebuilt(
        ledger=ledger, events=count, marks=marks, from_image=image is not None, set_aside=set_aside
    )


def image_bytes(ledger: Ledger, marks: Mapping[str, LogMark]) -> bytes:
    """The image of the ledger, folded as far as `marks` say, to store; ImageError when it cannot
    be taken. Taken between two events: the fold must not move on while it is."""
    return encode_image(image_of(ledger, marks))


async def store_image(bus: Bus, data: bytes) -> None:
    """Store the image for the next start. A failure (BusError) leaves the image stored before,
    which still fits: that start folds more of the log."""
    await bus.put_object(IMAGE_BUCKET.bucket, IMAGE_NAME, data)
