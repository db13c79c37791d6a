"""What replay skips, counted apart: bytes that are no event, and events their subject may not carry."""

from __future__ import annotations

from datetime import UTC, datetime

from tangram.cli.logsource import device_classes
from tangram.eventlog.records import EventLog, LogHeader, extents, record
from tangram.eventlog.replay import replay
from tangram.events import INVENTORY_STREAM, ClaimReleased, encode
from tests.allocator.helpers import inventory

AT = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def test_undecodable_and_refused_messages_are_counted_apart() -> None:
    node = inventory("l40s-8", "n1")
    forged = ClaimReleased(key="u-1", namespace="team", name="x", uid="u-1")  # not an inventory
    records = [
        record(INVENTORY_STREAM, 1, node.subject, AT, encode(node)),
        record(INVENTORY_STREAM, 2, "tangram.inventory.n2", AT, encode(forged)),
        record(INVENTORY_STREAM, 3, "tangram.inventory.n3", AT, b"\xff not json"),
    ]
    log = EventLog(
        header=LogHeader(tangram_version="0.1.0", exported_at=AT, streams=extents(records)), records=records
    )
    report = replay(log, device_classes())
    assert (report.events, report.undecodable, report.refused) == (1, 1, 1)
