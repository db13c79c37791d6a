"""The allocator's start: its ledger rebuilt from the log (from its last image where it fits,
`tangram.eventlog.rebuild`), and the image of what it rebuilt written for the next start."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import yaml
from prometheus_client import Gauge

from services.allocator.settings import AllocatorSettings
from tangram.allocation import DeviceClass, FleetState
from tangram.allocation.image import ImageError, LogMark
from tangram.allocation.ledger import Ledger
from tangram.bus import BusError, is_transient
from tangram.eventlog.rebuild import Rebuilt, image_bytes, rebuild_ledger, store_image
from tangram.events import CLAIMS_STREAM
from tangram.events.deletions import DeletedClaims
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


def _fresh(ctx: ServiceContext, settings: AllocatorSettings) -> Callable[[], Ledger]:
    """What makes an empty ledger of this allocator: its classes, policy and producer."""

    def fresh() -> Ledger:
        return Ledger(
            fleet=FleetState(reconfigure_foreign_instances=settings.reconfigure_foreign_instances),
            classes=load_device_classes(settings.device_classes),
            policy=settings.policy,
            producer=ctx.bus.config.producer,
            deleted=DeletedClaims(timedelta(seconds=settings.forget_deleted_after_s)),
        )

    return fresh


async def rebuild(ctx: ServiceContext, settings: AllocatorSettings) -> Rebuilt:
    started = time.perf_counter()
    rebuilt = await rebuild_ledger(ctx.bus, _fresh(ctx, settings), use_image=settings.ledger_image)
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
    before any live event is folded into it, and stored by a task added to `background`, which
    then takes it again as the log grows (`_keep_image`); without one, it is stored here. A large
    image takes seconds to store, and the leader decides meanwhile.

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
                if background is None:
                    await _store_image(ctx, data)
                else:
                    mark = rebuilt.marks[CLAIMS_STREAM]
                    background.append(asyncio.create_task(_keep_image(ctx, settings, data, mark)))
        return rebuilt.ledger


async def _keep_image(ctx: ServiceContext, settings: AllocatorSettings, data: bytes, mark: LogMark) -> None:
    """Store the image taken at the start; then, while leading, take it again once the claims log
    has grown by `image_after_events` since, so that the next start folds a short tail however long
    this leader leads. It is taken apart from the live ledger, exactly as a start takes it: the
    last image restored and the log after it folded (a live ledger has no place in the log to mark:
    its claims arrive out of order with its own decisions)."""
    await _store_image(ctx, data)
    imaged = mark.sequence
    while not ctx.stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stop.wait(), settings.image_every_s)
        if ctx.stop.is_set():
            return
        try:
            grown = (await ctx.bus.stream_extent(CLAIMS_STREAM)).last_seq - imaged
            if grown < settings.image_after_events:
                continue
            started = time.perf_counter()
            rebuilt = await rebuild_ledger(ctx.bus, _fresh(ctx, settings))
            data = image_bytes(rebuilt.ledger, rebuilt.marks)
        except (BusError, ImageError) as error:
            log.warning("the ledger image could not be taken again", extra={"error": str(error)})
            continue
        if await _store_image(ctx, data):
            imaged = rebuilt.marks[CLAIMS_STREAM].sequence
            log.info(
                "ledger image taken again",
                extra={
                    "events": rebuilt.events,
                    "from_image": rebuilt.from_image,
                    "seconds": round(time.perf_counter() - started, 3),
                },
            )


async def _store_image(ctx: ServiceContext, data: bytes) -> bool:
    """Whether it was stored; a failure leaves the image stored before, which still fits."""
    try:
        await store_image(ctx.bus, data)
    except BusError as error:
        log.warning("the ledger image could not be written", extra={"error": str(error)})
        return False
    IMAGE_BYTES.set(len(data))
    log.info("ledger image written", extra={"bytes": len(data)})
    return True
