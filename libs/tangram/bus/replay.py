"""Reading a stream's history: replays up to the end as of the call, watching a subject's values,
and the last value of each subject. Nothing is acked or left behind on the server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import partial

import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RawStreamMsg

from tangram.bus.connection import Link
from tangram.bus.errors import BusError
from tangram.bus.follow import PositionHook
from tangram.bus.lanes import Delivery
from tangram.bus.metrics import SKIPPED
from tangram.events import Event, EventDecodeError, admission, decode

# A replay read slower than the server pushes (a fold, or a lane waiting while another is folded)
# answers no flow control past this many messages delivered and not yet read: the server pauses
# the consumer instead of filling the connection until it drops it as a slow consumer.
BACKLOG = 2_000
# ... and lets the event loop run every this many messages it hands out, so that the connection
# is read (and flow control answered) while its reader folds.
YIELD_EVERY = 64

log = logging.getLogger("tangram.bus")


async def replay(
    link: Link,
    stream: str,
    *,
    start_seq: int | None = None,
    start_time: datetime | None = None,
    subjects: Sequence[str] = (),
) -> AsyncIterator[tuple[int, Event]]:
    """Events of `stream` in stream order, from a sequence or a time, up to the end as of the call.

    Undecodable messages are logged and skipped: a replay reads history, it does not judge it.
    """
    async for sequence, msg in replay_messages(
        link, stream, start_seq=start_seq, start_time=start_time, subjects=subjects
    ):
        try:
            event = decode(msg.data)
        except EventDecodeError as exc:
            _skipped(stream, "undecodable", msg.subject, sequence, exc)
            continue
        # A rebuild believes what a live reader would: the live path dead-lettered it.
        refused = admission(msg.subject, event)
        if refused is not None:
            _skipped(stream, "wrong-subject", msg.subject, sequence, ValueError(refused))
            continue
        yield sequence, event


async def replay_messages(
    link: Link,
    stream: str,
    *,
    start_seq: int | None = None,
    start_time: datetime | None = None,
    subjects: Sequence[str] = (),
) -> AsyncIterator[tuple[int, Msg]]:
    """The stored messages of `stream` as they are (subject, bytes, headers), in stream order.

    A push consumer delivers to a private inbox with flow control: several times faster than
    pulling, which matters when a service rebuilds its state from the whole log at start.
    """
    nc, js = link.nc, link.js
    info = await link.request(lambda: js.stream_info(stream), f"stream info {stream}", retry_s=10)
    last_seq = info.state.last_seq
    if last_seq == 0 or not info.state.messages or (start_seq is not None and start_seq > last_seq):
        return
    inbox = nc.new_inbox()
    # Delivered messages land in a list that the reader swaps out whole: a queue operation per
    # message would cost more than the rest of the replay.
    arrived: list[Msg] = []
    more = asyncio.Event()
    held_back: list[str] = []  # flow control left unanswered while the reader is behind

    async def deliver(msg: Msg) -> None:
        if not msg.data and msg.headers and msg.headers.get("Status") == "100":
            if msg.reply:  # flow control asks for an answer; idle heartbeats do not
                if len(arrived) >= BACKLOG:
                    held_back.append(msg.reply)
                else:
                    await nc.publish(msg.reply, b"")
            return
        arrived.append(msg)
        more.set()

    config = ConsumerConfig(
        deliver_subject=inbox,
        ack_policy=AckPolicy.NONE,
        deliver_policy=(
            DeliverPolicy.BY_START_TIME if start_time is not None else DeliverPolicy.BY_START_SEQUENCE
        ),
        opt_start_seq=None if start_time is not None else (start_seq or 1),
        opt_start_time=start_time,
        filter_subjects=list(subjects) if len(subjects) > 1 else None,
        filter_subject=subjects[0] if len(subjects) == 1 else None,
        flow_control=True,
        idle_heartbeat=5.0,
        inactive_threshold=30.0,
        mem_storage=True,
    )

    sub = await nc.subscribe(inbox, cb=deliver)
    consumer = None
    try:
        consumer = await link.short_lived_consumer(stream, config, f"replay consumer on {stream}")
        # An unfiltered replay ends at the last sequence the stream's leader reported. The
        # consumer may be placed on a replica still catching up (a server just restarted): its
        # own count of what is pending would end the replay early, missing the newest events.
        whole = not subjects and start_time is None
        if consumer.num_pending == 0 and not whole:
            return
        while True:
            if held_back and len(arrived) < BACKLOG:
                # answered once what came before it has been handed out, not when it arrives
                for reply in held_back:
                    await nc.publish(reply, b"")
                held_back.clear()
            if not arrived:
                more.clear()
                try:
                    await asyncio.wait_for(more.wait(), 30.0)
                except TimeoutError as exc:
                    raise BusError(f"replay of {stream} stalled: nothing delivered for 30 s") from exc
            batch, arrived[:] = list(arrived), []
            for handed, msg in enumerate(batch, 1):
                if not handed % YIELD_EVERY:
                    await asyncio.sleep(0)
                delivery = Delivery.of(msg)
                if delivery.consumer != consumer.name:
                    continue  # an earlier attempt's consumer, created after all
                sequence, pending = delivery.stream_seq, delivery.pending
                if sequence > last_seq:
                    return
                yield sequence, msg
                if sequence >= last_seq or (pending == 0 and not whole):
                    return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if consumer is not None:
            with contextlib.suppress(Exception):
                await js.delete_consumer(stream, consumer.name)


async def watch_messages(
    link: Link, stream: str, subjects: str, each: Callable[[Msg], None]
) -> Callable[[], Awaitable[None]]:
    """Every message stored on `subjects`, from the stream's start and then as stored, to `each`.

    An ordered consumer: nothing is acked or left on the server. For a last-value stream this
    keeps the values that later ones replace. Returns the function that stops watching.
    """

    async def deliver(msg: Msg) -> None:
        each(msg)

    sub = await link.request(
        lambda: link.js.subscribe(
            subjects, stream=stream, cb=deliver, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        ),
        f"watch {subjects}",
        retry_s=10,
    )
    return sub.unsubscribe


async def last_per_subject(link: Link, stream: str) -> list[RawStreamMsg]:
    """The last message stored on each subject of `stream`, by sequence.

    For a last-value stream, read subject by subject: a replay from the first sequence can
    miss a subject whose value is replaced while the replay runs.
    """
    js = link.js
    info = await link.request(
        lambda: js.stream_info(stream, subjects_filter=">"), f"stream info {stream}", retry_s=10
    )
    found: list[RawStreamMsg] = []
    for subject in sorted(info.state.subjects or {}):
        try:
            read = partial(js.get_last_msg, stream, subject)
            found.append(await link.request(read, f"last message on {subject}", retry_s=10))
        except BusError as exc:
            # Gone since the stream told its subjects (purged, or aged out): nothing to read.
            if not isinstance(exc.__cause__, nats.js.errors.NotFoundError):
                raise
    return sorted(found, key=lambda msg: msg.seq or 0)


Reach = Callable[[Event], Mapping[str, int]]
Lane = tuple[str, AsyncIterator[tuple[int, Event]]]


async def replay_into(
    links: Sequence[Link],
    sources: Sequence[tuple[str, Sequence[str]]],
    each: Callable[[Event], object],
    *,
    on_position: PositionHook | None = None,
    reach: Reach | None = None,
    starts: Mapping[str, int] | None = None,
) -> int:
    """Replay each (stream, subjects) in turn into `each`, from the sequence `starts` names for it
    (else the first); returns how many events it saw. Each source is read through the link at its
    place in `links`, else the last one.

    With `reach`, an event that says how far its writer had read a stream replayed after its own
    has that stream's events up to there replayed before it (`fold_lanes`).
    """
    lanes = [
        (
            stream,
            replay(
                links[min(i, len(links) - 1)], stream, subjects=subjects, start_seq=(starts or {}).get(stream)
            ),
        )
        for i, (stream, subjects) in enumerate(sources)
    ]
    return await fold_lanes(lanes, each, on_position=on_position, reach=reach)


async def fold_lanes(
    lanes: Sequence[Lane],
    each: Callable[[Event], object],
    *,
    on_position: PositionHook | None = None,
    reach: Reach | None = None,
) -> int:
    """Fold each lane's events in turn; returns how many there were.

    An event of one lane that `reach` says was written having read a later lane up to a sequence
    has that lane's events up to it folded first: the allocator's decisions are folded after the
    node results it had read when it made them, as it folded them then, and not after the whole
    claims stream. A later lane is read only as far as it is reached, then whole in its turn.

    An event `each` raises on is reported and skipped: a start-up that stops at one bad event
    of the log would stop at it again on every restart. `each` folds the log into long-lived
    state, so the cyclic collector waits until the end (`collector_paused`).
    """
    order = {stream: index for index, (stream, _) in enumerate(lanes)}
    held: dict[int, tuple[int, Event]] = {}  # lane -> the event read past where it was reached
    ended: set[int] = set()
    count = 0

    async def fold(index: int, up_to: int | None) -> None:
        nonlocal count
        stream, events = lanes[index]
        while index not in ended:
            item = held.pop(index, None)
            if item is None:
                try:
                    item = await anext(events)
                except StopAsyncIteration:
                    ended.add(index)
                    return
            sequence, event = item
            if up_to is not None and sequence > up_to:
                held[index] = item
                return
            if reach is not None:
                for later, position in reach(event).items():
                    if order.get(later, -1) > index:
                        await fold(order[later], position)
            if on_position is not None:
                on_position(stream, sequence)
            try:
                each(event)
            except Exception as exc:
                _skipped(stream, "refused", event.subject, sequence, exc)
            count += 1

    try:
        with collector_paused():
            for index in range(len(lanes)):
                await fold(index, None)
    finally:
        for _, events in lanes:
            closing = getattr(events, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()
    return count


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a log is folded into long-lived state: every full
    collection on the way walks all of that state again, so their cost grows with the log (a
    third of a 60,000-event rebuild's time, tangram bench rebuild). Nearly everything a fold
    discards is freed by reference count. The collector is turned back on if it was on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _skipped(stream: str, why: str, subject: str, sequence: int, error: BaseException) -> None:
    """Report a message a replay or follow goes past; a durable consumer dead-letters it instead."""
    SKIPPED.labels(stream, why).inc()
    log.warning(
        "skipping a message of the log",
        extra={
            "stream": stream,
            "why": why,
            "subject": subject,
            "sequence": sequence,
            "error": f"{type(error).__name__}: {error}"[:500],
        },
        exc_info=why == "refused",  # a fold that raises is a bug to find; bad bytes are not
    )
