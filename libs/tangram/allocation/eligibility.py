"""Which devices of a node a request may take at all: selectors, capacity, taints.

Device attributes do not change between inventories, so the answer is cached per node shape (or
per node and inventory generation for selectors that read identities) and reused by every claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tangram.allocation.requests import Alternative, ClaimError
from tangram.allocation.spec import DeviceToleration
from tangram.cel import CelRuntimeError
from tangram.dra.model import Device, DeviceTaint


@dataclass(frozen=True, slots=True)
class Eligible:
    devices: tuple[int, ...]
    reason: str  # why the set is empty; "" when it is not


def tolerated(taint: DeviceTaint, tolerations: Sequence[DeviceToleration]) -> bool:
    for tol in tolerations:
        key_ok = tol.key == taint.key or (tol.key == "" and tol.operator == "Exists")
        value_ok = tol.operator == "Exists" or tol.value == taint.value
        effect_ok = tol.effect in ("", taint.effect)
        if key_ok and value_ok and effect_ok:
            return True
    return False


def _selection(alt: Alternative) -> str:
    text = f'class "{alt.class_name}"'
    if any(where.startswith("request") for where, _ in alt.selectors):
        text += " and the request's selectors"
    return text


def evaluate(alt: Alternative, devices: Sequence[Device], driver: str) -> Eligible:
    """Raises ClaimError on a CEL runtime error: Kubernetes fails the claim, it does not skip the device."""
    by_selector: list[int] = []
    for index, device in enumerate(devices):
        for where, selector in alt.selectors:
            try:
                ok = selector.matches(device, driver)
            except CelRuntimeError as error:
                raise ClaimError(
                    f'request "{alt.result_name}": {where}: CEL runtime error: {error}'
                ) from None
            if not ok:
                break
        else:
            by_selector.append(index)
    if not by_selector:
        return Eligible((), f"no device matches {_selection(alt)}")
    by_capacity = [
        i
        for i in by_selector
        if all(devices[i].capacity.get(name, -1) >= amount for name, amount in alt.capacity)
    ]
    if not by_capacity:
        wanted = ", ".join(f"{name} >= {amount}" for name, amount in alt.capacity)
        return Eligible((), f"no device matching {_selection(alt)} has capacity {wanted}")
    untainted: list[int] = []
    blocking = ""
    for i in by_capacity:
        taint = next((t for t in devices[i].taints if not tolerated(t, alt.tolerations)), None)
        if taint is None:
            untainted.append(i)
        elif not blocking:
            blocking = taint.key
    if not untainted:
        return Eligible((), f"taint {blocking} not tolerated")
    return Eligible(tuple(untainted), "")


class EligibilityCache:
    """(request selection, node shape or node generation) -> eligible device indexes."""

    def __init__(self, limit: int = 50_000) -> None:
        self._entries: dict[tuple[Any, ...], Eligible] = {}
        self._limit = limit

    def get(self, key: tuple[Any, ...]) -> Eligible | None:
        return self._entries.get(key)

    def put(self, key: tuple[Any, ...], value: Eligible) -> None:
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[key] = value
