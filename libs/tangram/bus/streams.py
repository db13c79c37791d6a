"""Stream and consumer declarations as nats-server takes them, and declaring them on the server:
streams, key-value buckets and durable consumers."""

from __future__ import annotations

from collections.abc import Sequence

import nats.js.errors
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from tangram.bus.connection import Link, setup_retry_s
from tangram.bus.declarations import ConsumerSpec, KeyValueSpec, ObjectStoreSpec, StreamSpec
from tangram.bus.errors import BusError
from tangram.bus.objects import ensure_object_store


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_age=spec.max_age_s,
        duplicate_window=spec.duplicate_window_s,
        max_msg_size=spec.max_msg_size,
        num_replicas=replicas,
    )


def stream_shape(config: StreamConfig) -> tuple[object, ...]:
    """The fields Tangram declares, compared to decide whether a stream needs an update."""
    return (
        tuple(config.subjects or ()),
        config.description,
        config.max_msgs_per_subject,
        config.max_age,
        config.duplicate_window,
        config.max_msg_size,
        config.storage,
        config.retention,
        config.discard,
        config.num_replicas,
    )


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.durable,
        # Named: created on `$JS.API.CONSUMER.CREATE.<stream>.<durable>[.<filter>]`, a subject that
        # permissions can grant to the durable's owner alone.
        name=spec.durable,
        description=spec.description or None,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=spec.ack_wait_s,
        max_deliver=spec.max_deliver,
        filter_subjects=list(spec.filter_subjects) if len(spec.filter_subjects) > 1 else None,
        filter_subject=spec.filter_subjects[0] if len(spec.filter_subjects) == 1 else None,
        max_ack_pending=spec.max_ack_pending,
        metadata=spec.metadata or None,
    )


async def ensure_streams(
    link: Link,
    streams: Sequence[StreamSpec],
    key_values: Sequence[KeyValueSpec],
    object_stores: Sequence[ObjectStoreSpec] = (),
) -> None:
    for spec in streams:
        await ensure_stream(link, spec)
    for bucket in key_values:
        await ensure_key_value(link, bucket)
    for store in object_stores:
        await ensure_object_store(link, store)


async def ensure_key_value(link: Link, spec: KeyValueSpec) -> None:
    js, retry_s = link.js, setup_retry_s(link)
    try:
        await link.request(lambda: js.key_value(spec.bucket), f"bucket {spec.bucket}", retry_s=retry_s)
    except BusError as exc:
        if not isinstance(exc.__cause__, nats.js.errors.BucketNotFoundError | nats.js.errors.NotFoundError):
            raise
        config = KeyValueConfig(
            bucket=spec.bucket,
            description=spec.description,
            ttl=spec.ttl_s,
            history=1,
            replicas=link.config.stream_replicas,
        )
        await link.request(
            lambda: js.create_key_value(config), f"create bucket {spec.bucket}", retry_s=retry_s
        )


async def ensure_stream(link: Link, spec: StreamSpec) -> None:
    """Create the stream, or update it when it differs from the table.

    A stream already as declared is left alone: with NATS permissions, only an admin user may
    manage streams, and every service calls this at start.
    """
    js, retry_s = link.js, setup_retry_s(link)
    config = stream_config(spec, link.config.stream_replicas)
    try:
        info = await link.request(
            lambda: js.stream_info(spec.name), f"stream info {spec.name}", retry_s=retry_s
        )
    except BusError as exc:
        if not isinstance(exc.__cause__, nats.js.errors.NotFoundError):
            raise
        await link.request(lambda: js.add_stream(config), f"create stream {spec.name}", retry_s=retry_s)
        return
    if stream_shape(info.config) != stream_shape(config):
        await link.request(lambda: js.update_stream(config), f"update stream {spec.name}", retry_s=retry_s)


async def ensure_consumer(link: Link, spec: ConsumerSpec) -> None:
    config = consumer_config(spec)
    await link.request(
        lambda: link.js.add_consumer(spec.stream, config), f"consumer {spec.durable}", retry_s=10
    )
