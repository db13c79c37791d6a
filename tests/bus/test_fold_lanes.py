"""Folding several streams' logs in turn, each later stream pulled forward to where an event of an
earlier one says its writer had read it: the allocator's rebuild order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tangram.bus import Bus
from tangram.bus.declarations import allocator_log_sources
from tangram.bus.replay import fold_lanes
from tangram.events import (
    CLAIMS_STREAM,
    INVENTORY_STREAM,
    NODES_STREAM,
    ClaimFailed,
    ClaimRequested,
    ClaimUnprepared,
    Event,
)
from tangram.events.positions import recorded_positions


def asked(n: int) -> ClaimRequested:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimRequested(key=uid, namespace="team", name=f"claim-{n}", uid=uid, spec={"devices": {}})


def failed(n: int, nodes_read: int) -> ClaimFailed:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimFailed(
        key=uid, namespace="team", name=f"claim-{n}", uid=uid, reason="full",
        positions={NODES_STREAM: nodes_read, INVENTORY_STREAM: 1},
    )  # fmt: skip


def unprepared(n: int) -> ClaimUnprepared:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimUnprepared(key="n1", node="n1", namespace="outside", name=f"claim-{n}", uid=uid)


class Lane:
    """A stream's log as a replay yields it, noting how far it was read and whether it was closed."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.read = 0
        self.closed = False

    async def replay(self) -> AsyncIterator[tuple[int, Event]]:
        try:
            for seq, event in enumerate(self.events, 1):
                self.read = seq
                yield seq, event
        finally:
            self.closed = True


def names(events: list[Event]) -> list[str]:
    return [f"{type(e).__name__}:{e.name}" for e in events]  # type: ignore[attr-defined]


def test_a_later_stream_is_folded_up_to_where_each_event_says_its_writer_had_read_it() -> None:
    claims = Lane([asked(1), failed(1, nodes_read=2), asked(2), failed(2, nodes_read=2), asked(3)])
    nodes = Lane([unprepared(10), unprepared(11), unprepared(12)])
    folded: list[Event] = []
    positions: list[tuple[str, int]] = []
    reads_at_first_decision: list[int] = []

    def each(event: Event) -> None:
        if isinstance(event, ClaimFailed) and not reads_at_first_decision:
            reads_at_first_decision.append(nodes.read)
        folded.append(event)

    count = asyncio.run(
        fold_lanes(
            [(CLAIMS_STREAM, claims.replay()), (NODES_STREAM, nodes.replay())],
            each,
            on_position=lambda stream, seq: positions.append((stream, seq)),
            reach=recorded_positions,
        )
    )
    assert count == 8
    assert names(folded) == [
        "ClaimRequested:claim-1",
        "ClaimUnprepared:claim-10",
        "ClaimUnprepared:claim-11",
        "ClaimFailed:claim-1",
        "ClaimRequested:claim-2",
        "ClaimFailed:claim-2",
        "ClaimRequested:claim-3",
        "ClaimUnprepared:claim-12",
    ]
    # the third result is read (held back) to see that it lies past the decision, never folded then
    assert reads_at_first_decision == [3]
    assert positions[:4] == [(CLAIMS_STREAM, 1), (NODES_STREAM, 1), (NODES_STREAM, 2), (CLAIMS_STREAM, 2)]
    assert claims.closed and nodes.closed


def test_without_reach_each_stream_is_folded_whole_in_turn_and_a_failing_fold_is_skipped() -> None:
    claims = Lane([asked(1), failed(1, nodes_read=1)])
    nodes = Lane([unprepared(10)])
    folded: list[Event] = []

    def each(event: Event) -> None:
        if isinstance(event, ClaimFailed):
            raise ValueError("a bug in the fold")
        folded.append(event)

    count = asyncio.run(fold_lanes([(CLAIMS_STREAM, claims.replay()), (NODES_STREAM, nodes.replay())], each))
    assert count == 3
    assert names(folded) == ["ClaimRequested:claim-1", "ClaimUnprepared:claim-10"]


def test_a_stream_folded_before_the_event_is_never_read_again_for_it() -> None:
    """The inventory stream is folded whole first: a decision's inventory position pulls nothing."""
    inventory = Lane([unprepared(1), unprepared(2)])
    claims = Lane([failed(5, nodes_read=0)])
    folded: list[Event] = []
    asyncio.run(
        fold_lanes(
            [(INVENTORY_STREAM, inventory.replay()), (CLAIMS_STREAM, claims.replay())],
            folded.append,
            reach=recorded_positions,
        )
    )
    assert names(folded) == ["ClaimUnprepared:claim-1", "ClaimUnprepared:claim-2", "ClaimFailed:claim-5"]


async def test_through_jetstream_the_node_results_a_decision_was_made_after_are_folded_before_it(
    bus: Bus,
) -> None:
    """Two replays open at once on one connection: the claims stream's, and the nodes stream's,
    read only as far as each decision reached until its own turn."""
    await bus.publish_batch([asked(1), failed(1, nodes_read=2), asked(2)])
    await bus.publish_batch([unprepared(10), unprepared(11), unprepared(12)])
    folded: list[Event] = []
    count = await bus.replay_into(allocator_log_sources(), folded.append, reach=recorded_positions)
    assert count == 6
    assert names(folded) == [
        "ClaimRequested:claim-1",
        "ClaimUnprepared:claim-10",
        "ClaimUnprepared:claim-11",
        "ClaimFailed:claim-1",
        "ClaimRequested:claim-2",
        "ClaimUnprepared:claim-12",
    ]
