"""Which events each subject may carry, and whose word they are: identity comes from the subject.

NATS permissions say who may publish on a subject (a node's user only on its own node's subjects,
its own partition commands included, the allocator only on claim decisions and commands). That
makes the subject, not the payload, the proof of who spoke. A reader therefore accepts an event only when

- its type is the one the catalogue assigns to the subject it arrived on (a `ClaimReleased` on an
  inventory subject is not a release: the node may publish there, but not that), and
- every identity the payload states agrees with the subject: the key, the node a node fact is
  about, the claim uid a claim event is about.

Anything else is forged or broken and is dead-lettered with the reason `admission` returns. The
table below is the one place that says so; the AsyncAPI document carries it per channel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tangram.events.catalogue import (
    EVENT_TYPES,
    ClaimAllocated,
    ClaimFailed,
    ClaimPreempting,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    ClaimUnprepared,
    DeadLetter,
    DeviceHealthChanged,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
)
from tangram.events.envelope import Event, InvalidKey, subject_token


@dataclass(frozen=True)
class Channel:
    """One subject pattern, the one event type it carries, who may publish there and what binds."""

    event_type: type[Event]
    publisher: str  # who the permissions let publish here
    identity: str  # what in the payload must agree with the subject

    @property
    def pattern(self) -> str:
        return self.event_type.subject_pattern


CHANNELS: tuple[Channel, ...] = (
    Channel(NodeInventory, "the node's discovery", "hardware.node is the subject's node"),
    Channel(ClaimRequested, "the claim source (Kubernetes watcher, CLI)", "uid is the subject's claim"),
    Channel(ClaimAllocated, "the allocator", "uid is the subject's claim"),
    Channel(ClaimFailed, "the allocator", "uid is the subject's claim"),
    Channel(ClaimReleased, "the claim source, the allocator", "uid is the subject's claim"),
    Channel(ClaimPreempting, "the allocator", "uid is the subject's claim (the preemptor)"),
    Channel(
        PartitionRequested,
        "the allocator; the node's cdi service, for claims kube-scheduler allocated",
        "node is the subject's node",
    ),
    Channel(
        PartitionApplied,
        "the node's partitioner",
        "node is the subject's node; counted only for a command the allocator sent that node",
    ),
    Channel(
        PartitionFailed,
        "the node's partitioner",
        "node is the subject's node; counted only for a command the allocator sent that node",
    ),
    Channel(ClaimPrepared, "the node's cdi service", "node is the subject's node"),
    Channel(ClaimUnprepared, "the node's cdi service", "node is the subject's node"),
    Channel(DeviceHealthChanged, "the node's discovery", "node is the subject's node"),
    Channel(DeadLetter, "the consumer named by the subject", "key is the subject's consumer"),
)

CHANNELS_BY_TYPE: dict[type[Event], Channel] = {channel.event_type: channel for channel in CHANNELS}
assert set(CHANNELS_BY_TYPE) == set(EVENT_TYPES), "every event type needs its channel"

_KEY_GROUP = r"(?P<key>[^.]+)"
_MATCHERS: tuple[tuple[re.Pattern[str], Channel], ...] = tuple(
    (re.compile("^" + re.escape(channel.pattern).replace(re.escape("{key}"), _KEY_GROUP) + "$"), channel)
    for channel in CHANNELS
)


def channel_of(subject: str) -> tuple[Channel, str] | None:
    """The channel a subject belongs to and its key token, or None for a subject Tangram never uses."""
    for matcher, channel in _MATCHERS:
        found = matcher.match(subject)
        if found is not None:
            return channel, found["key"]
    return None


def _stated_node(event: Event) -> str | None:
    match event:
        case NodeInventory(hardware=hardware):
            return hardware.node
        case (
            PartitionRequested(node=node)
            | PartitionApplied(node=node)
            | PartitionFailed(node=node)
            | ClaimPrepared(node=node)
            | ClaimUnprepared(node=node)
            | DeviceHealthChanged(node=node)
        ):
            return node
    return None


def _stated_claim(event: Event) -> str | None:
    match event:
        case (
            ClaimRequested(uid=uid)
            | ClaimAllocated(uid=uid)
            | ClaimFailed(uid=uid)
            | ClaimReleased(uid=uid)
            | ClaimPreempting(uid=uid)
        ):
            return uid
    return None


def admission(subject: str, event: Event) -> str | None:
    """Why `event` must not be believed when it arrived on `subject`; None when it may be.

    The reason names the subject, the type and the disagreeing field, for the dead letter.
    """
    type_name = event.type_name()
    found = channel_of(subject)
    if found is None:
        return f"{type_name} on {subject!r}: no event may arrive on this subject"
    channel, key = found
    if channel.event_type is not type(event):
        return f"{type_name} on {subject!r}: this subject carries {channel.event_type.type_name()} only"
    if event.key != key:
        return f"{type_name} on {subject!r}: its key {event.key!r} is not the subject's {key!r}"
    node = _stated_node(event)
    if node is not None and _token(node) != key:
        return f"{type_name} on {subject!r}: it speaks for node {node!r}, but the subject is node {key!r}'s"
    uid = _stated_claim(event)
    if uid is not None and uid != key:
        return f"{type_name} on {subject!r}: it names claim {uid!r}, but the subject is claim {key!r}'s"
    return None


def _token(node: str) -> str | None:
    try:
        return subject_token(node)
    except InvalidKey:
        return None
