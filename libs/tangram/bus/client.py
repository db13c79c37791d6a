"""The bus client: the one choke point between Tangram and NATS JetStream.

Bus owns the connection's life (connect, token renewal, loss, close) and hands each job to the
module that does it: declaring streams (tangram.bus.streams), publishing (tangram.bus.publish),
reading history (tangram.bus.replay), following (tangram.bus.follow) and durable consumers with
their dead letters (tangram.bus.consume).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, ConsumerInfo, PubAck, RawStreamMsg

from tangram.bus import consume as durable
from tangram.bus import objects
from tangram.bus import publish as publishing
from tangram.bus import replay as history
from tangram.bus import streams as declare
from tangram.bus.config import BusConfig, TokenFile, connection_user
from tangram.bus.connection import Link, dial, renew_before_expiry, setup_retry_s
from tangram.bus.consume import Handler
from tangram.bus.declarations import (
    KEY_VALUES,
    OBJECT_STORES,
    STREAMS,
    ConsumerSpec,
    KeyValueSpec,
    ObjectStoreSpec,
    StreamSpec,
)
from tangram.bus.follow import Follower, PositionHook
from tangram.events import Event

__all__ = ["Bus", "Handler"]

log = logging.getLogger("tangram.bus")

T = TypeVar("T")


@dataclass(frozen=True)
class StreamExtent:
    first_seq: int
    last_seq: int
    messages: int
    created: str  # ISO 8601: a stream deleted and made again has another


class Bus:
    def __init__(self, nc: NatsClient, config: BusConfig) -> None:
        self._link = Link(nc, nc.jetstream(), config, connection_user(config))
        self.config = config
        self.user = self._link.user
        self._renewal: asyncio.Task[None] | None = None
        # Set when the connection closed without close() asking: nats-py gives up on a
        # connection the server ended with an error (an expired or revoked user, a violation).
        self.lost = asyncio.Event()
        self._closing = False

    async def _on_closed(self) -> None:
        if not self._closing:
            log.error("NATS closed the connection for good", extra={"error": str(self.nats.last_error or "")})
            self.lost.set()

    @classmethod
    async def connect(cls, config: BusConfig, *, wait_s: float | None = None) -> Bus:
        """Connect, retrying the first connection for `wait_s` (None: forever when reconnect_forever)."""
        buses: list[Bus] = []  # the one this connection becomes, once it is made

        async def on_closed() -> None:
            for bus in buses:
                await bus._on_closed()

        token = TokenFile(config.token_file) if config.token_file is not None else None
        nc = await dial(config, token=token, on_closed=on_closed, wait_s=wait_s)
        bus = cls(nc, config)
        buses.append(bus)
        if token is not None:
            bus._renewal = asyncio.create_task(
                renew_before_expiry(nc, token, config.token_renew_margin_s), name="nats-token-renewal"
            )
        return bus

    @property
    def jetstream(self) -> JetStreamContext:
        return self._link.js

    @property
    def nats(self) -> NatsClient:
        return self._link.nc

    async def _api(self, call: Callable[[], Awaitable[T]], what: str, *, retry_s: float = 0.0) -> T:
        """Every JetStream API request goes through here: transient errors retried, others -> BusError."""
        return await self._link.request(call, what, retry_s=retry_s)

    async def ensure_streams(
        self,
        streams: Sequence[StreamSpec] = STREAMS,
        key_values: Sequence[KeyValueSpec] = KEY_VALUES,
        object_stores: Sequence[ObjectStoreSpec] = OBJECT_STORES,
    ) -> None:
        """Create the streams and buckets, or update a stream that differs from its declaration."""
        await declare.ensure_streams(self._link, streams, key_values, object_stores)

    async def stream_extent(self, stream: str) -> StreamExtent:
        """The stream's first and last sequence now, and when it was made."""
        info = await self._api(lambda: self._link.js.stream_info(stream), f"stream info {stream}", retry_s=10)
        created = info.created.isoformat() if info.created is not None else ""
        return StreamExtent(
            first_seq=info.state.first_seq,
            last_seq=info.state.last_seq,
            messages=info.state.messages,
            created=created,
        )

    async def put_object(self, bucket: str, name: str, data: bytes) -> None:
        """Store a blob too large for one message (chunked); it replaces the last one once stored."""
        await objects.put_object(self._link, bucket, name, data)

    async def get_object(self, bucket: str, name: str) -> bytes | None:
        """The blob stored as `name`, its digest checked; None when there is none."""
        return await objects.get_object(self._link, bucket, name)

    async def short_lived_consumer(self, stream: str, config: ConsumerConfig, what: str) -> ConsumerInfo:
        """A follow's or replay's consumer, created so that a server dying does not hold it up."""
        return await self._link.short_lived_consumer(stream, config, what)

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        await declare.ensure_consumer(self._link, spec)

    async def publish(self, event: Event) -> PubAck:
        """Publish and wait for the stream's ack. The event id is the Nats-Msg-Id, so retries store once."""
        return await publishing.publish(self._link, event)

    async def publish_batch(self, events: Sequence[Event]) -> list[PubAck]:
        """Asynchronous publishes in flight together; any that fail are retried one by one (de-duplicated)."""
        return await publishing.publish_batch(self._link, events)

    def replay(
        self,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: datetime | None = None,
        subjects: Sequence[str] = (),
    ) -> AsyncIterator[tuple[int, Event]]:
        """Events of `stream` in stream order, from a sequence or a time, up to the end as of the call.

        Undecodable messages are logged and skipped: a replay reads history, it does not judge it.
        """
        return history.replay(
            self._link, stream, start_seq=start_seq, start_time=start_time, subjects=subjects
        )

    def replay_messages(
        self,
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
        return history.replay_messages(
            self._link, stream, start_seq=start_seq, start_time=start_time, subjects=subjects
        )

    async def watch_messages(
        self, stream: str, subjects: str, each: Callable[[Msg], None]
    ) -> Callable[[], Awaitable[None]]:
        """Every message stored on `subjects`, from the stream's start and then as stored, to `each`.

        An ordered consumer: nothing is acked or left on the server. For a last-value stream this
        keeps the values that later ones replace. Returns the function that stops watching.
        """
        return await history.watch_messages(self._link, stream, subjects, each)

    async def last_per_subject(self, stream: str) -> list[RawStreamMsg]:
        """The last message stored on each subject of `stream`, by sequence.

        For a last-value stream, read subject by subject: a replay from the first sequence can
        miss a subject whose value is replaced while the replay runs.
        """
        return await history.last_per_subject(self._link, stream)

    async def replay_into(
        self,
        sources: Sequence[tuple[str, Sequence[str]]],
        each: Callable[[Event], object],
        *,
        on_position: PositionHook | None = None,
        reach: history.Reach | None = None,
        starts: Mapping[str, int] | None = None,
    ) -> int:
        """Replay each (stream, subjects) in turn into `each`; returns how many events it saw.

        With `reach`, a stream replayed later is replayed up to where an event says its writer had
        read it before that event (`replay.fold_lanes`). An event `each` raises on is reported and
        skipped: a start-up that stops at one bad event of the log would stop at it again on every
        restart.
        """
        if reach is None or len(sources) < 2:
            return await history.replay_into(
                [self._link], sources, each, on_position=on_position, reach=reach, starts=starts
            )
        # Streams read at once each get a connection of their own: a push consumer may leave 32 MB
        # unanswered by flow control, and two on one connection fill the 64 MB a server buffers
        # for a client that is slow to read (a fold), which it then drops as a slow consumer.
        others = [await Bus.connect(self.config, wait_s=setup_retry_s(self._link)) for _ in sources[1:]]
        try:
            return await history.replay_into(
                [self._link, *(bus._link for bus in others)],
                sources,
                each,
                on_position=on_position,
                reach=reach,
                starts=starts,
            )
        finally:
            for bus in others:
                await bus.close()

    async def follow(
        self,
        stream: str,
        subjects: str | Sequence[str],
        handler: Callable[[Event], None],
        *,
        stop: asyncio.Event,
        caught_up: asyncio.Event | None = None,
        on_position: PositionHook | None = None,
    ) -> None:
        """Deliver a subject's history, then live events, in stream order, until `stop` is set.

        For state that a node service rebuilds at every start (an ordered consumer: nothing is
        acked and nothing is left behind on the server). Several subjects share one consumer, so
        their events keep the stream's order between them (a release never overtakes the
        allocation it releases). `caught_up` is set once the history as of the call has been
        handled. Undecodable events, and events their subject may not carry, are dead-lettered
        under `<user>-follow` and skipped.
        """
        filters = [subjects] if isinstance(subjects, str) else list(subjects)
        await Follower(self, stream, filters, handler, caught_up=caught_up, on_position=on_position).run(stop)

    async def consume(
        self,
        spec: ConsumerSpec,
        handler: Handler,
        *,
        stop: asyncio.Event,
        batch: int = 64,
        ready: asyncio.Event | None = None,
        order_by: Callable[[Event], str] | None = None,
        concurrency: int = 1,
        on_position: PositionHook | None = None,
    ) -> None:
        """Run a durable pull consumer until `stop` is set.

        The handler's outcome decides the message's fate: return -> ack; Retry or any other
        exception -> nak with backoff, until max_deliver, then dead letter; Poison or undecodable
        bytes -> dead letter and terminate. The consumer never stops on a bad message.

        Messages are handled one at a time in stream order, unless `order_by` names a key: then
        messages with the same key keep their order and different keys run concurrently, at most
        `concurrency` at once (a partitioner reconfigures GPUs in parallel, each GPU in order).
        """
        await durable.consume(
            self._link,
            spec,
            handler,
            stop=stop,
            batch=batch,
            ready=ready,
            order_by=order_by,
            concurrency=concurrency,
            on_position=on_position,
        )

    async def _decoded(self, spec: ConsumerSpec, msg: Msg) -> Event | None:
        """The message's event, or None once it is in the dead letter (the follower's check too)."""
        return await durable.decoded(self._link, spec, msg)

    async def close(self) -> None:
        """Drain: finish in-flight work, flush publishes, then close."""
        self._closing = True
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None
        nc = self.nats
        if nc.is_closed:
            return
        try:
            await self.jetstream.publish_async_completed()
        except Exception as exc:
            log.warning("pending async publishes not completed", extra={"error": str(exc)})
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            await nc.drain()
        if not nc.is_closed:
            await nc.close()
