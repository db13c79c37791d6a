"""Following a stream's subjects: history, then live events, in order, through named consumers.

nats-py's ordered consumer would do, but it creates its consumers either anonymously (a request on
`$JS.API.CONSUMER.CREATE.<stream>`, whose subject says nothing of the filter, and whose body may
even name someone else's durable and rewrite it) or, when named, cannot recreate one after a gap
(the server refuses to change a consumer's start). Permissions can only pin what a user reads when
the filter is in the create subject, which needs a name; so the follower names its consumers, and
starts a fresh one, under a fresh name, from the last sequence it handled whenever deliveries skip
(a consumer sequence gap) or go silent (no heartbeat: the server restarted or the consumer is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

from tangram.bus.declarations import ConsumerSpec
from tangram.bus.errors import BusError
from tangram.bus.lanes import Delivery
from tangram.events import Event

log = logging.getLogger("tangram.bus")

# Told (stream, sequence) of an event just before its handler runs, with no await in between: a
# fold can record how far into each stream it had read when it decided something.
PositionHook = Callable[[str, int], None]


class FollowedBus(Protocol):
    """What a follower needs of the bus (tangram.bus.client.Bus), named here so that the two
    modules do not import each other."""

    user: str

    @property
    def nats(self) -> NatsClient: ...

    @property
    def jetstream(self) -> JetStreamContext: ...

    async def short_lived_consumer(self, stream: str, config: ConsumerConfig, what: str) -> ConsumerInfo: ...

    async def _decoded(self, spec: ConsumerSpec, msg: Msg) -> Event | None: ...


HEARTBEAT_S = 2.0
SILENCE_S = 3 * HEARTBEAT_S  # no message nor heartbeat for this long: start a fresh consumer


class Follower:
    def __init__(
        self,
        bus: FollowedBus,
        stream: str,
        filters: Sequence[str],
        handler: Callable[[Event], None],
        *,
        caught_up: asyncio.Event | None,
        on_position: PositionHook | None = None,
    ) -> None:
        self._bus = bus
        self._on_position = on_position
        self._stream = stream
        self._filters = list(filters)
        self._handler = handler
        self._caught_up = caught_up
        # Refused and undecodable events are dead-lettered under the following user's name.
        self._rejects = ConsumerSpec(
            durable=f"{bus.user}-follow", stream=stream, filter_subjects=tuple(filters)
        )
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._heard = time.monotonic()
        self._consumer: str | None = None
        self._next_consumer_seq = 1
        self._last_stream_seq = 0

    async def _deliver(self, msg: Msg) -> None:
        self._heard = time.monotonic()
        if not msg.data and msg.headers and msg.headers.get("Status") == "100":
            if msg.reply:  # flow control asks for an answer; idle heartbeats do not
                with contextlib.suppress(nats.errors.Error):
                    await self._bus.nats.publish(msg.reply, b"")
            return
        if not (msg.reply or "").startswith("$JS.ACK."):
            return  # another status from the server: the silence check restarts if it matters
        # Nothing to acknowledge (AckPolicy.NONE): marked acked so that dead-lettering it sends no
        # term, which the reader's permissions refuse (acks are only for its own durables).
        msg._ackd = True
        self._queue.put_nowait(msg)

    async def _start(self, inbox: str) -> None:
        """A fresh consumer from the message after the last one handled; the old one is deleted."""
        old, self._consumer = self._consumer, None
        if old is not None:
            with contextlib.suppress(Exception):
                await self._bus.jetstream.delete_consumer(self._stream, old)
        config = ConsumerConfig(
            deliver_subject=inbox,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._last_stream_seq + 1,
            filter_subject=self._filters[0] if len(self._filters) == 1 else None,
            filter_subjects=self._filters if len(self._filters) > 1 else None,
            flow_control=True,
            idle_heartbeat=HEARTBEAT_S,
            inactive_threshold=30.0,
            mem_storage=True,
        )
        info = await self._bus.short_lived_consumer(
            self._stream, config, f"follow {', '.join(self._filters)}"
        )
        self._consumer = info.name
        self._next_consumer_seq = 1
        self._heard = time.monotonic()
        if self._caught_up is not None and info.num_pending == 0:
            self._caught_up.set()

    async def run(self, stop: asyncio.Event) -> None:
        inbox = self._bus.nats.new_inbox()
        sub = await self._bus.nats.subscribe(inbox, cb=self._deliver)
        try:
            await self._start(inbox)
            while not stop.is_set():
                if time.monotonic() - self._heard > SILENCE_S:
                    await self._restart(inbox, "no heartbeat", stop)
                    continue
                msg = await self._next(0.5)
                if msg is None:
                    continue
                delivery = Delivery.of(msg)
                if delivery.consumer != self._consumer or delivery.stream_seq <= self._last_stream_seq:
                    continue  # left over from a consumer replaced since, or already handled
                if delivery.consumer_seq != self._next_consumer_seq:
                    await self._restart(inbox, "deliveries skipped", stop)
                    continue
                self._next_consumer_seq += 1
                self._last_stream_seq = delivery.stream_seq
                await self._handle(msg, delivery.stream_seq)
                if self._caught_up is not None and delivery.pending == 0:
                    self._caught_up.set()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if self._consumer is not None:
                with contextlib.suppress(Exception):
                    await self._bus.jetstream.delete_consumer(self._stream, self._consumer)

    async def _next(self, wait_s: float) -> Msg | None:
        """The next delivery, or None after `wait_s` without one. A follower wakes for every event
        of the fleet: `asyncio.wait_for` would wrap each wait in a task of its own."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            pass
        try:
            async with asyncio.timeout(wait_s):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def _restart(self, inbox: str, why: str, stop: asyncio.Event) -> None:
        log.info(
            "following again",
            extra={"stream": self._stream, "why": why, "from_sequence": self._last_stream_seq + 1},
        )
        while not stop.is_set():
            try:
                await self._start(inbox)
                return
            except BusError as exc:
                log.warning("cannot follow yet, retrying", extra={"stream": self._stream, "error": str(exc)})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

    async def _handle(self, msg: Msg, stream_seq: int) -> None:
        try:
            event = await self._bus._decoded(self._rejects, msg)
            if event is not None:
                if self._on_position is not None:
                    self._on_position(self._stream, stream_seq)
                self._handler(event)
        except Exception:
            # State folding must survive one bad event; the log keeps the event for replay.
            log.exception("handler failed on followed event", extra={"subject": msg.subject})
