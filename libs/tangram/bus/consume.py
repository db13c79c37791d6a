"""Durable pull consumers: the handler's outcome decides each message's fate, and what can never
be handled goes to the dead-letter stream, so that a consumer never stops on a bad message."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from tangram.bus.config import is_transient
from tangram.bus.connection import Link
from tangram.bus.deadletters import dead_letter
from tangram.bus.declarations import STREAMS_BY_NAME, ConsumerSpec
from tangram.bus.errors import BusError, Poison, Retry
from tangram.bus.follow import PositionHook
from tangram.bus.lanes import Delivery, Lanes, SlowWatch, lane_key
from tangram.bus.metrics import CONSUMED, DEAD_LETTERS, HANDLE_SECONDS
from tangram.bus.publish import publish
from tangram.bus.streams import ensure_consumer
from tangram.events import DEADLETTER_STREAM, Event, EventDecodeError, admission, decode

log = logging.getLogger("tangram.bus")

Handler = Callable[[Event], Awaitable[None]]

# Room left in a message for the headers a publish adds (Nats-Msg-Id) and the protocol line.
_PUBLISH_HEADROOM = 1024


async def consume(
    link: Link,
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
    """Run the durable pull consumer `spec` until `stop` is set (tangram.bus.client.Bus.consume)."""
    sub = await _bound(link, spec, stop)
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
                event = await decoded(link, spec, msg)
                if event is None:
                    continue
                work = _handle(link, spec, msg, event, handler=handler, watch=watch, on_position=on_position)
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


async def _bound(link: Link, spec: ConsumerSpec, stop: asyncio.Event) -> Any:
    """The consumer created and bound; None once `stop` is set first. While a cluster elects
    new leaders (a server lost) this can take longer than one API call's retries: it is tried
    again for as long as the service runs. Refusals (permissions, a bad config) are raised."""
    while True:
        try:
            await ensure_consumer(link, spec)
            return await link.request(
                lambda: link.js.pull_subscribe_bind(spec.durable, stream=spec.stream),
                f"bind consumer {spec.durable}",
                retry_s=10,
            )
        except BusError as exc:
            if not is_transient(exc):
                raise
            log.warning("consumer not ready, retrying", extra={"consumer": spec.durable, "error": str(exc)})
        await _sleep_or_stop(stop, 1.0)
        if stop.is_set():
            return None


async def decoded(link: Link, spec: ConsumerSpec, msg: Msg) -> Event | None:
    """The message's event, or None once undecodable bytes, or an event its subject may not
    carry, are in the dead letter under `spec`'s name."""
    try:
        event = decode(msg.data)
    except EventDecodeError as exc:
        await _dead_letter(link, spec, msg, f"undecodable event: {exc}")
        return None
    reason = admission(msg.subject, event)
    if reason is None:
        return event
    await _dead_letter(link, spec, msg, f"refused by subject: {reason}")
    return None


async def _handle(
    link: Link,
    spec: ConsumerSpec,
    msg: Msg,
    event: Event,
    *,
    handler: Handler,
    watch: SlowWatch,
    on_position: PositionHook | None,
) -> None:
    started = time.perf_counter()
    watch.begin(msg, started)
    try:
        if on_position is not None:
            on_position(spec.stream, Delivery.of(msg).stream_seq)
        await handler(event)
    except Poison as exc:
        await _dead_letter(link, spec, msg, f"poison: {exc}")
    except Exception as exc:
        deliveries = msg.metadata.num_delivered
        reason = f"{type(exc).__name__}: {exc}"
        if deliveries >= spec.max_deliver:
            await _dead_letter(link, spec, msg, f"failed {deliveries} times, last: {reason}")
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


async def _dead_letter(link: Link, spec: ConsumerSpec, msg: Msg, reason: str) -> None:
    meta = msg.metadata
    letter = dead_letter(
        consumer=spec.durable,
        producer=link.config.producer,
        subject=msg.subject,
        stream=meta.stream,
        sequence=meta.sequence.stream,
        deliveries=meta.num_delivered,
        reason=reason,
        data=msg.data,
        headers=dict(msg.headers or {}),
        max_bytes=_dead_letter_budget(link),
    )
    await publish(link, letter)
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


def _dead_letter_budget(link: Link) -> int:
    """The largest encoded dead letter the server and the dead-letter stream both accept."""
    stream_limit = STREAMS_BY_NAME[DEADLETTER_STREAM].max_msg_size
    server_limit = link.nc.max_payload or stream_limit
    return min(stream_limit, server_limit) - _PUBLISH_HEADROOM


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
