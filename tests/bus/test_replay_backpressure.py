"""A replay whose reader stops reading for a while keeps its connection: the allocator's rebuild
reads the claims and the nodes streams at once, each through a push consumer that nats-server lets
run ahead of its flow-control answers by a window that doubles while they come promptly, up to
32 MB; a connection whose unread bytes pass the server's `max_pending` is dropped as a slow
consumer. Each stream read at once has a connection of its own, so no connection is owed more than
one consumer's window, however long its reader stops: the bound holds by construction, not by how
fast the reader runs (an earlier version of this test, with 8 MB and a steadily slow fold, failed
on a loaded machine for that reason)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tangram.bus import Bus
from tangram.bus.declarations import allocator_log_sources
from tangram.events import CLAIMS_STREAM, NODES_STREAM, ClaimRequested, ClaimUnprepared, Event
from tangram.local.natsserver import NatsServer

# When the reader stops, half of each stream (24 MB, with the protocol's own bytes more) is ahead
# of it: the server buffers more than one stream's rest for a connection, less than two.
PER_STREAM = 30_000
PADDING = "x" * 1500  # a decision's size: its devices, positions and config
MAX_PENDING = "48MB"
HOLD_AT = 15_000  # the claim event whose fold holds the event loop ...
HOLD_S = 2.0  # ... this long, half way: both consumers' windows have grown by then


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A nats-server that buffers 48 MB for a connection (the `bus` fixture connects to it)."""
    with tempfile.TemporaryDirectory(prefix="tangram-nats-") as root:
        config = Path(root) / "nats.conf"
        config.write_text(f"max_pending: {MAX_PENDING}\n")
        server = NatsServer(Path(root) / "store", config_file=config).start()
        try:
            yield server
        finally:
            server.stop()


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def asked(n: int) -> ClaimRequested:
    return ClaimRequested(
        key=uid(n), namespace="team", name=f"claim-{n}", uid=uid(n), spec={"devices": {"padding": PADDING}}
    )


def unprepared(n: int) -> ClaimUnprepared:
    return ClaimUnprepared(key="n1", node="n1", namespace=PADDING, name=f"claim-{n}", uid=uid(n))


def holding_fold(folded: list[Event]) -> Callable[[Event], None]:
    def fold(event: Event) -> None:
        folded.append(event)
        if event.stream == CLAIMS_STREAM and event.key == uid(HOLD_AT):
            time.sleep(HOLD_S)  # a long fold, or a process not scheduled: nothing is read meanwhile

    return fold


@pytest.mark.timeout(180)
async def test_two_lanes_whose_reader_stops_reading_keep_their_connections(
    bus: Bus, nats_server: NatsServer
) -> None:
    for offset in range(0, PER_STREAM, 500):
        await bus.publish_batch([asked(n) for n in range(offset, offset + 500)])
    for offset in range(0, PER_STREAM, 500):
        await bus.publish_batch([unprepared(n) for n in range(offset, offset + 500)])
    folded: list[Event] = []

    def reach(event: Event) -> dict[str, int]:
        # each claim event had read the nodes stream as far: both streams are read from the start
        return {NODES_STREAM: int(event.key[-12:]) if event.stream == CLAIMS_STREAM else 0}

    count = await bus.replay_into(allocator_log_sources(), holding_fold(folded), reach=reach)
    assert not [line for line in nats_server.log if "Slow Consumer" in line]
    assert count == 2 * PER_STREAM
    assert [e.key for e in folded if e.stream == CLAIMS_STREAM] == [uid(n) for n in range(PER_STREAM)]
