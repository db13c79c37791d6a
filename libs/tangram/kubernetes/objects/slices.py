"""Render a node's devices as `resource.k8s.io/v1` ResourceSlices within the API server's limits.

One pool per node. A GPU's devices stay together in one slice where the limits allow, so a change
to one GPU touches as few slices as possible. Kubernetes 1.34 needs a counter set in the slice of
the devices that consume it; 1.35 and later need counter sets in slices of their own.
"""

from __future__ import annotations

import hashlib
from itertools import groupby
from typing import Any

from tangram.dra.devices import SHARE_MEMORY_DEFAULT, SHARE_MEMORY_STEP
from tangram.dra.model import AttributeValue, CounterSet, Device, NodeDevices, Version
from tangram.kubernetes.objects.limits import MAX_SUBDOMAIN, K8sVersion, SliceLimits, check_limits, limits_for
from tangram.quantity import binary_quantity, decimal_quantity

API_VERSION = "resource.k8s.io/v1"
# capacities and counters counted in bytes, by their unqualified name
_BYTE_QUANTITIES = frozenset({"memory"})


class SliceRenderError(ValueError):
    """Devices that cannot be published within the API server's limits; the message says which and why."""


def slice_name(node: str, driver: str, index: int) -> str:
    """`<node>-<driver with dots as dashes>-<index>`, shortened with a hash when a node name is very long."""
    suffix = f"-{driver.replace('.', '-').replace('/', '-')}-{index}"
    name = f"{node}{suffix}"
    if len(name) <= MAX_SUBDOMAIN:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = MAX_SUBDOMAIN - len(suffix) - len(digest) - 1
    return f"{node[:keep].rstrip('.-')}-{digest}{suffix}"


def _quantity(name: str, value: int) -> str:
    local = name.rpartition("/")[2]
    return binary_quantity(value) if local in _BYTE_QUANTITIES else decimal_quantity(value)


def _local_name(name: str, driver: str) -> str:
    """The driver's own domain is implied in a ResourceSlice; other domains stay qualified."""
    prefix = f"{driver}/"
    return name[len(prefix) :] if name.startswith(prefix) else name


def _attribute(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def _counters(counters: dict[str, int]) -> dict[str, dict[str, str]]:
    return {name: {"value": _quantity(name, value)} for name, value in counters.items()}


def render_device(device: Device, driver: str) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "name": device.name,
        "attributes": {_local_name(k, driver): _attribute(v) for k, v in device.attributes.items()},
        "capacity": {_local_name(k, driver): {"value": _quantity(k, v)} for k, v in device.capacity.items()},
    }
    if device.shared:
        rendered["allowMultipleAllocations"] = True
        memory = rendered["capacity"].get("memory")
        if memory is not None:
            memory["requestPolicy"] = {
                "default": binary_quantity(SHARE_MEMORY_DEFAULT),
                "validRange": {
                    "min": binary_quantity(SHARE_MEMORY_STEP),
                    "step": binary_quantity(SHARE_MEMORY_STEP),
                },
            }
    if device.consumes:
        rendered["consumesCounters"] = [
            {"counterSet": c.counter_set, "counters": _counters(c.counters)} for c in device.consumes
        ]
    if device.taints:
        rendered["taints"] = [
            {"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect}
            for t in device.taints
        ]
    return rendered


def _render_counter_set(counter_set: CounterSet) -> dict[str, Any]:
    return {"name": counter_set.name, "counters": _counters(counter_set.counters)}


class _Content:
    """What goes into one slice; measured the way the API server measures it."""

    def __init__(self, devices: list[dict[str, Any]], counter_sets: list[dict[str, Any]]) -> None:
        self.devices = devices
        self.counter_sets = counter_sets

    def merged(self, other: _Content) -> _Content:
        return _Content(self.devices + other.devices, self.counter_sets + other.counter_sets)

    def fits(self, limits: SliceLimits) -> bool:
        busy = any("consumesCounters" in d or "taints" in d for d in self.devices)
        max_devices = limits.max_devices_with_counters_or_taints if busy else limits.max_devices
        if len(self.devices) > max_devices:
            return False
        shared = sum(len(cs["counters"]) for cs in self.counter_sets)
        if limits.max_shared_counters_per_slice is not None and shared > limits.max_shared_counters_per_slice:
            return False
        if (
            limits.max_counter_sets_per_slice is not None
            and len(self.counter_sets) > limits.max_counter_sets_per_slice
        ):
            return False
        consumed = sum(len(c["counters"]) for d in self.devices for c in d.get("consumesCounters", []))
        cap = limits.max_consumed_counters_per_slice
        return cap is None or consumed <= cap


def _split(unit: _Content, limits: SliceLimits, what: str) -> list[_Content]:
    """A unit too big for one slice is cut into runs of devices, which only works without counter sets."""
    if unit.fits(limits):
        return [unit]
    if unit.counter_sets:
        shared = sum(len(cs["counters"]) for cs in unit.counter_sets)
        raise SliceRenderError(
            f"{what} with its counter sets does not fit in one ResourceSlice: "
            f"{len(unit.devices)} devices, {shared} shared counters"
        )
    pieces: list[_Content] = []
    current = _Content([], [])
    for device in unit.devices:
        candidate = current.merged(_Content([device], []))
        if current.devices and not candidate.fits(limits):
            pieces.append(current)
            candidate = _Content([device], [])
        if not candidate.fits(limits):
            raise SliceRenderError(f"device {device['name']!r} alone does not fit in a ResourceSlice")
        current = candidate
    pieces.append(current)
    return pieces


def _pack(units: list[_Content], limits: SliceLimits) -> list[_Content]:
    """First fit in order: keeps neighbouring GPUs together and the result stable for the same input."""
    bins: list[_Content] = []
    for unit in units:
        if bins and bins[-1].merged(unit).fits(limits):
            bins[-1] = bins[-1].merged(unit)
        else:
            bins.append(unit)
    return bins


def _gpu_units(
    devices: list[Device], driver: str, limits: SliceLimits, counter_sets: dict[str, dict[str, Any]]
) -> list[_Content]:
    units: list[_Content] = []
    placed: set[str] = set()
    for gpu_index, group in groupby(devices, key=lambda d: d.gpu_index):
        members = list(group)
        rendered = [render_device(d, driver) for d in members]
        sets: list[dict[str, Any]] = []
        if limits.counters_with_devices:
            for name in dict.fromkeys(c.counter_set for d in members for c in d.consumes):
                if name not in counter_sets:
                    raise SliceRenderError(f"GPU {gpu_index}: devices consume unknown counter set {name!r}")
                if name in placed:
                    # a second copy in another slice would double the counters in 1.34
                    raise SliceRenderError(f"counter set {name!r} is consumed by devices of several GPUs")
                placed.add(name)
                sets.append(counter_sets[name])
        units.extend(_split(_Content(rendered, sets), limits, f"GPU {gpu_index}"))
    if limits.counters_with_devices:
        units.extend(_Content([], [cs]) for name, cs in counter_sets.items() if name not in placed)
    return units


def _counter_slices(counter_sets: list[dict[str, Any]], limits: SliceLimits) -> list[_Content]:
    for cs in counter_sets:
        if len(cs["counters"]) > limits.max_counters_per_set:
            raise SliceRenderError(
                f"counter set {cs['name']!r} has {len(cs['counters'])} counters "
                f"> {limits.max_counters_per_set}"
            )
    return _pack([_Content([], [cs]) for cs in counter_sets], limits)


def render_slices(
    devices: NodeDevices, *, k8s_version: K8sVersion, generation: int = 1, driver: str
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlices for one Kubernetes version ("1.34" to "1.37")."""
    limits = limits_for(k8s_version)
    if devices.driver != driver:
        raise SliceRenderError(f"devices were built for driver {devices.driver!r}, not {driver!r}")
    if generation < 0:
        raise SliceRenderError(f"pool generation must not be negative, got {generation}")
    counter_sets = {cs.name: _render_counter_set(cs) for cs in devices.counter_sets}
    if len(counter_sets) != len(devices.counter_sets):
        raise SliceRenderError("counter set names repeat within the node")
    ordered = sorted(devices.devices, key=lambda d: d.gpu_index)
    units = _gpu_units(ordered, driver, limits, counter_sets)
    contents = [] if limits.counters_with_devices else _counter_slices(list(counter_sets.values()), limits)
    contents += _pack(units, limits)
    if not contents:
        contents = [_Content([], [])]  # an empty pool still says so, with its generation
    slices = [
        _slice(devices, c, driver=driver, generation=generation, index=i, count=len(contents))
        for i, c in enumerate(contents)
    ]
    problems = check_limits(slices, k8s_version)
    if problems:
        raise SliceRenderError(f"node {devices.node}: " + "; ".join(problems))
    return slices


def _slice(
    devices: NodeDevices, content: _Content, *, driver: str, generation: int, index: int, count: int
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "nodeName": devices.node,
        "pool": {"name": devices.pool, "generation": generation, "resourceSliceCount": count},
    }
    if content.counter_sets:
        spec["sharedCounters"] = content.counter_sets
    if content.devices or not content.counter_sets:
        spec["devices"] = content.devices
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(devices.node, driver, index)},
        "spec": spec,
    }
