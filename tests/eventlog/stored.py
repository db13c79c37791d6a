"""A log file as the export writes it, from events a test made: stamped 10 ms apart, numbered per
stream."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import msgspec

from tangram.eventlog.records import EventLog, LogHeader, extents, record, write_log
from tangram.events import Event, encode


def write_stored(path: Path, events: list[Event], start: datetime) -> list[Event]:
    """Write `events` as a log at `path`; returns them as stored (with their times)."""
    stamped: list[Event] = []
    records = []
    sequences: dict[str, int] = {}
    for position, original in enumerate(events):
        event = msgspec.structs.replace(original, time=start + timedelta(milliseconds=10 * position))
        stamped.append(event)
        sequences[event.stream] = sequences.get(event.stream, 0) + 1
        records.append(
            record(event.stream, sequences[event.stream], event.subject, event.time, encode(event))
        )
    header = LogHeader(
        tangram_version="0.1.0", exported_at=start + timedelta(minutes=1), streams=extents(records)
    )
    write_log(path, EventLog(header=header, records=records))
    return stamped
