"""`tangram log export`: the claim, node and inventory streams into one portable file."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from pathlib import Path

from tangram.bus import BusError
from tangram.cli.logsource import SourceError, add_nats_arguments, connect, parse_since
from tangram.eventlog.export import export_log
from tangram.eventlog.records import EventLog, write_log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = sub.add_parser("export", help="write the log streams to a gzip'd JSON lines file")
    start = export.add_mutually_exclusive_group()
    start.add_argument("--since", metavar="TIME", help="ISO 8601 time or an age (15m, 2h, 1d)")
    start.add_argument("--from-seq", type=int, metavar="N", help="first sequence of each stream")
    export.add_argument("--out", required=True, type=Path, help="the file to write (e.g. incident.tlog.gz)")
    add_nats_arguments(export)


def run(args: argparse.Namespace) -> int:
    try:
        since = parse_since(args.since) if args.since else None
        if args.from_seq is not None and args.from_seq < 1:
            raise SourceError("--from-seq must be 1 or more")
        log = asyncio.run(_export(args, since))
        write_log(args.out, log)
    except (SourceError, BusError, OSError) as error:
        print(f"tangram log export: {error}", file=sys.stderr)
        return 2
    summary = {
        "out": str(args.out),
        "streams": {
            s.name: {"first_seq": s.first_seq, "last_seq": s.last_seq, "messages": s.messages}
            for s in log.header.streams
        },
        "tangram_version": log.header.tangram_version,
    }
    print(json.dumps(summary))
    return 0


async def _export(args: argparse.Namespace, since: datetime | None) -> EventLog:
    bus = await connect(args, "tangram-log-export")
    try:
        return await export_log(bus, since=since, from_seq=args.from_seq, source=bus.config.servers[0])
    finally:
        await bus.close()
