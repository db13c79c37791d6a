"""The DRA device model shared by ResourceSlice rendering and the allocator (pure, no I/O)."""

from tangram.dra.devices import (
    node_devices,
    partitionable,
    to_semver,
    untainted_only,
    whole_devices_only,
    whole_gpu_advertised,
)
from tangram.dra.model import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceKind,
    DeviceTaint,
    NodeDevices,
    Version,
)

__all__ = [
    "AttributeValue",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DeviceKind",
    "DeviceTaint",
    "NodeDevices",
    "Version",
    "node_devices",
    "partitionable",
    "to_semver",
    "untainted_only",
    "whole_devices_only",
    "whole_gpu_advertised",
]
