"""The `device` variable a selector sees, built once per device and reused by every selector.

Shape, as in Kubernetes' DRA CEL environment:
    device.driver                    string
    device.attributes[domain][name]  bool | int | string | semver
    device.capacity[domain][name]    quantity
    device.allowMultipleAllocations  bool
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import cel

from tangram import DRIVER_NAME
from tangram.cel.errors import CelRuntimeError
from tangram.cel.extension_library import EXTENSION_FUNCTIONS
from tangram.cel.kubernetes_library import KUBERNETES_FUNCTIONS, ORDERING_FUNCTIONS
from tangram.cel.semver import parse_semver
from tangram.cel.values import quantity_value, semver_value
from tangram.dra.model import Device, Version

FUNCTIONS = {**KUBERNETES_FUNCTIONS, **ORDERING_FUNCTIONS, **EXTENSION_FUNCTIONS}

# The evaluator logs a warning for every error raised by a library function; those errors are
# reported to the caller as CelRuntimeError, so the log line is noise at fleet scale.
logging.getLogger("cel").setLevel(logging.ERROR)

_WIDENED_CACHE_LIMIT = 16


def split_qualified(name: str, default_domain: str) -> tuple[str, str]:
    """Attribute names without a domain belong to the driver's domain, as in Kubernetes."""
    domain, slash, short = name.partition("/")
    return (domain, short) if slash else (default_domain, name)


def device_variable(device: Device, driver: str) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, short = split_qualified(name, driver)
        if isinstance(value, Version):
            try:
                converted: Any = semver_value(parse_semver(value.value))
            except ValueError as error:
                raise CelRuntimeError(f"device {device.name}: attribute {name}: {error}") from None
        else:
            converted = value
        attributes.setdefault(domain, {})[short] = converted
    capacity: dict[str, dict[str, Any]] = {}
    for name, amount in device.capacity.items():
        domain, short = split_qualified(name, driver)
        capacity.setdefault(domain, {})[short] = quantity_value(amount)
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": False,
    }


class DeviceActivation:
    """One device's CEL input. Hold one per device and pass it to `CelSelector.matches`."""

    __slots__ = ("_widened", "context", "device", "driver", "variable")

    def __init__(self, device: Device, driver: str = DRIVER_NAME) -> None:
        self.device = device
        self.driver = driver
        self.variable = device_variable(device, driver)
        self.context = cel.Context(variables={"device": self.variable}, functions=FUNCTIONS)
        self._widened: OrderedDict[frozenset[str], Any] = OrderedDict()

    def has_domain(self, domain: str) -> bool:
        return domain in self.variable["attributes"] or domain in self.variable["capacity"]

    def widened_context(self, domains: frozenset[str]) -> Any:
        """A context where the given domains exist as empty maps in attributes and capacity.

        Kubernetes answers a lookup of an unknown domain with an empty map, so that
        `has(device.attributes["other.example.com"].x)` is false rather than an error.
        """
        context = self._widened.get(domains)
        if context is None:
            attributes = {domain: {} for domain in domains} | self.variable["attributes"]
            capacity = {domain: {} for domain in domains} | self.variable["capacity"]
            widened = self.variable | {"attributes": attributes, "capacity": capacity}
            context = cel.Context(variables={"device": widened}, functions=FUNCTIONS)
            self._widened[domains] = context
            if len(self._widened) > _WIDENED_CACHE_LIMIT:
                self._widened.popitem(last=False)
        return context


class ActivationCache:
    """Recently used activations, keyed by device identity (devices are immutable)."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._entries: OrderedDict[tuple[int, str], DeviceActivation] = OrderedDict()

    def get(self, device: Device, driver: str) -> DeviceActivation:
        key = (id(device), driver)
        activation = self._entries.get(key)
        if activation is not None and activation.device is device:
            self._entries.move_to_end(key)
            return activation
        activation = DeviceActivation(device, driver)
        self._entries[key] = activation
        if len(self._entries) > self._limit:
            self._entries.popitem(last=False)
        return activation
