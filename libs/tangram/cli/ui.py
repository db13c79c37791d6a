"""`tangram ui`: a read-only web view of the fleet, live from the bus, bound to loopback unless told."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from tangram.bus import BusError
from tangram.cli.logsource import add_nats_arguments, connect
from tangram.fleetview.gpuuse import checked_url
from tangram.fleetview.web import DEFAULT_LISTEN, parse_listen, serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; port 0 picks a free one)",
    )
    parser.add_argument(
        "--prometheus-url",
        default=os.environ.get("TANGRAM_PROMETHEUS_URL") or None,
        metavar="URL",
        help="a Prometheus with Tangram's rules and DCGM's series: per-pod GPU use at /gpu-use",
    )
    add_nats_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen(args.listen)
        prometheus = checked_url(args.prometheus_url) if args.prometheus_url else None
        asyncio.run(_serve(args, host, port, prometheus))
    except (ValueError, BusError, OSError) as error:
        print(f"tangram ui: {error}", file=sys.stderr)
        return 2
    return 0


async def _serve(args: argparse.Namespace, host: str, port: int, prometheus_url: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    bus = await connect(args, "tangram-ui")
    try:
        await serve(
            bus,
            host,
            port,
            stop=stop,
            ready=lambda url: print(f"tangram ui: serving {url}", flush=True),
            prometheus_url=prometheus_url,
        )
    finally:
        await bus.close()
