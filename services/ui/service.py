"""Serves the fleet's read-only web view from the bus; ready once it listens."""

from __future__ import annotations

import logging

from services.ui.settings import UiSettings
from tangram.fleetview.web import parse_listen, serve
from tangram.service import ServiceContext

log = logging.getLogger("tangram.ui")


async def run(ctx: ServiceContext, settings: UiSettings) -> None:
    host, port = parse_listen(settings.listen)

    def listening(url: str) -> None:
        log.info("web view listening", extra={"url": url})
        ctx.ready.set()

    await serve(ctx.bus, host, port, stop=ctx.stop, ready=listening)
