"""`tangram log export` from a real JetStream, the file format, and `tangram replay --nats-url`."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.bus import Bus
from tangram.cli.logsource import device_classes, parse_since
from tangram.eventlog.records import (
    EventLog,
    LogFileError,
    LogHeader,
    extents,
    read_log,
    record,
    write_log,
)
from tangram.local.natsserver import NatsServer
from tests.allocator.helpers import gpus, inventory, request


async def tangram(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tangram.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def decided_on_the_bus(bus: Bus) -> None:
    """An inventory published twice (the stream keeps the last) and two claims the allocator decided."""
    ledger = Ledger(fleet=FleetState(), classes=device_classes())
    first = inventory("a100-pcie-2x2", "n1")
    await bus.publish(first)
    await bus.publish(inventory("a100-pcie-2x2", "n1"))
    ledger.apply(first, live=False)
    for n, count in ((1, 2), (2, 8)):
        wanted = request(n, gpus(count))
        await bus.publish(wanted)
        for output in ledger.apply(wanted):
            await bus.publish(output)


async def test_export_then_replay(bus: Bus, nats_server: NatsServer, tmp_path: Path) -> None:
    await decided_on_the_bus(bus)
    out = tmp_path / "bus.tlog.gz"
    code, stdout, err = await tangram("log", "export", "--out", str(out), "--nats-url", nats_server.url)
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["streams"]["TANGRAM_CLAIMS"] == {"first_seq": 1, "last_seq": 4, "messages": 4}
    # The inventory stream keeps one value per node: the second publication, sequence 2.
    assert summary["streams"]["TANGRAM_INVENTORY"] == {"first_seq": 2, "last_seq": 2, "messages": 1}
    log = read_log(out)
    assert [(r.stream, r.seq, r.subject) for r in log.records if r.stream == "TANGRAM_CLAIMS"] == [
        ("TANGRAM_CLAIMS", 1, "tangram.claim.requested.00000000-0000-4000-8000-000000000001"),
        ("TANGRAM_CLAIMS", 2, "tangram.claim.allocated.00000000-0000-4000-8000-000000000001"),
        ("TANGRAM_CLAIMS", 3, "tangram.claim.requested.00000000-0000-4000-8000-000000000002"),
        ("TANGRAM_CLAIMS", 4, "tangram.claim.failed.00000000-0000-4000-8000-000000000002"),
    ]
    assert log.header.source == nats_server.url
    code, stdout, err = await tangram("replay", str(out), "--json")
    assert code == 0, err
    assert json.loads(stdout)["divergences"] == [] and json.loads(stdout)["claims_decided"] == 2
    # Straight from the running JetStream, without a file.
    code, stdout, err = await tangram("replay", "--nats-url", nats_server.url, "--json")
    assert code == 0, err
    assert json.loads(stdout)["claims_decided"] == 2


async def test_export_from_a_sequence(bus: Bus, nats_server: NatsServer, tmp_path: Path) -> None:
    await decided_on_the_bus(bus)
    out = tmp_path / "tail.tlog.gz"
    code, _, err = await tangram(
        "log", "export", "--from-seq", "3", "--out", str(out), "--nats-url", nats_server.url
    )
    assert code == 0, err
    claims = [r.seq for r in read_log(out).records if r.stream == "TANGRAM_CLAIMS"]
    assert claims == [3, 4]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    code, _, err = await tangram(
        "log", "export", "--since", future, "--out", str(out), "--nats-url", nats_server.url
    )
    assert code == 0, err
    assert {r.stream for r in read_log(out).records} == {"TANGRAM_INVENTORY"}


async def test_export_names_what_is_wrong(tmp_path: Path) -> None:
    code, _, err = await tangram("log", "export", "--since", "yesterday", "--out", str(tmp_path / "x"))
    assert code == 2 and "--since 'yesterday': expected an ISO 8601 time or an age like 15m, 2h, 1d" in err
    code, _, err = await tangram(
        "log", "export", "--out", str(tmp_path / "x"), "--nats-url", "nats://127.0.0.1:1"
    )
    assert code == 2 and "cannot connect to NATS at nats://127.0.0.1:1" in err


def test_since_reads_ages_and_times() -> None:
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert parse_since("90s", now) == datetime(2026, 3, 1, 11, 58, 30, tzinfo=UTC)
    assert parse_since("2h", now) == datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    assert parse_since("2026-02-28T08:00:00", now) == datetime(2026, 2, 28, 8, 0, tzinfo=UTC)


def test_the_file_keeps_bytes_that_are_not_json(tmp_path: Path) -> None:
    when = datetime(2026, 3, 1, tzinfo=UTC)
    records = [
        record("TANGRAM_CLAIMS", 1, "tangram.claim.requested.x", when, b'{"type": "claim.requested"}'),
        record("TANGRAM_NODES", 7, "tangram.node.n1.health", when, b"\xff\x00garbage"),
    ]
    header = LogHeader(tangram_version="0.1.0", exported_at=when, streams=extents(records))
    path = tmp_path / "log.tlog.gz"
    write_log(path, EventLog(header=header, records=records))
    lines = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    assert lines[1]["payload"] == {"type": "claim.requested"}  # readable with zcat | jq
    back = read_log(path)
    assert [r.body for r in back.records] == [b'{"type": "claim.requested"}', b"\xff\x00garbage"]
    assert [(s.name, s.messages) for s in back.header.streams] == [
        ("TANGRAM_INVENTORY", 0),
        ("TANGRAM_CLAIMS", 1),
        ("TANGRAM_NODES", 1),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not gzip", "not a gzip'd Tangram log"),
        (gzip.compress(b""), "empty file, expected a header line"),
        (gzip.compress(b'{"format": "other"}\n'), "line 1: not a Tangram log header"),
        (
            gzip.compress(
                b'{"format": "tangram-log", "format_version": 9, "tangram_version": "9",'
                b' "exported_at": "2026-01-01T00:00:00Z", "streams": []}\n'
            ),
            "format version 9 is newer than this Tangram reads (1)",
        ),
    ],
)
def test_a_file_that_is_not_a_log_is_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.tlog.gz"
    path.write_bytes(content)
    with pytest.raises(LogFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_log(path)
