"""What one share of a device is, from what a claim says: the same answer for the allocator that
decides it and for the node that prepares it, whoever decided. Pure.

Memory is `capacity.requests.memory` where the claim gives it (consumable capacity; the
allocation's `consumedCapacity` on the node), else the SharingConfig's `memory`, else the
default, rounded up to the request policy's step. Compute is counted only when limited: a
`computePercent` of 100 is the whole device's, the same as none.
"""

from __future__ import annotations

import uuid

from tangram.dra.config import SharingConfig
from tangram.dra.devices import SHARE_MEMORY_DEFAULT, SHARE_MEMORY_STEP
from tangram.events.catalogue import DeviceShare

# shareIDs are UUIDs derived from the claim and the device, so a replay, and a node reading a
# claim whose server dropped the field, find the same ones
_SHARE_NAMESPACE = uuid.UUID("6b1f6f7e-4c8a-5d2e-9a51-7461e6e72a01")


def share_id(claim_uid: str, device: str) -> str:
    return str(uuid.uuid5(_SHARE_NAMESPACE, f"{claim_uid}/{device}"))


def share_memory(requested: int | None, config: SharingConfig | None) -> int:
    memory = requested if requested is not None else (config.memory if config is not None else None)
    memory = SHARE_MEMORY_DEFAULT if memory is None else memory
    return max(SHARE_MEMORY_STEP, -(-memory // SHARE_MEMORY_STEP) * SHARE_MEMORY_STEP)


def share_of(identifier: str, config: SharingConfig | None, *, memory: int) -> DeviceShare:
    """The share a claim holds: its id, the config's strategy and limits, and its memory."""
    if config is None:
        return DeviceShare(id=identifier, memory_bytes=memory)
    return DeviceShare(
        id=identifier,
        strategy=config.strategy,
        memory_bytes=memory,
        compute_percent=config.computePercent or 100,
        time_slice=config.timeSlice,
    )


def counted_compute(share: DeviceShare) -> int:
    """The compute percentage a share takes from its device's 100 (0 when not limited)."""
    return share.compute_percent if share.compute_percent < 100 else 0
