"""`tangram status`: the fleet as the bus knows it now: MIG layouts, NVLink domains, claims, services."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import msgspec

from tangram.bus import BusError
from tangram.cli.logsource import add_nats_arguments, connect
from tangram.fleetview.model import FleetView, ServiceHealth


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--health",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a service's health endpoint to ask (repeatable), e.g. allocator=http://10.0.0.5:8080",
    )
    add_nats_arguments(parser)


def _health_urls(specs: list[str]) -> list[tuple[str, str]]:
    urls = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--health {spec!r} is not NAME=http(s)://HOST:PORT")
        urls.append((name, url))
    return urls


def run(args: argparse.Namespace) -> int:
    try:
        urls = _health_urls(args.health)
        view, health = asyncio.run(_read(args, urls))
    except (ValueError, BusError) as error:
        print(f"tangram status: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = view.to_builtins()
        out["services"] = msgspec.to_builtins(health)
        print(json.dumps(out))
        return 0
    from rich.console import Console  # noqa: PLC0415 - the terminal library only when drawing

    from tangram.fleetview.terminal import fleet, services_table  # noqa: PLC0415

    # Off a terminal (a pipe, a file) rich assumes 80 columns, too narrow for eight memory slices.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(fleet(view, recent_claims=50))
    console.print(services_table(health))
    return 0


async def _read(
    args: argparse.Namespace, urls: list[tuple[str, str]]
) -> tuple[FleetView, list[ServiceHealth]]:
    from tangram.fleetview.collect import services, snapshot  # noqa: PLC0415

    bus = await connect(args, "tangram-status")
    try:
        view = await snapshot(bus)
        return view, await services(bus, view, urls)
    finally:
        await bus.close()
