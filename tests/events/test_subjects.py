"""Identity comes from the subject: each subject carries its one event type, about its own key."""

from __future__ import annotations

import msgspec
import pytest

from tangram.events import (
    CHANNELS,
    EVENT_TYPES,
    ClaimReleased,
    DeviceHealthChanged,
    Event,
    NodeInventory,
    PartitionFailed,
    admission,
    channel_of,
)

from .samples import HARDWARE, NODE, UID, every_event


@pytest.mark.parametrize("event", every_event(), ids=lambda e: e.type_name())
def test_every_event_is_admitted_on_its_own_subject(event: Event) -> None:
    assert admission(event.subject, event) is None


def test_every_event_type_has_exactly_one_channel() -> None:
    assert sorted(c.event_type.type_name() for c in CHANNELS) == sorted(t.type_name() for t in EVENT_TYPES)
    assert len({c.pattern for c in CHANNELS}) == len(CHANNELS)


@pytest.mark.parametrize("event", every_event(), ids=lambda e: e.type_name())
def test_no_event_is_admitted_on_another_types_subject(event: Event) -> None:
    for other in every_event():
        if type(other) is not type(event):
            reason = admission(other.subject, event)
            assert reason is not None
            assert f"carries {other.type_name()} only" in reason


def test_a_release_on_an_inventory_subject_is_refused() -> None:
    release = ClaimReleased(key=UID, namespace="ns", name="c", uid=UID)
    assert admission("tangram.inventory.node-b", release) == (
        "claim.released on 'tangram.inventory.node-b': this subject carries node.inventory only"
    )


def test_an_inventory_naming_another_node_is_refused() -> None:
    forged = NodeInventory(key="node-b", hardware=HARDWARE)  # HARDWARE.node is node-a
    assert admission("tangram.inventory.node-b", forged) == (
        "node.inventory on 'tangram.inventory.node-b': it speaks for node 'node-a', "
        "but the subject is node 'node-b''s"
    )


def test_a_key_that_disagrees_with_the_subject_is_refused() -> None:
    inventory = NodeInventory(key=NODE, hardware=HARDWARE)
    reason = admission("tangram.inventory.node-b", inventory)
    assert reason is not None and "its key 'node-a' is not the subject's 'node-b'" in reason


def test_a_node_fact_about_another_node_is_refused() -> None:
    health = DeviceHealthChanged(key="node-b", node=NODE, gpu_uuid="GPU-1", healthy=False)
    reason = admission("tangram.node.node-b.health", health)
    assert reason is not None and "speaks for node 'node-a'" in reason


def test_a_claim_event_naming_another_claim_is_refused() -> None:
    release = ClaimReleased(key="other-claim", namespace="ns", name="c", uid=UID)
    reason = admission("tangram.claim.released.other-claim", release)
    assert reason is not None and f"names claim {UID!r}" in reason


def test_a_subject_tangram_never_uses_carries_nothing() -> None:
    [failed] = [e for e in every_event() if isinstance(e, PartitionFailed)]
    assert channel_of("tangram.node.node-a.partition.exploded") is None
    reason = admission("tangram.node.node-a.partition.exploded", failed)
    assert reason is not None and "no event may arrive on this subject" in reason


def test_an_unparseable_node_name_in_the_payload_is_refused() -> None:
    hardware = msgspec.structs.replace(HARDWARE, node="Not A Node/..")
    reason = admission("tangram.inventory.node-a", NodeInventory(key="node-a", hardware=hardware))
    assert reason is not None and "speaks for node 'Not A Node/..'" in reason
