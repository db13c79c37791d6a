"""`tangram demo`: every service as its own process on simulated GPUs, with an embedded NATS server."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tangram.demo.display import render_summary
from tangram.demo.driver import drive
from tangram.events import InvalidKey, subject_token
from tangram.hardware.machines import MachineError, load_machine
from tangram.local.processes import LocalCluster, SimNode

if TYPE_CHECKING:
    from tangram.demo.live import LiveFleet
    from tangram.events import Event

DEFAULT_NODES = ["node-a=hgx-h200", "node-b=h100-nvl-4x2"]
MAX_DURATION_S = 24 * 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=float,
        default=20.0,
        help="seconds of claims, counted from the first one once the cluster is up (default 20); "
        "however short, the run still shows MIG instances created and destroyed by the churn",
    )
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


def parse_nodes(specs: list[str], *, command: str = "tangram demo") -> list[SimNode]:
    """The simulated nodes, each name and machine checked before any process starts."""
    nodes = []
    for spec in specs:
        name, sep, machine = spec.partition("=")
        if not sep or not name or not machine:
            raise SystemExit(f"{command}: --node {spec!r} is not NAME=MACHINE")
        try:
            subject_token(name)
            load_machine(machine)
        except (InvalidKey, MachineError) as error:
            raise SystemExit(f"{command}: --node {spec!r}: {error}") from None
        nodes.append(SimNode(name, machine))
    return nodes


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.duration <= MAX_DURATION_S:
        raise SystemExit(f"tangram demo: --duration must be from 0 to {MAX_DURATION_S:.0f} seconds")
    cluster = LocalCluster(parse_nodes(args.node or DEFAULT_NODES))

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
            summary = asyncio.run(_drive(cluster, args, out, live.on_event if live is not None else None))
        if args.record is not None:
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
        print()
        print(render_summary(summary))
    healthy = summary["clean_shutdown"] and summary["undecided"] == 0 and summary["prepare_failed"] == 0
    return 0 if healthy else 1


def _live_view() -> LiveFleet:
    from tangram.demo.live import LiveFleet  # noqa: PLC0415 - the terminal library only on a terminal

    return LiveFleet()


async def _drive(
    cluster: LocalCluster,
    args: argparse.Namespace,
    out: Callable[[str], None],
    watch: Callable[[Event], None] | None,
) -> dict[str, Any]:
    """The run; with --record, its log, with every inventory stored during the run (not only the last)."""
    if args.record is None:
        return await drive(cluster, duration_s=args.duration, seed=args.seed, out=out, watch=watch)
    from tangram.bus import Bus, BusConfig  # noqa: PLC0415
    from tangram.eventlog.export import InventoryRecorder, export_log  # noqa: PLC0415
    from tangram.eventlog.records import write_log  # noqa: PLC0415

    bus = await Bus.connect(BusConfig(servers=(cluster.url,), name="demo-record", producer="demo"), wait_s=10)
    recorder = InventoryRecorder()
    try:
        await bus.ensure_streams()
        await recorder.start(bus)
        summary = await drive(cluster, duration_s=args.duration, seed=args.seed, out=out, watch=watch)
        await recorder.stop()
        log = await export_log(bus, source=cluster.url, inventory_history=recorder.records)
        write_log(args.record, log)
        return summary
    finally:
        await recorder.stop()
        await bus.close()
