"""The allocator's start: its ledger rebuilt from the log (from its last image where it fits,
`tangram.eventlog.rebuild`), and the image of what it rebuilt written for the next start."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import yaml
from prometheus_client import Gauge

from services.allocator.settings import AllocatorSettings
from tangram.allocation import DeviceClass, FleetState
from tangram.allocation.image import ImageError
from tangram.allocation.ledger import Ledger
from tangram.bus import BusError, is_transient
from tangram.eventlog.rebuild import Rebuilt, image_bytes, rebuild_ledger, store_image
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.service import ServiceContext

log = logging.getLogger("tangram.allocator")

REBUILD_EVENTS = Gauge("tangram_allocator_rebuild_events", "Events folded at the last start")
REBUILD_SECONDS = Gauge("tangram_allocator_rebuild_seconds", "Time the last rebuild took")
REBUILD_FROM_IMAGE = Gauge(
    "tangram_allocator_rebuild_from_image", "1 when the last rebuild restored the ledger image, else 0"
)
IMAGE_BYTES = Gauge("tangram_allocator_image_bytes", "Size of the last ledger image written")


def load_device_classes(extra: Path | None) -> dict[str, DeviceClass]:
    documents = list(load_shipped_device_classes())
    if extra is not None:
        for path in sorted(extra.glob("*.yaml")):
            documents.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    classes: dict[str, DeviceClass] = {}
    for document in documents:
        device_class = DeviceClass.from_manifest(document)
        classes[device_class.name] = device_class
    return classes


async def rebuild(ctx: ServiceContext, settings: AllocatorSettings) -> Rebuilt:
    started = time.perf_counter()

    def fresh() -> Ledger:
        return Ledger(
            fleet=FleetState(reconfigure_foreign_instances=settings.reconfigure_foreign_instances),
            classes=load_device_classes(settings.device_classes),
            policy=settings.policy,
            producer=ctx.bus.config.producer,
        )

    rebuilt = await rebuild_ledger(ctx.bus, fresh, use_image=settings.ledger_image)
    if rebuilt.set_aside is not None:
        log.warning(
            "the ledger image is set aside; the whole log is folded", extra={"error": rebuilt.set_aside}
        )
    elapsed = time.perf_counter() - started
    REBUILD_EVENTS.set(rebuilt.events)
    REBUILD_SECONDS.set(elapsed)
    REBUILD_FROM_IMAGE.set(1 if rebuilt.from_image else 0)
    log.info(
        "state rebuilt from the log",
        extra={
            "events": rebuilt.events,
            "seconds": round(elapsed, 3),
            "claims": len(rebuilt.ledger.decided),
            "from_image": rebuilt.from_image,
        },
    )
    return rebuilt


async def rebuilt_ledger(
    ctx: ServiceContext, settings: AllocatorSettings, background: list[asyncio.Task[None]] | None = None
) -> Ledger | None:
    """The ledger folded from the log; None when stopped first. Its image is taken once rebuilt,
    before any live event is folded into it, and stored in a task added to `background` (awaited
    here without one): a large image takes seconds to store, and the leader decides meanwhile.

    A NATS server lost mid-read leaves the cluster electing stream leaders, which can outlast one
    request's retries: the log is read again from the start, into a fresh ledger, until it can be.
    """
    while True:
        try:
            rebuilt = await rebuild(ctx, settings)
        except BusError as error:
            if not is_transient(error):
                raise
            log.warning("the log could not be read; reading it again", extra={"error": str(error)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stop.wait(), 1.0)
            if ctx.stop.is_set():
                return None
            continue
        if rebuilt.marks:
            try:
                data = image_bytes(rebuilt.ledger, rebuilt.marks)
            except ImageError as error:
                log.warning("the ledger image could not be taken", extra={"error": str(error)})
            else:
                store = _store_image(ctx, data)
                if background is None:
                    await store
                else:
                    background.append(asyncio.create_task(store))
        return rebuilt.ledger


async def _store_image(ctx: ServiceContext, data: bytes) -> None:
    try:
        await store_image(ctx.bus, data)
    except BusError as error:
        log.warning("the ledger image could not be written", extra={"error": str(error)})
        return
    IMAGE_BYTES.set(len(data))
    log.info("ledger image written", extra={"bytes": len(data)})
