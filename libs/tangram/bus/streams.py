"""Stream and consumer declarations as nats-server takes them."""

from __future__ import annotations

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from tangram.bus.declarations import ConsumerSpec, StreamSpec


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
