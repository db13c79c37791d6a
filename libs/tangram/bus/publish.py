"""Publishing events: each waits for the stream's ack, and its event id makes retries store once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.js.api import PubAck

from tangram.bus.connection import Link
from tangram.bus.metrics import DUPLICATES, PUBLISHED
from tangram.events import Event, encode


async def publish(link: Link, event: Event) -> PubAck:
    """Publish and wait for the stream's ack. The event id is the Nats-Msg-Id, so retries store once."""
    data = encode(event)
    headers = {"Nats-Msg-Id": event.event_id}
    ack = await link.request(
        lambda: link.js.publish(event.subject, data, timeout=2.0, stream=event.stream, headers=headers),
        f"publish {event.type_name()} to {event.subject}",
        retry_s=link.config.publish_retry_s,
    )
    _count_ack(event, ack)
    return ack


async def publish_batch(link: Link, events: Sequence[Event]) -> list[PubAck]:
    """Asynchronous publishes in flight together; any that fail are retried one by one (de-duplicated)."""
    futures: list[asyncio.Future[PubAck]] = []
    for event in events:
        future = await link.js.publish_async(
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
            acks.append(await publish(link, event))
    return acks


def _count_ack(event: Event, ack: PubAck) -> None:
    if ack.duplicate:
        DUPLICATES.labels(event.type_name()).inc()
    else:
        PUBLISHED.labels(event.type_name()).inc()
