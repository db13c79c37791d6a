"""Read the log streams out of a running JetStream into an EventLog."""

from __future__ import annotations

from datetime import UTC, datetime

from tangram import __version__
from tangram.bus import Bus, redact_url
from tangram.eventlog.records import LOG_STREAMS, EventLog, LogHeader, LogRecord, extents, record
from tangram.events import INVENTORY_STREAM


async def export_log(
    bus: Bus, *, since: datetime | None = None, from_seq: int | None = None, source: str = ""
) -> EventLog:
    """Every stored message of the log streams, from a time or a sequence (per stream) to now.

    The inventory stream keeps only the last inventory of each node, so an export holds each
    node's facts as of the export, whatever `since` says: replay needs them to decide at all.
    """
    records: list[LogRecord] = []
    for last in await bus.last_per_subject(INVENTORY_STREAM):
        assert last.seq is not None and last.subject is not None and last.time is not None
        records.append(record(INVENTORY_STREAM, last.seq, last.subject, last.time, last.data or b""))
    for stream in LOG_STREAMS:
        if stream == INVENTORY_STREAM:
            continue
        async for sequence, msg in bus.replay_messages(stream, start_seq=from_seq, start_time=since):
            records.append(record(stream, sequence, msg.subject, msg.metadata.timestamp, msg.data))
    header = LogHeader(
        tangram_version=__version__,
        exported_at=datetime.now(UTC),
        streams=extents(records),
        source=redact_url(source) if source else "",
        since=since,
        from_seq=from_seq,
    )
    return EventLog(header=header, records=records)
