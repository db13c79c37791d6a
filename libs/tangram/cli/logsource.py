"""What the log-reading commands share: where the log comes from (a file or a running JetStream)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tangram.allocation import DeviceClass
from tangram.bus import Bus, BusConfig, BusError
from tangram.eventlog.records import EventLog, LogFileError, read_log

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class SourceError(ValueError):
    """A log that cannot be read: the message says which and why."""


def add_nats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats-url",
        action="append",
        metavar="URL",
        help=f"NATS server (repeatable; default $TANGRAM_NATS_URL or {DEFAULT_NATS_URL})",
    )
    parser.add_argument("--creds", type=Path, help="NATS credentials file (JWT + nkey)")


def bus_config(args: argparse.Namespace, name: str) -> BusConfig:
    servers = tuple(args.nats_url or [os.environ.get("TANGRAM_NATS_URL", DEFAULT_NATS_URL)])
    return BusConfig(
        servers=servers,
        name=name,
        producer=name,
        credentials_file=str(args.creds) if args.creds else None,
        reconnect_forever=False,
    )


async def connect(args: argparse.Namespace, name: str) -> Bus:
    return await Bus.connect(bus_config(args, name), wait_s=5)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (UTC when no zone is given) or an age such as 90s, 15m, 2h, 1d."""
    relative = _RELATIVE.match(text)
    if relative:
        amount = timedelta(**{_UNITS[relative.group(2)]: float(relative.group(1))})
        return (now or datetime.now(UTC)) - amount
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise SourceError(f"--since {text!r}: expected an ISO 8601 time or an age like 15m, 2h, 1d") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def load_log(args: argparse.Namespace, name: str) -> EventLog:
    """From --log FILE when given, else exported now from the running JetStream."""
    if getattr(args, "log", None) is not None:
        try:
            return read_log(args.log)
        except (LogFileError, OSError) as error:
            raise SourceError(str(error)) from None
    return asyncio.run(_export(args, name))


async def _export(args: argparse.Namespace, name: str) -> EventLog:
    from tangram.eventlog.export import export_log  # noqa: PLC0415 - NATS only when asked for

    try:
        bus = await connect(args, name)
    except BusError as error:
        raise SourceError(str(error)) from None
    try:
        return await export_log(bus, source=bus.config.servers[0])
    except BusError as error:
        raise SourceError(str(error)) from None
    finally:
        await bus.close()


def device_classes() -> dict[str, DeviceClass]:
    """The DeviceClasses Tangram ships, by name: what the allocator decides with by default."""
    from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes  # noqa: PLC0415

    classes: dict[str, DeviceClass] = {}
    for manifest in load_shipped_device_classes():
        device_class = DeviceClass.from_manifest(manifest)
        classes[device_class.name] = device_class
    return classes
