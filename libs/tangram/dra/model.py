"""The DRA view of a node's GPUs: devices with attributes, capacities and counter consumption.

One model feeds both the ResourceSlices that discovery publishes and the allocator's fleet state,
so a device name means the same thing everywhere.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from tangram.events.inventory import MigPlacement


class Version(msgspec.Struct, frozen=True):
    """A semantic-version attribute value (`version` in a ResourceSlice)."""

    value: str


AttributeValue = bool | int | str | Version
DeviceKind = Literal["gpu", "mig"]
TaintEffect = Literal["NoSchedule", "NoExecute"]


class DeviceTaint(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"


class CounterConsumption(msgspec.Struct, frozen=True, kw_only=True):
    counter_set: str
    counters: dict[str, int]


class CounterSet(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    counters: dict[str, int]


class Device(msgspec.Struct, frozen=True, kw_only=True):
    """A device as DRA sees it. Attribute and capacity names are fully qualified (domain/name)."""

    name: str  # DNS label, stable across restarts
    kind: DeviceKind
    gpu_index: int
    gpu_uuid: str
    attributes: dict[str, AttributeValue]
    capacity: dict[str, int]  # base units: bytes for memory
    consumes: list[CounterConsumption] = []
    taints: list[DeviceTaint] = []
    profile: str | None = None
    profile_id: int | None = None
    placement: MigPlacement | None = None
    # A share host: several claims may hold it at once (DRA allowMultipleAllocations), each a share
    # of its memory; it consumes the same counters as the exclusive device it shares, so holding
    # it excludes that device and every overlapping one.
    shared: bool = False


class NodeDevices(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one node advertises: one pool named after the node."""

    node: str
    driver: str
    pool: str
    devices: list[Device]
    counter_sets: list[CounterSet]
