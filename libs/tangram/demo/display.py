"""One readable line per event, for people watching the demo."""

from __future__ import annotations

from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    ClaimUnprepared,
    DeadLetter,
    DeviceHealthChanged,
    Event,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
)


def _slices(start: int, size: int) -> str:
    return f"slices {start}-{start + size - 1}"


def describe(event: Event) -> str:
    match event:
        case NodeInventory(hardware=hw):
            products = sorted({g.name for g in hw.gpus})
            migs = sum(len(g.mig_instances) for g in hw.gpus)
            return f"{hw.node}: {len(hw.gpus)} x {', '.join(products)}, {migs} MIG instances"
        case ClaimRequested():
            return f"{event.namespace}/{event.name}"
        case ClaimAllocated():
            devices = ", ".join(d.device for d in event.devices)
            return f"{event.namespace}/{event.name} -> {event.node}: {devices}"
        case ClaimFailed():
            return f"{event.namespace}/{event.name}: {event.reason}"
        case ClaimReleased():
            return f"{event.namespace}/{event.name}"
        case PartitionRequested() | PartitionApplied():
            slices = _slices(event.placement.start, event.placement.size)
            what = f"{event.action} {event.profile} on GPU {event.gpu_index} {slices}"
            if isinstance(event, PartitionApplied):
                return f"{event.node}: {what} -> {event.mig_uuid or 'done'} ({event.duration_ms:.1f} ms)"
            return f"{event.node}: {what}"
        case PartitionFailed():
            return f"{event.node}: {event.action} {event.profile}: {event.nvml_error} {event.reason}"
        case ClaimPrepared():
            ids = ", ".join(i for d in event.devices for i in d.cdi_device_ids)
            return f"{event.node}: {event.namespace}/{event.name} ready: {ids}"
        case ClaimUnprepared():
            return f"{event.node}: {event.namespace}/{event.name}"
        case DeviceHealthChanged():
            state = "healthy" if event.healthy else "unhealthy"
            return f"{event.node}: GPU {event.gpu_uuid} {state} {event.reason}"
        case DeadLetter():
            return f"{event.consumer}: {event.reason}"
        case _:
            return event.key
