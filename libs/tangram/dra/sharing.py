"""What one share of a device is, from what a claim says: the same answer for the allocator that
decides it and for the node that prepares it, whoever decided. Pure.

Memory is `capacity.requests.memory` where the claim gives it (consumable capacity; the
allocation's `consumedCapacity` on the node), else the SharingConfig's `memory`, else the
default, rounded up to the request policy's step. Compute is counted only when limited: a
`computePercent` of 100 is the whole device's, the same as none.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from tangram.dra.config import SHARING_KIND, SharingConfig, parse_sharing_config
from tangram.dra.devices import SHARE_MEMORY_DEFAULT, SHARE_MEMORY_STEP
from tangram.dra.names import SHARED_SUFFIX, names_result
from tangram.events.catalogue import DeviceShare
from tangram.quantity import ceil_quantity

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

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


def is_share_host(device: str) -> bool:
    return device.endswith(SHARED_SUFFIX)


def read_share(
    entry: Mapping[str, Any], *, where: str, claim_uid: str, config: SharingConfig | None
) -> DeviceShare | None:
    """The share one allocation result (status.allocation.devices.results[i]) holds; None for a
    result that is not of a share host. Raises ValueError naming the field it cannot read.

    Where the API server dropped shareID and consumedCapacity (consumable capacity off), the id is
    derived as the allocator derived it, and the memory is the SharingConfig's or the default.
    """
    device = str(entry.get("device", ""))
    if not is_share_host(device):
        if entry.get("shareID") is not None:
            raise ValueError(f"{where}.shareID is set, but {device} is not a shared device")
        return None
    identifier = entry.get("shareID")
    if identifier is None:
        identifier = share_id(claim_uid, device)
    elif not isinstance(identifier, str) or not _UUID.match(identifier):
        raise ValueError(f"{where}.shareID: {str(identifier)[:64]!r} is not a UUID")
    requested: int | None = None
    consumed = entry.get("consumedCapacity")
    if consumed is not None:
        if not isinstance(consumed, Mapping):
            raise ValueError(f"{where}.consumedCapacity: expected an object")
        memory = consumed.get("memory")
        if memory is not None:
            try:
                requested = ceil_quantity(str(memory))
            except ValueError as error:
                raise ValueError(f"{where}.consumedCapacity.memory: {error}") from None
    return share_of(identifier, config, memory=share_memory(requested, config))


def allocation_shares(allocation: dict[str, Any], claim_uid: str, driver: str) -> dict[str, DeviceShare]:
    """The shares of share hosts in a status.allocation another writer made, as its node reads them
    (shareID, consumedCapacity, the SharingConfig); a part that does not read is left to the
    device's default share: holding the device matters more here than the size of the share."""
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    results = devices.get("results") if isinstance(devices, dict) else None
    configs = devices.get("config") if isinstance(devices, dict) else None
    rules: list[tuple[list[str], SharingConfig]] = []
    for entry in configs if isinstance(configs, list) else []:
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        parameters = opaque.get("parameters") if isinstance(opaque, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != driver or not isinstance(parameters, dict):
            continue
        if parameters.get("kind") != SHARING_KIND:
            continue
        try:
            config = parse_sharing_config(parameters, "config")
        except ValueError:
            continue
        names = entry.get("requests")
        rules.append(([str(n) for n in names] if isinstance(names, list) else [], config))
    shares: dict[str, DeviceShare] = {}
    for position, entry in enumerate(results if isinstance(results, list) else []):
        if not isinstance(entry, dict) or entry.get("driver") != driver:
            continue
        request = str(entry.get("request", ""))
        chosen = None
        for names, config in rules:
            if names_result(names, request):
                chosen = config
        try:
            share = read_share(entry, where=f"results[{position}]", claim_uid=claim_uid, config=chosen)
        except ValueError:
            continue
        if share is not None:
            shares[str(entry.get("device"))] = share
    return shares
