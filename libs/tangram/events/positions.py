"""How far into the other streams the allocator had read when it wrote an event.

The allocator reads inventories and node results as they arrive, beside the claims, so where they
fall between its decisions is timing. Each decision (and each command it sends) records the last
sequence it had folded of every other stream: a fold of the log takes those first, and sees what
the allocator saw.
"""

from __future__ import annotations

from collections.abc import Mapping

from tangram.events.catalogue import ClaimAllocated, ClaimFailed, ClaimPreempting, PartitionRequested
from tangram.events.envelope import Event

_NOTHING: Mapping[str, int] = {}


def recorded_positions(event: Event) -> Mapping[str, int]:
    """stream -> the last sequence of it read before `event` was written; empty when not recorded."""
    if isinstance(event, ClaimAllocated | ClaimFailed | ClaimPreempting | PartitionRequested):
        return event.positions
    return _NOTHING
