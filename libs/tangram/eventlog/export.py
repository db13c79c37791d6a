"""Read the log streams out of a running JetStream into an EventLog."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from nats.aio.msg import Msg

from tangram import __version__
from tangram.bus import Bus, redact_url
from tangram.eventlog.records import LOG_STREAMS, EventLog, LogHeader, LogRecord, extents, record
from tangram.events import INVENTORY_STREAM


async def export_log(
    bus: Bus,
    *,
    since: datetime | None = None,
    from_seq: int | None = None,
    source: str = "",
    inventory_history: Sequence[LogRecord] = (),
) -> EventLog:
    """Every stored message of the log streams, from a time or a sequence (per stream) to now.

    The inventory stream keeps only the last inventory of each node, so an export holds each
    node's facts as of the export, whatever `since` says: replay needs them to decide at all.
    Inventories watched while they were stored (`inventory_history`, see InventoryRecorder) are
    added: with them, replay decides each claim on the inventories of its time.
    """
    inventories = {item.seq: item for item in inventory_history}
    for last in await bus.last_per_subject(INVENTORY_STREAM):
        assert last.seq is not None and last.subject is not None and last.time is not None
        inventories[last.seq] = record(INVENTORY_STREAM, last.seq, last.subject, last.time, last.data or b"")
    records: list[LogRecord] = [inventories[seq] for seq in sorted(inventories)]
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


class InventoryRecorder:
    """Keeps every inventory stored while it runs, before the stream replaces it with the next one."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self._stop: Callable[[], Awaitable[None]] | None = None

    def _keep(self, msg: Msg) -> None:
        meta = msg.metadata
        self.records.append(
            record(INVENTORY_STREAM, meta.sequence.stream, msg.subject, meta.timestamp, msg.data)
        )

    async def start(self, bus: Bus) -> None:
        self._stop = await bus.watch_messages(INVENTORY_STREAM, "tangram.inventory.>", self._keep)

    async def stop(self) -> None:
        if self._stop is not None:
            await self._stop()
            self._stop = None
