"""The bus client: the one choke point between Tangram and NATS JetStream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    PubAck,
    RawStreamMsg,
)

from tangram.bus.config import (
    TRANSIENT,
    TRANSIENT_API_CODES,
    BusConfig,
    TokenFile,
    connection_user,
    inbox_prefix,
    is_transient,
    redact_url,
    tls_context,
    token_expiry,
)
from tangram.bus.deadletters import dead_letter
from tangram.bus.declarations import (
    KEY_VALUES,
    STREAMS,
    STREAMS_BY_NAME,
    ConsumerSpec,
    KeyValueSpec,
    StreamSpec,
)
from tangram.bus.errors import BusError, Poison, Retry
from tangram.bus.follow import Follower, PositionHook
from tangram.bus.lanes import Lanes, SlowWatch, delivery_position, lane_key
from tangram.bus.metrics import CONSUMED, DEAD_LETTERS, DUPLICATES, HANDLE_SECONDS, PUBLISHED, SKIPPED
from tangram.bus.streams import consumer_config, stream_config, stream_shape
from tangram.events import (
    DEADLETTER_STREAM,
    Event,
    EventDecodeError,
    admission,
    decode,
    encode,
)

log = logging.getLogger("tangram.bus")

T = TypeVar("T")
Handler = Callable[[Event], Awaitable[None]]

# Room left in a message for the headers a publish adds (Nats-Msg-Id) and the protocol line.
_PUBLISH_HEADROOM = 1024


class Bus:
    def __init__(self, nc: NatsClient, config: BusConfig) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self.config = config
        self.user = connection_user(config)
        self._renewal: asyncio.Task[None] | None = None
        # Set when the connection closed without close() asking: nats-py gives up on a
        # connection the server ended with an error (an expired or revoked user, a violation).
        self.lost = asyncio.Event()
        self._closing = False

    async def _on_closed(self) -> None:
        if not self._closing:
            log.error("NATS closed the connection for good", extra={"error": str(self._nc.last_error or "")})
            self.lost.set()

    async def _renew_before_expiry(self, token: TokenFile) -> None:
        """Reconnect with the current token before the one in use expires. A file that still holds
        the same token (the kubelet has not rotated it yet) is checked again shortly."""
        while True:
            expires = token_expiry(token.sent)
            if expires is None:
                return  # a token without expiry: its user does not expire either
            remaining = expires - time.time()
            await asyncio.sleep(max(0.0, remaining - self.config.token_renew_margin_s))
            newer = token_expiry(token.read())
            if newer is None or newer <= expires:
                log.warning(
                    "NATS token not rotated yet", extra={"path": token.path, "expires_in_s": round(remaining)}
                )
                await asyncio.sleep(min(5.0, max(0.5, expires - time.time())))
                continue
            if self._nc.is_connected:
                log.info("reconnecting with the rotated NATS token")
                await self._nc.force_reconnect()
            await asyncio.sleep(1.0)  # the reconnection sends the rotated token; then look again

    @classmethod
    async def connect(cls, config: BusConfig, *, wait_s: float | None = None) -> Bus:
        """Connect, retrying the first connection for `wait_s` (None: forever when reconnect_forever)."""
        buses: list[Bus] = []  # the one this connection becomes, once it is made

        async def on_closed() -> None:
            for bus in buses:
                await bus._on_closed()

        options: dict[str, Any] = {
            "servers": list(config.servers),
            "name": config.name,
            "connect_timeout": config.connect_timeout_s,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1 if config.reconnect_forever else 60,
            "reconnect_time_wait": 0.25,
            "error_cb": _log_error,
            "disconnected_cb": _log_disconnected,
            "reconnected_cb": _log_reconnected,
            "closed_cb": on_closed,
            "inbox_prefix": inbox_prefix(config),
        }
        if config.credentials_file is not None:
            options["user_credentials"] = config.credentials_file
        token = TokenFile(config.token_file) if config.token_file is not None else None
        if token is not None:
            options["token"] = token
        tls = tls_context(config)
        if tls is not None:
            options["tls"] = tls
        deadline = None if wait_s is None and config.reconnect_forever else time.monotonic() + (wait_s or 0)
        delay = 0.1
        while True:
            try:
                nc = await nats.connect(**options)
                bus = cls(nc, config)
                buses.append(bus)
                if token is not None:
                    bus._renewal = asyncio.create_task(
                        bus._renew_before_expiry(token), name="nats-token-renewal"
                    )
                return bus
            except (nats.errors.NoServersError, OSError, nats.errors.TimeoutError) as exc:
                servers = [redact_url(url) for url in config.servers]
                if deadline is not None and time.monotonic() > deadline:
                    raise BusError(f"cannot connect to NATS at {', '.join(servers)}: {exc}") from exc
                log.warning("nats not reachable, retrying", extra={"servers": servers, "error": str(exc)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    @property
    def _setup_retry_s(self) -> float:
        """Declaring streams at start waits out an outage as long as a publish would: a service
        starting while a cluster elects its leaders must not exit."""
        return max(10.0, self.config.publish_retry_s)

    @property
    def jetstream(self) -> JetStreamContext:
        return self._js

    @property
    def nats(self) -> NatsClient:
        return self._nc

    async def _api(self, call: Callable[[], Awaitable[T]], what: str, *, retry_s: float = 0.0) -> T:
        """Every JetStream API request goes through here: transient errors retried, others -> BusError."""
        deadline = time.monotonic() + retry_s
        delay = 0.05
        while True:
            try:
                return await call()
            except TRANSIENT as exc:
                if time.monotonic() >= deadline or self._nc.is_closed:
                    raise BusError(f"{what}: {type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except nats.js.errors.APIError as exc:
                if exc.err_code not in TRANSIENT_API_CODES or time.monotonic() >= deadline:
                    raise BusError(f"{what}: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except (nats.js.errors.Error, nats.errors.Error) as exc:
                raise BusError(f"{what}: {exc}") from exc

    async def ensure_streams(
        self, streams: Sequence[StreamSpec] = STREAMS, key_values: Sequence[KeyValueSpec] = KEY_VALUES
    ) -> None:
        for spec in streams:
            await self._ensure_stream(spec)
        for bucket in key_values:
            await self._ensure_key_value(bucket)

    async def _ensure_key_value(self, spec: KeyValueSpec) -> None:
        try:
            await self._api(
                lambda: self._js.key_value(spec.bucket), f"bucket {spec.bucket}", retry_s=self._setup_retry_s
            )
        except BusError as exc:
            if not isinstance(
                exc.__cause__, nats.js.errors.BucketNotFoundError | nats.js.errors.NotFoundError
            ):
                raise
            config = KeyValueConfig(
                bucket=spec.bucket,
                description=spec.description,
                ttl=spec.ttl_s,
                history=1,
                replicas=self.config.stream_replicas,
            )
            await self._api(
                lambda: self._js.create_key_value(config),
                f"create bucket {spec.bucket}",
                retry_s=self._setup_retry_s,
            )

    async def _ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream, or update it when it differs from the table.

        A stream already as declared is left alone: with NATS permissions, only an admin user may
        manage streams, and every service calls this at start.
        """
        config = stream_config(spec, self.config.stream_replicas)
        try:
            info = await self._api(
                lambda: self._js.stream_info(spec.name),
                f"stream info {spec.name}",
                retry_s=self._setup_retry_s,
            )
        except BusError as exc:
            if not isinstance(exc.__cause__, nats.js.errors.NotFoundError):
                raise
            await self._api(
                lambda: self._js.add_stream(config), f"create stream {spec.name}", retry_s=self._setup_retry_s
            )
            return
        if stream_shape(info.config) != stream_shape(config):
            await self._api(
                lambda: self._js.update_stream(config),
                f"update stream {spec.name}",
                retry_s=self._setup_retry_s,
            )

    def consumer_name(self) -> str:
        """A fresh name for a short-lived consumer: `<user>-<random>`.

        Named, never anonymous, so that it is created through the filtered create API
        (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`), whose subject lets the server's
        permissions pin which filter a user may read.
        """
        return f"{self.user}-{uuid.uuid4().hex[:16]}"

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        config = consumer_config(spec)
        await self._api(
            lambda: self._js.add_consumer(spec.stream, config), f"consumer {spec.durable}", retry_s=10
        )

    async def publish(self, event: Event) -> PubAck:
        """Publish and wait for the stream's ack. The event id is the Nats-Msg-Id, so retries store once."""
        data = encode(event)
        headers = {"Nats-Msg-Id": event.event_id}
        ack = await self._api(
            lambda: self._js.publish(event.subject, data, timeout=2.0, stream=event.stream, headers=headers),
            f"publish {event.type_name()} to {event.subject}",
            retry_s=self.config.publish_retry_s,
        )
        _count_ack(event, ack)
        return ack

    async def publish_batch(self, events: Sequence[Event]) -> list[PubAck]:
        """Asynchronous publishes in flight together; any that fail are retried one by one (de-duplicated)."""
        futures: list[asyncio.Future[PubAck]] = []
        for event in events:
            future = await self._js.publish_async(
                event.subject, encode(event), stream=event.stream, headers={"Nats-Msg-Id": event.event_id}
            )
            futures.append(future)
        results = await asyncio.gather(*futures, return_exceptions=True)
        acks: list[PubAck] = []
        for event, result in zip(events, results, strict=True):
            if isinstance(result, PubAck):
                _count_ack(event, result)
                acks.append(result)
            else:
                acks.append(await self.publish(event))
        return acks

    async def replay(
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
        async for sequence, msg in self.replay_messages(
            stream, start_seq=start_seq, start_time=start_time, subjects=subjects
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
        info = await self._api(lambda: self._js.stream_info(stream), f"stream info {stream}", retry_s=10)
        last_seq = info.state.last_seq
        if last_seq == 0 or not info.state.messages or (start_seq is not None and start_seq > last_seq):
            return
        inbox = self._nc.new_inbox()
        # Delivered messages land in a list that the reader swaps out whole: a queue operation per
        # message would cost more than the rest of the replay.
        arrived: list[Msg] = []
        more = asyncio.Event()

        async def deliver(msg: Msg) -> None:
            if not msg.data and msg.headers and msg.headers.get("Status") == "100":
                if msg.reply:  # flow control asks for an answer; idle heartbeats do not
                    await self._nc.publish(msg.reply, b"")
                return
            arrived.append(msg)
            more.set()

        sub = await self._nc.subscribe(inbox, cb=deliver)
        config = ConsumerConfig(
            name=self.consumer_name(),
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
        consumer = None
        try:
            consumer = await self._api(
                lambda: self._js.add_consumer(stream, config), f"replay consumer on {stream}", retry_s=10
            )
            # An unfiltered replay ends at the last sequence the stream's leader reported. The
            # consumer may be placed on a replica still catching up (a server just restarted): its
            # own count of what is pending would end the replay early, missing the newest events.
            whole = not subjects and start_time is None
            if consumer.num_pending == 0 and not whole:
                return
            while True:
                if not arrived:
                    more.clear()
                    try:
                        await asyncio.wait_for(more.wait(), 30.0)
                    except TimeoutError as exc:
                        raise BusError(f"replay of {stream} stalled: nothing delivered for 30 s") from exc
                batch, arrived[:] = list(arrived), []
                for msg in batch:
                    sequence, pending = delivery_position(msg)
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
                    await self._js.delete_consumer(stream, consumer.name)

    async def watch_messages(
        self, stream: str, subjects: str, each: Callable[[Msg], None]
    ) -> Callable[[], Awaitable[None]]:
        """Every message stored on `subjects`, from the stream's start and then as stored, to `each`.

        An ordered consumer: nothing is acked or left on the server. For a last-value stream this
        keeps the values that later ones replace. Returns the function that stops watching.
        """

        async def deliver(msg: Msg) -> None:
            each(msg)

        sub = await self._api(
            lambda: self._js.subscribe(
                subjects, stream=stream, cb=deliver, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
            ),
            f"watch {subjects}",
            retry_s=10,
        )
        return sub.unsubscribe

    async def last_per_subject(self, stream: str) -> list[RawStreamMsg]:
        """The last message stored on each subject of `stream`, by sequence.

        For a last-value stream, read subject by subject: a replay from the first sequence can
        miss a subject whose value is replaced while the replay runs.
        """
        info = await self._api(
            lambda: self._js.stream_info(stream, subjects_filter=">"), f"stream info {stream}", retry_s=10
        )
        found: list[RawStreamMsg] = []
        for subject in sorted(info.state.subjects or {}):
            try:
                read = partial(self._js.get_last_msg, stream, subject)
                found.append(await self._api(read, f"last message on {subject}", retry_s=10))
            except BusError as exc:
                # Gone since the stream told its subjects (purged, or aged out): nothing to read.
                if not isinstance(exc.__cause__, nats.js.errors.NotFoundError):
                    raise
        return sorted(found, key=lambda msg: msg.seq or 0)

    async def replay_into(
        self,
        sources: Sequence[tuple[str, Sequence[str]]],
        each: Callable[[Event], object],
        *,
        on_position: PositionHook | None = None,
    ) -> int:
        """Replay each (stream, subjects) in turn into `each`; returns how many events it saw.

        An event `each` raises on is reported and skipped: a start-up that stops at one bad event
        of the log would stop at it again on every restart.
        """
        count = 0
        for stream, subjects in sources:
            async for sequence, event in self.replay(stream, subjects=subjects):
                if on_position is not None:
                    on_position(stream, sequence)
                try:
                    each(event)
                except Exception as exc:
                    _skipped(stream, "refused", event.subject, sequence, exc)
                count += 1
        return count

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
        sub = await self._bound(spec, stop)
        if sub is None:
            return
        if ready is not None:
            ready.set()
        watch = SlowWatch(interval_s=max(spec.ack_wait_s / 3, 0.5))
        heartbeat = asyncio.create_task(watch.run())
        lanes = Lanes(concurrency)
        try:
            while not stop.is_set():
                lanes.raise_failure()
                try:
                    msgs = await sub.fetch(batch, timeout=0.5)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                except (nats.errors.Error, nats.js.errors.Error) as exc:
                    log.warning("fetch failed, retrying", extra={"consumer": spec.durable, "error": str(exc)})
                    await _sleep_or_stop(stop, 0.5)
                    continue
                for msg in msgs:
                    event = await self._decoded(spec, msg)
                    if event is None:
                        continue
                    work = self._handle(spec, msg, event, handler, watch, on_position=on_position)
                    if order_by is None:
                        await work
                    else:
                        await lanes.submit(lane_key(order_by, event), work)
            await lanes.drain()
        finally:
            lanes.cancel()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _bound(self, spec: ConsumerSpec, stop: asyncio.Event) -> Any:
        """The consumer created and bound; None once `stop` is set first. While a cluster elects
        new leaders (a server lost) this can take longer than one API call's retries: it is tried
        again for as long as the service runs. Refusals (permissions, a bad config) are raised."""
        while True:
            try:
                await self.ensure_consumer(spec)
                return await self._api(
                    lambda: self._js.pull_subscribe_bind(spec.durable, stream=spec.stream),
                    f"bind consumer {spec.durable}",
                    retry_s=10,
                )
            except BusError as exc:
                if not is_transient(exc):
                    raise
                log.warning(
                    "consumer not ready, retrying", extra={"consumer": spec.durable, "error": str(exc)}
                )
            await _sleep_or_stop(stop, 1.0)
            if stop.is_set():
                return None

    async def _decoded(self, spec: ConsumerSpec, msg: Msg) -> Event | None:
        """The message's event, or None once undecodable bytes are in the dead letter."""
        try:
            event = decode(msg.data)
        except EventDecodeError as exc:
            await self._dead_letter(spec, msg, f"undecodable event: {exc}")
            return None
        return await self._admitted(spec, msg, event)

    async def _admitted(self, spec: ConsumerSpec, msg: Msg, event: Event) -> Event | None:
        """The event, or None once an event its subject may not carry is in the dead letter."""
        reason = admission(msg.subject, event)
        if reason is None:
            return event
        await self._dead_letter(spec, msg, f"refused by subject: {reason}")
        return None

    async def _handle(
        self,
        spec: ConsumerSpec,
        msg: Msg,
        event: Event,
        handler: Handler,
        watch: SlowWatch,
        *,
        on_position: PositionHook | None,
    ) -> None:
        started = time.perf_counter()
        watch.begin(msg, started)
        try:
            if on_position is not None:
                on_position(spec.stream, delivery_position(msg)[0])
            await handler(event)
        except Poison as exc:
            await self._dead_letter(spec, msg, f"poison: {exc}")
        except Exception as exc:
            deliveries = msg.metadata.num_delivered
            reason = f"{type(exc).__name__}: {exc}"
            if deliveries >= spec.max_deliver:
                await self._dead_letter(spec, msg, f"failed {deliveries} times, last: {reason}")
                return
            delay = exc.delay if isinstance(exc, Retry) and exc.delay is not None else None
            if delay is None:
                delay = spec.backoff_s[min(deliveries - 1, len(spec.backoff_s) - 1)]
            log.warning(
                "handler failed, will redeliver",
                extra={"consumer": spec.durable, "deliveries": deliveries, "delay_s": delay, "error": reason},
            )
            CONSUMED.labels(spec.durable, "nak").inc()
            with contextlib.suppress(nats.errors.Error):
                await msg.nak(delay=delay)
        else:
            CONSUMED.labels(spec.durable, "ack").inc()
            with contextlib.suppress(nats.errors.Error):
                await msg.ack()
        finally:
            watch.end(msg)
            HANDLE_SECONDS.labels(spec.durable).observe(time.perf_counter() - started)

    async def _dead_letter(self, spec: ConsumerSpec, msg: Msg, reason: str) -> None:
        meta = msg.metadata
        letter = dead_letter(
            consumer=spec.durable,
            producer=self.config.producer,
            subject=msg.subject,
            stream=meta.stream,
            sequence=meta.sequence.stream,
            deliveries=meta.num_delivered,
            reason=reason,
            data=msg.data,
            headers=dict(msg.headers or {}),
            max_bytes=self._dead_letter_budget(),
        )
        await self.publish(letter)
        DEAD_LETTERS.labels(spec.durable).inc()
        CONSUMED.labels(spec.durable, "dead_letter").inc()
        log.error(
            "message sent to dead letter",
            extra={
                "consumer": spec.durable,
                "sequence": meta.sequence.stream,
                "reason": letter.reason,
                "by_reference": letter.truncated,
            },
        )
        with contextlib.suppress(nats.errors.Error):
            await msg.term()

    def _dead_letter_budget(self) -> int:
        """The largest encoded dead letter the server and the dead-letter stream both accept."""
        stream_limit = STREAMS_BY_NAME[DEADLETTER_STREAM].max_msg_size
        server_limit = self._nc.max_payload or stream_limit
        return min(stream_limit, server_limit) - _PUBLISH_HEADROOM

    async def close(self) -> None:
        """Drain: finish in-flight work, flush publishes, then close."""
        self._closing = True
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None
        if self._nc.is_closed:
            return
        try:
            await self._js.publish_async_completed()
        except Exception as exc:
            log.warning("pending async publishes not completed", extra={"error": str(exc)})
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            await self._nc.drain()
        if not self._nc.is_closed:
            await self._nc.close()


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


def _count_ack(event: Event, ack: PubAck) -> None:
    if ack.duplicate:
        DUPLICATES.labels(event.type_name()).inc()
    else:
        PUBLISHED.labels(event.type_name()).inc()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _log_error(exc: Exception) -> None:
    log.warning("nats error", extra={"error": str(exc)})


async def _log_disconnected() -> None:
    log.info("nats disconnected")


async def _log_reconnected() -> None:
    log.info("nats reconnected")
