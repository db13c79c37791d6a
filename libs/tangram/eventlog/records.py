"""The portable log file: gzip'd JSON lines, a header first, then one stored message per line.

Each message keeps what JetStream stored: stream, sequence, subject, time and the payload bytes.
Payloads are JSON events and are embedded as they are, so the file reads with `zcat | jq`; bytes
that are not JSON (a peer's garbage, kept as evidence) are carried base64 instead.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec

from tangram.events import CLAIMS_STREAM, INVENTORY_STREAM, NODES_STREAM

FORMAT = "tangram-log"
FORMAT_VERSION = 1
# The streams a log holds, in the order a reader breaks ties of equal times (inventory first: a
# node's facts stand before the claims decided on them).
LOG_STREAMS: tuple[str, ...] = (INVENTORY_STREAM, CLAIMS_STREAM, NODES_STREAM)


_NULL = msgspec.Raw(b"null")


class LogFileError(ValueError):
    """A file that is not a Tangram log this version can read; the message says where and why."""


class StreamExtent(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    first_seq: int = 0  # 0: nothing exported from this stream
    last_seq: int = 0
    messages: int = 0


class LogHeader(msgspec.Struct, frozen=True, kw_only=True):
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    tangram_version: str
    exported_at: datetime
    streams: list[StreamExtent]
    source: str = ""  # where it was exported from (a NATS URL without credentials)
    since: datetime | None = None
    from_seq: int | None = None


class LogRecord(msgspec.Struct, frozen=True, kw_only=True):
    stream: str
    seq: int
    subject: str
    time: datetime
    payload: msgspec.Raw = _NULL  # the stored bytes, when they are JSON
    data: bytes | None = None  # the stored bytes otherwise (base64 in the file)

    @property
    def body(self) -> bytes:
        return self.data if self.data is not None else bytes(self.payload)


def record(stream: str, seq: int, subject: str, time: datetime, body: bytes) -> LogRecord:
    try:
        msgspec.json.decode(body)
    except msgspec.DecodeError:
        return LogRecord(stream=stream, seq=seq, subject=subject, time=time, data=body)
    return LogRecord(stream=stream, seq=seq, subject=subject, time=time, payload=msgspec.Raw(body))


@dataclass(frozen=True)
class EventLog:
    header: LogHeader
    records: Sequence[LogRecord]


def extents(records: Iterable[LogRecord]) -> list[StreamExtent]:
    by_stream: dict[str, list[int]] = {name: [] for name in LOG_STREAMS}
    for item in records:
        by_stream.setdefault(item.stream, []).append(item.seq)
    return [
        StreamExtent(name=name, first_seq=min(seqs), last_seq=max(seqs), messages=len(seqs))
        if seqs
        else StreamExtent(name=name)
        for name, seqs in by_stream.items()
    ]


_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(LogHeader)
_record_decoder = msgspec.json.Decoder(LogRecord)


def write_log(path: Path, log: EventLog) -> None:
    """Written to a temporary file and renamed, so a reader never sees half a log."""
    partial = path.with_name(path.name + ".partial")
    with gzip.open(partial, "wb") as out:
        out.write(_encoder.encode(log.header) + b"\n")
        for item in log.records:
            out.write(_encoder.encode(item) + b"\n")
    partial.replace(path)


def read_log(path: Path) -> EventLog:
    try:
        with gzip.open(path, "rb") as source:
            lines = source.read().splitlines()
    except (gzip.BadGzipFile, EOFError) as error:
        raise LogFileError(f"{path}: not a gzip'd Tangram log ({error})") from None
    if not lines:
        raise LogFileError(f"{path}: empty file, expected a header line")
    try:
        header = _header_decoder.decode(lines[0])
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise LogFileError(f"{path}: line 1: not a Tangram log header: {error}") from None
    if header.format != FORMAT:
        raise LogFileError(f"{path}: line 1: format {header.format!r}, expected {FORMAT!r}")
    if header.format_version > FORMAT_VERSION:
        raise LogFileError(
            f"{path}: format version {header.format_version} is newer than this Tangram reads "
            f"({FORMAT_VERSION})"
        )
    records: list[LogRecord] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            records.append(_record_decoder.decode(line))
        except (msgspec.ValidationError, msgspec.DecodeError) as error:
            raise LogFileError(f"{path}: line {number}: {error}") from None
    return EventLog(header=header, records=records)
