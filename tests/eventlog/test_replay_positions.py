"""Replay folds what the allocator had read when it decided, not what the store held by then."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.cli.logsource import device_classes
from tangram.eventlog.records import EventLog, LogHeader, LogRecord, extents, record
from tangram.eventlog.replay import replay
from tangram.events import INVENTORY_STREAM, ClaimAllocated, Event, encode
from tests.allocator.helpers import gpus, inventory, request

START = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def late_inventory_log() -> tuple[EventLog, ClaimAllocated]:
    """An L40S node's inventory reaches the store before a 1-GPU claim, but reaches the allocator
    only after deciding it: the allocator saw the HGX node alone and placed the claim there."""
    live = Ledger(fleet=FleetState(), classes=device_classes())
    hgx, l40s = inventory("hgx-h200", "hgx-1"), inventory("l40s-8", "l40s-1")
    live.folded(INVENTORY_STREAM, 1)
    live.apply(hgx, live=False)
    claim = request(1, gpus(1))
    [decision] = live.apply(claim)
    assert isinstance(decision, ClaimAllocated) and decision.node == "hgx-1"
    assert decision.positions == {INVENTORY_STREAM: 1}
    stored: list[Event] = [hgx, l40s, claim, decision]  # store order; l40s-1 was read after deciding
    records: list[LogRecord] = []
    sequences: dict[str, int] = {}
    for position, event in enumerate(stored):
        sequences[event.stream] = sequences.get(event.stream, 0) + 1
        at = START + timedelta(milliseconds=10 * position)
        records.append(record(event.stream, sequences[event.stream], event.subject, at, encode(event)))
    header = LogHeader(tangram_version="0.1.0", exported_at=START, streams=extents(records))
    return EventLog(header=header, records=records), decision


def test_a_decision_is_replayed_with_the_inventories_the_allocator_had_read() -> None:
    log, _ = late_inventory_log()
    report = replay(log, device_classes())
    assert report.claims_decided == 1
    assert report.divergences == []


def test_without_positions_the_same_log_replays_by_store_time_and_diverges() -> None:
    """The control: the decision really depends on the inventory the positions hold back."""
    log, decision = late_inventory_log()
    unstamped = msgspec.structs.replace(decision, positions={})
    records = [
        msgspec.structs.replace(r, payload=msgspec.Raw(encode(unstamped)))
        if r.subject == decision.subject
        else r
        for r in log.records
    ]
    report = replay(EventLog(header=log.header, records=records), device_classes())
    [divergence] = report.divergences
    assert divergence.recorded.node == "hgx-1" and divergence.recomputed.node == "l40s-1"
