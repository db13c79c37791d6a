"""A replay folded slower than the server pushes keeps its connection: the allocator's rebuild reads
the claims and the nodes streams at once, each a push consumer whose flow-control window grows to
tens of megabytes, and a connection the server cannot write to fast enough is dropped as a slow
consumer (its pending bytes past `max_pending`)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram.bus import Bus
from tangram.bus.declarations import allocator_log_sources
from tangram.events import CLAIMS_STREAM, NODES_STREAM, ClaimRequested, ClaimUnprepared, Event
from tangram.local.natsserver import NatsServer

CLAIMS = 8000
RESULTS = 8000
PADDING = "x" * 1500  # a decision's size: its devices, positions and config
FOLD_S = 0.0003  # the fold of one event, about a large ledger's


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A nats-server that buffers at most 8 MB for a connection, as the default 64 MB is to two
    replays of a year's log (the `bus` fixture connects to it)."""
    with tempfile.TemporaryDirectory(prefix="tangram-nats-") as root:
        config = Path(root) / "nats.conf"
        config.write_text("max_pending: 8MB\n")
        server = NatsServer(Path(root) / "store", config_file=config).start()
        try:
            yield server
        finally:
            server.stop()


def asked(n: int) -> ClaimRequested:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimRequested(
        key=uid, namespace="team", name=f"claim-{n}", uid=uid, spec={"devices": {"padding": PADDING}}
    )


def unprepared(n: int) -> ClaimUnprepared:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimUnprepared(key="n1", node="n1", namespace=PADDING, name=f"claim-{n}", uid=uid)


def slow_fold(folded: list[Event]) -> object:
    def fold(event: Event) -> None:
        folded.append(event)
        until = time.perf_counter() + FOLD_S
        while time.perf_counter() < until:  # the CPU a fold takes, holding the event loop
            pass

    return fold


@pytest.mark.timeout(120)
async def test_two_lanes_folded_slower_than_delivered_are_read_whole_on_one_connection(
    bus: Bus, nats_server: NatsServer
) -> None:
    for offset in range(0, CLAIMS, 500):
        await bus.publish_batch([asked(n) for n in range(offset, offset + 500)])
    for offset in range(0, RESULTS, 500):
        await bus.publish_batch([unprepared(n) for n in range(offset, offset + 500)])
    folded: list[Event] = []

    def reach(event: Event) -> dict[str, int]:
        # every claim event reaches a nodes result further: both streams are read from the start
        number = int(event.key[-12:]) if event.stream == CLAIMS_STREAM else 0
        return {NODES_STREAM: number * RESULTS // CLAIMS}

    count = await bus.replay_into(allocator_log_sources(), slow_fold(folded), reach=reach)
    assert count == CLAIMS + RESULTS
    assert [e.key for e in folded if e.stream == CLAIMS_STREAM] == [asked(n).key for n in range(CLAIMS)]
    assert not [line for line in nats_server.log if "Slow Consumer" in line]
