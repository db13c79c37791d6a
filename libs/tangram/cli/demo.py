"""`tangram demo`: every service as its own process on simulated GPUs, with an embedded NATS server."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from tangram.demo.cluster import LocalCluster, SimNode
from tangram.demo.driver import drive

if TYPE_CHECKING:
    from tangram.demo.live import LiveFleet

DEFAULT_NODES = ["node-a=hgx-h200", "node-b=h100-nvl-4x2"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of claim churn (default 20)")
    parser.add_argument("--json", action="store_true", help="end with one JSON summary object on stdout")
    parser.add_argument(
        "--node",
        action="append",
        metavar="NAME=MACHINE",
        help=f"a simulated node (repeatable; default {' '.join(DEFAULT_NODES)})",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the random claim churn")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, CDI specs)")
    parser.add_argument(
        "--events",
        action="store_true",
        help="print each event as a line instead of the live view (the default off a terminal)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="write the run's log (as `tangram log export`) when it ends",
    )


def _nodes(specs: list[str]) -> list[SimNode]:
    nodes = []
    for spec in specs:
        name, sep, machine = spec.partition("=")
        if not sep or not name or not machine:
            raise SystemExit(f"tangram demo: --node {spec!r} is not NAME=MACHINE")
        nodes.append(SimNode(name, machine))
    return nodes


def run(args: argparse.Namespace) -> int:
    if args.duration < 0:
        raise SystemExit("tangram demo: --duration must not be negative")
    cluster = LocalCluster(_nodes(args.node or DEFAULT_NODES))

    live = None if args.events or not sys.stdout.isatty() else _live_view()

    def out(line: str) -> None:
        if live is None:
            print(line, flush=True)

    print(f"tangram demo: work folder {cluster.workdir}", flush=True)
    exit_codes: dict[str, int] = {}
    shown: AbstractContextManager[object] = live if live is not None else nullcontext()
    try:
        cluster.start()
        with shown:
            summary = asyncio.run(
                drive(
                    cluster,
                    duration_s=args.duration,
                    seed=args.seed,
                    out=out,
                    watch=live.on_event if live is not None else None,
                )
            )
        if args.record is not None:
            asyncio.run(_record(cluster.url, args.record))
            print(f"tangram demo: log recorded in {args.record}", flush=True)
    except (RuntimeError, OSError) as error:
        print(f"tangram demo: {error}", file=sys.stderr)
        for service in cluster.processes:
            print(f"  log of {service.name}: {service.log_path}", file=sys.stderr)
        cluster.stop()
        return 1
    finally:
        exit_codes = cluster.stop()
    summary["services"] = exit_codes
    summary["clean_shutdown"] = all(code == 0 for code in exit_codes.values())
    if not args.keep:
        shutil.rmtree(cluster.workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    else:
        print("\nsummary")
        for key, value in summary.items():
            print(f"  {key}: {value}")
    healthy = summary["clean_shutdown"] and summary["undecided"] == 0 and summary["prepare_failed"] == 0
    return 0 if healthy else 1


def _live_view() -> LiveFleet:
    from tangram.demo.live import LiveFleet  # noqa: PLC0415 - the terminal library only on a terminal

    return LiveFleet()


async def _record(url: str, path: Path) -> None:
    from tangram.bus import Bus, BusConfig  # noqa: PLC0415
    from tangram.eventlog.export import export_log  # noqa: PLC0415
    from tangram.eventlog.records import write_log  # noqa: PLC0415

    bus = await Bus.connect(BusConfig(servers=(url,), name="demo-record", producer="demo"), wait_s=10)
    try:
        write_log(path, await export_log(bus, source=url))
    finally:
        await bus.close()
