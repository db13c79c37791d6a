"""A FleetState built from machines, and the parts of its decisions the allocation tests compare."""

from __future__ import annotations

from typing import Any

from tangram.allocation import Allocated, Failed, FleetState
from tangram.events.inventory import NodeHardware


def fleet(*nodes: NodeHardware, **options: Any) -> FleetState:
    state = FleetState(**options)
    for hw in nodes:
        state.apply_inventory(hw)
    return state


def allocated(decision: Any) -> Allocated:
    assert isinstance(decision, Allocated), decision
    return decision


def devices_of(decision: Any) -> list[str]:
    return [d.device for d in allocated(decision).devices]


def gpus_of(decision: Any) -> list[int]:
    """GPU indexes in the order the decision lists them."""
    return [d.gpu_index for d in allocated(decision).devices]


def reason_of(decision: Any) -> str:
    assert isinstance(decision, Failed), decision
    return decision.reason
