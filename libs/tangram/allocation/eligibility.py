"""Which devices of a node a request may take at all: selectors, capacity, taints.

Device attributes do not change between inventories, so the answer is cached per node shape (or
per node and inventory generation for selectors that read identities) and reused by every claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tangram.allocation.node import NodeState
from tangram.allocation.requests import Alternative, ClaimError
from tangram.allocation.spec import DeviceToleration
from tangram.cel import CelRuntimeError
from tangram.dra.model import Device, DeviceTaint


@dataclass(frozen=True, slots=True)
class Eligible:
    devices: tuple[int, ...]
    reason: str  # why the set is empty; "" when it is not
    # A selector failed to evaluate on a device ("" when none did): the claim that asked fails
    # with it, and for every other use (demand, supply) the selection holds no device. An error is
    # a value here, never an exception, so that one claim's selector cannot fail another's decision.
    # The set is cached for every alternative with the same class and selectors, so the error
    # names its selector by position: each claim's message then names its own request.
    error: str = ""
    error_selector: int = 0

    def for_claim(self, alt: Alternative) -> Eligible:
        """The set as the claim asking for `alt` sees it: a selector's error fails that claim."""
        if self.error:
            where = alt.selectors[self.error_selector][0]
            raise ClaimError(f'request "{alt.result_name}": {where}: CEL runtime error: {self.error}')
        return self


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
    """On a CEL runtime error the set is empty and carries the error: Kubernetes fails the claim,
    it does not skip the device (`Eligible.for_claim` raises it for the claim that asked)."""
    by_selector: list[int] = []
    for index, device in enumerate(devices):
        for position, (_, selector) in enumerate(alt.selectors):
            try:
                ok = selector.matches(device, driver)
            except CelRuntimeError as error:
                return Eligible((), "", error=str(error), error_selector=position)
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


class NodeEligibility:
    """What each request may take on each node, evaluated once per node shape (per node and
    inventory generation for selectors that read identities) and cached."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self._cache = EligibilityCache()

    def on(self, node: NodeState, alt: Alternative) -> Eligible:
        key: tuple[Any, ...] = (
            (alt.cache_key, node.name, node.generation)
            if alt.node_scoped
            else (alt.cache_key, node.shape.signature)
        )
        found = self._cache.get(key)
        if found is None:
            found = evaluate(alt, node.devices, self.driver)
            self._cache.put(key, found)
        return found

    def for_claim(self, node: NodeState, alt: Alternative) -> Eligible:
        """What the claim asking for `alt` may take on the node: raises its selector's error."""
        return self.on(node, alt).for_claim(alt)
