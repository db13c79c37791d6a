"""`tangram ui`: a read-only web view of the fleet, served from the bus by Tangram's own process.

Only GET (and HEAD) are answered: any other method is refused with 405 before routing, so no
route added later can turn into a write action by accident. The page gets the picture inlined
(it draws at once, with or without a live connection), then follows Server-Sent Events.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import msgspec
from aiohttp import web

from tangram.bus import Bus
from tangram.fleetview.collect import follow, services
from tangram.fleetview.gpuuse import GpuUse, PrometheusError, read_gpu_use, render
from tangram.fleetview.model import FleetView

DEFAULT_LISTEN = "127.0.0.1:8484"
READ_METHODS = frozenset({"GET", "HEAD"})
PUSH_INTERVAL_S = 0.25  # at most four pictures a second per viewer, however busy the bus is
KEEPALIVE_S = 15.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def read_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method not in READ_METHODS:
        raise web.HTTPMethodNotAllowed(request.method, sorted(READ_METHODS), text="tangram ui is read-only\n")
    return await handler(request)


class FleetWeb:
    def __init__(self, bus: Bus, view: FleetView | None = None, *, prometheus_url: str | None = None) -> None:
        self.bus = bus
        self.view = view or FleetView()
        self.version = 0  # bumped on every event; each viewer pushes when it moved
        self.prometheus_url = prometheus_url  # per-pod GPU use at /gpu-use, when given

    def changed(self, _: object = None) -> None:
        self.version += 1

    async def picture(self) -> dict[str, Any]:
        data = self.view.to_builtins()
        data["services"] = msgspec.to_builtins(await services(self.bus, self.view))
        return data

    def app(self) -> web.Application:
        app = web.Application(middlewares=[read_only])
        app.router.add_get("/", self._page)
        app.router.add_get("/api/fleet", self._fleet)
        app.router.add_get("/api/stream", self._stream)
        app.router.add_get("/healthz", self._healthz)
        if self.prometheus_url is not None:
            app.router.add_get("/gpu-use", self._gpu_use)
        return app

    async def _gpu_use(self, _: web.Request) -> web.Response:
        assert self.prometheus_url is not None
        try:
            use, error = await read_gpu_use(self.prometheus_url), ""
        except PrometheusError as problem:
            use, error = GpuUse(), str(problem)
        return web.Response(
            text=render(use, self.prometheus_url, error),
            content_type="text/html",
            status=502 if error else 200,
        )

    async def _page(self, _: web.Request) -> web.Response:
        template = resources.files("tangram.fleetview").joinpath("page.html").read_text()
        # Inlined as JSON in a script element: "</" must not close it early.
        initial = json.dumps(await self.picture()).replace("</", "<\\/")
        link = '<a href="/gpu-use">GPU use by pod</a>' if self.prometheus_url is not None else ""
        page = template.replace("__GPU_USE_LINK__", link).replace("__INITIAL__", initial)
        return web.Response(text=page, content_type="text/html")

    async def _fleet(self, _: web.Request) -> web.Response:
        return web.json_response(await self.picture())

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        sent = -1
        quiet = 0.0
        while True:
            if sent != self.version:
                sent = self.version
                quiet = 0.0
                payload = json.dumps(await self.picture())
                await response.write(f"data: {payload}\n\n".encode())
            elif quiet >= KEEPALIVE_S:
                quiet = 0.0
                await response.write(b": keepalive\n\n")
            await asyncio.sleep(PUSH_INTERVAL_S)
            quiet += PUSH_INTERVAL_S


async def serve(
    bus: Bus,
    host: str,
    port: int,
    *,
    stop: asyncio.Event,
    ready: Callable[[str], None],
    prometheus_url: str | None = None,
) -> None:
    """Follow the bus and serve the view until `stop` is set; `ready` gets the URL once listening."""
    fleet_web = FleetWeb(bus, prometheus_url=prometheus_url)
    runner = web.AppRunner(fleet_web.app(), handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    listener = _listen(host, port)
    site = web.SockSite(runner, listener)
    following = asyncio.create_task(follow(bus, fleet_web.view, stop=stop, changed=fleet_web.changed))
    try:
        await site.start()
        shown = f"[{host}]" if ":" in host else host
        ready(f"http://{shown}:{listener.getsockname()[1]}/")
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if following.done():
            following.result()  # a bus failure ends the server with its error
    finally:
        stop.set()
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await runner.cleanup()


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets); ValueError naming the flag's value otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen address {text!r} is not HOST:PORT")
    return host, int(port)


def _listen(host: str, port: int) -> socket.socket:
    """A bound socket, so that port 0 gets a free port whose number can be told."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        raise
    return listener
