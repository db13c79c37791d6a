"""Which DeviceClasses, and so which ResourceClaims, are Tangram's: one rule for admission and the
allocator.

A DeviceClass is Tangram's when one of its CEL selectors requires Tangram's driver as a top-level
conjunct: `device.driver == "gpu.tangram.dev"`, alone or joined to other conditions with `&&` (in
either operand order). Only then does every device the class can select come from Tangram's
ResourceSlices; a class that mentions the driver under `||`, `!` or a ternary may select other
drivers' devices too, and is left to kube-scheduler. Classes created in the cluster count as much
as the shipped ones.

A claim is Tangram's when it has at least one request and every request, and every alternative of
a `firstAvailable` request, names a Tangram class. A claim that mixes drivers is not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tangram.cel.errors import CelError
from tangram.cel.syntax import Call, Ident, Literal, Node, Select, parse

DRIVER = "gpu.tangram.dev"


def _conjuncts(node: Node) -> Iterator[Node]:
    if isinstance(node, Call) and node.function == "_&&_" and node.target is None:
        for arg in node.args:
            yield from _conjuncts(arg)
    else:
        yield node


def _is_driver_field(node: Node) -> bool:
    return (
        isinstance(node, Select)
        and not node.test_only
        and node.field == "driver"
        and isinstance(node.operand, Ident)
        and node.operand.name == "device"
    )


def _is_string(node: Node, value: str) -> bool:
    return isinstance(node, Literal) and node.kind == "string" and node.value == value


# A cluster has a handful of classes, judged for every claim and pod event: each expression is
# parsed once (bounded, as classes are created by users).
@functools.lru_cache(maxsize=1024)
def requires_driver(expression: str, driver: str = DRIVER) -> bool:
    """True when `expression` (a device selector) holds only for devices of `driver`: one of its
    top-level `&&` conjuncts is `device.driver == "<driver>"`. An expression that does not parse
    requires nothing."""
    try:
        tree = parse(expression)
    except (CelError, RecursionError, TypeError, AttributeError):
        return False
    for conjunct in _conjuncts(tree):
        if isinstance(conjunct, Call) and conjunct.function == "_==_" and len(conjunct.args) == 2:
            left, right = conjunct.args
            if (_is_driver_field(left) and _is_string(right, driver)) or (
                _is_driver_field(right) and _is_string(left, driver)
            ):
                return True
    return False


def is_tangram_class(device_class: Mapping[str, Any], driver: str = DRIVER) -> bool:
    """True when the DeviceClass object (as the API server returns it) selects only `driver`'s devices."""
    spec = device_class.get("spec") if isinstance(device_class, Mapping) else None
    selectors = spec.get("selectors") if isinstance(spec, Mapping) else None
    if not isinstance(selectors, list):
        return False
    for selector in selectors:
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str) and requires_driver(expression, driver):
            return True
    return False


def requested_class_names(claim_spec: Mapping[str, Any]) -> list[str] | None:
    """Every DeviceClass a ResourceClaim spec (resource.k8s.io/v1) names, request by request and
    alternative by alternative; None when a request names none (a shape this rule cannot judge)."""
    devices = claim_spec.get("devices") if isinstance(claim_spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    if not isinstance(requests, list):
        return None
    names: list[str] = []
    for request in requests:
        if not isinstance(request, Mapping):
            return None
        exactly = request.get("exactly")
        alternatives = request.get("firstAvailable")
        if isinstance(exactly, Mapping):
            choices: list[Any] = [exactly]
        elif isinstance(alternatives, list) and alternatives:
            choices = alternatives
        else:
            return None
        for choice in choices:
            name = choice.get("deviceClassName") if isinstance(choice, Mapping) else None
            if not isinstance(name, str) or not name:
                return None
            names.append(name)
    return names


def is_tangram_claim(claim_spec: Mapping[str, Any], is_tangram: Callable[[str], bool]) -> bool:
    """True when the claim spec has requests and every class they name is Tangram's
    (`is_tangram(class name)`, typically `is_tangram_class` of the class read from the API)."""
    names = requested_class_names(claim_spec)
    if not names:
        return False
    return all(is_tangram(name) for name in names)
