"""What the node writes to a prepared claim's `status.devices`, so that `kubectl get resourceclaim
-o yaml` shows what was made: the device's UUID, its GPU, its MIG profile or share, whether it is
ready and whether its GPU is healthy. Pure: no I/O.

`status.devices` (AllocatedDeviceStatus, resource.k8s.io/v1) is one list shared by every driver
of the claim, its entries keyed by driver, pool, device and shareID. A node answers only for what
it prepared: results of its driver in its own pool (the node's name), matched to the devices it
made ready. Every other entry, another driver's or another node's, is carried over exactly as it
was read, and a claim whose uid is not the prepared claim's gets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tangram.cdi.devices import ResolvedAllocation, ResolvedDevice
from tangram.cdi.shares import pinned_limit_mib
from tangram.events import DeviceShare, NodeHardware
from tangram.kubernetes.objects.times import kube_time
from tangram.quantity import binary_quantity

READY = "Ready"
HEALTHY = "Healthy"
# Condition reasons must match the API server's pattern (letters, digits, `_`, `,`, `:`).
PREPARED_REASON = "Prepared"
GPU_HEALTHY_REASON = "GpuHealthy"
GPU_UNHEALTHY_REASON = "GpuUnhealthy"
GPU_UNKNOWN_REASON = "GpuNotInInventory"

Entry = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    index: int
    healthy: bool
    reason: str = ""  # what discovery saw: "XID 79", "GPU is lost (fell off the bus)"


def gpu_health(hardware: NodeHardware | None) -> dict[str, GpuHealth] | None:
    """GPU UUID -> its health, as the node's inventory says; None while there is no inventory
    (then no health condition is written: nothing is known)."""
    if hardware is None:
        return None
    return {
        gpu.uuid: GpuHealth(index=gpu.index, healthy=gpu.health == "healthy", reason=gpu.health_reason)
        for gpu in hardware.gpus
    }


def _key(entry: Mapping[str, Any]) -> tuple[object, object, object, object]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def is_ours(entry: object, *, driver: str, pool: str) -> bool:
    """The entry is this node's to write: its driver and its pool. Anything else is left alone."""
    return isinstance(entry, Mapping) and entry.get("driver") == driver and entry.get("pool") == pool


def status_devices(claim: Mapping[str, Any]) -> list[Any]:
    """The claim's `status.devices` as read (entries of every driver), [] when it has none."""
    status = claim.get("status")
    devices = status.get("devices") if isinstance(status, Mapping) else None
    return list(devices) if isinstance(devices, list) else []


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return [r for r in results if isinstance(r, Mapping)] if isinstance(results, list) else []


def _share_data(share: DeviceShare) -> dict[str, Any]:
    data: dict[str, Any] = {"strategy": share.strategy, "memory": binary_quantity(share.memory_bytes)}
    if share.strategy == "TimeSlicing":
        data["timeSlice"] = share.time_slice
        return data
    # the limits the container's MPS client runs under, as its CDI spec sets them
    data["activeThreadPercentage"] = share.compute_percent
    try:
        limit = pinned_limit_mib(share.memory_bytes)
    except ValueError:
        limit = None
    if limit is not None:
        data["pinnedMemoryLimit"] = f"{limit}Mi"
    return data


def device_data(device: ResolvedDevice) -> dict[str, Any]:
    """`data` of one entry: the UUID a container sees (the MIG device's for a MIG device), its
    GPU, and the MIG profile and GPU instance or the share's limits."""
    data: dict[str, Any] = {
        "uuid": device.visible_uuid,
        "gpuUUID": device.gpu_uuid,
        "gpuIndex": device.gpu_index,
    }
    if device.is_mig:
        data["profile"] = device.profile
        if device.gpu_instance_id >= 0:
            data["gpuInstanceId"] = device.gpu_instance_id
    if device.share is not None:
        data["sharing"] = _share_data(device.share)
    return data


@dataclass(frozen=True, slots=True)
class _Stamp:
    """When the entries are written, and the claim generation they answer."""

    when: str
    generation: int | None

    def condition(self, kind: str, status: str, reason: str, message: str) -> Entry:
        condition: Entry = {"type": kind, "status": status, "reason": reason, "message": message}
        condition["lastTransitionTime"] = self.when
        if self.generation is not None:
            condition["observedGeneration"] = self.generation
        return condition


def _health_condition(device: ResolvedDevice, health: Mapping[str, GpuHealth], stamp: _Stamp) -> Entry:
    known = health.get(device.gpu_uuid)
    if known is None:
        message = f"GPU {device.gpu_uuid} is not in the node's inventory"
        return stamp.condition(HEALTHY, "Unknown", GPU_UNKNOWN_REASON, message)
    gpu = f"GPU {known.index} ({device.gpu_uuid})"
    if known.healthy:
        return stamp.condition(HEALTHY, "True", GPU_HEALTHY_REASON, f"{gpu} is healthy")
    why = f": {known.reason}" if known.reason else ""
    return stamp.condition(HEALTHY, "False", GPU_UNHEALTHY_REASON, f"{gpu} is unhealthy{why}")


def device_entries(
    claim: Mapping[str, Any],
    allocation: ResolvedAllocation,
    *,
    driver: str,
    pool: str,
    health: Mapping[str, GpuHealth] | None,
    now: datetime,
) -> list[Entry]:
    """This node's entries for the claim as read from the API server: one per result of `driver`
    in `pool` that is a device the node prepared for this very claim (same uid), in the order of
    the allocation. A result of another node's pool, or of a device not prepared here, gets none."""
    metadata = claim.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    if metadata.get("uid") != allocation.claim.uid:
        return []
    generation = metadata.get("generation")
    valid = isinstance(generation, int) and not isinstance(generation, bool) and generation >= 0
    stamp = _Stamp(when=kube_time(now), generation=generation if valid else None)
    prepared = {(d.request, d.device): d for d in allocation.devices if d.pool == pool}
    entries: list[Entry] = []
    for result in _results(claim):
        if result.get("driver") != driver or result.get("pool") != pool:
            continue
        device = prepared.get((str(result.get("request")), str(result.get("device"))))
        if device is None:
            continue
        entry: Entry = {"driver": driver, "pool": pool, "device": device.device}
        share_id = result.get("shareID")
        if isinstance(share_id, str) and share_id:
            # only as the allocation carries it: the API server keys the entry by it, and refuses
            # one whose shareID is not an allocated device's (a derived id, where the server
            # dropped the field, would be refused)
            entry["shareID"] = share_id
        conditions = [stamp.condition(READY, "True", PREPARED_REASON, f"prepared on node {pool}")]
        if health is not None:
            conditions.append(_health_condition(device, health, stamp))
        entry["conditions"] = conditions
        entry["data"] = device_data(device)
        entries.append(entry)
    return entries


def _kept_transitions(new: Entry, old: Mapping[str, Any] | None) -> Entry:
    """A condition whose status did not change keeps the time it last changed."""
    before = old.get("conditions") if old is not None else None
    if not isinstance(before, list):
        return new
    times = {
        (c.get("type"), c.get("status")): c.get("lastTransitionTime")
        for c in before
        if isinstance(c, Mapping) and c.get("lastTransitionTime")
    }
    conditions = []
    for condition in new["conditions"]:
        kept = times.get((condition["type"], condition["status"]))
        conditions.append({**condition, "lastTransitionTime": kept} if kept else condition)
    return {**new, "conditions": conditions}


def with_entries(
    existing: Sequence[Any], ours: Sequence[Entry], *, driver: str, pool: str
) -> list[Any] | None:
    """`status.devices` with this node's entries replaced by `ours` and every other entry as it
    was; None when that changes nothing (no write needed)."""
    old = {_key(e): e for e in existing if is_ours(e, driver=driver, pool=pool)}
    kept = [_kept_transitions(entry, old.get(_key(entry))) for entry in ours]
    if [e for e in existing if is_ours(e, driver=driver, pool=pool)] == kept:
        return None
    return [e for e in existing if not is_ours(e, driver=driver, pool=pool)] + kept


def without_entries(existing: Sequence[Any], *, driver: str, pool: str) -> list[Any] | None:
    """`status.devices` without this node's entries; None when it has none."""
    return with_entries(existing, [], driver=driver, pool=pool)
