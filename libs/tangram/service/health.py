"""The health endpoint and Prometheus metrics of a service, on one small HTTP server."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("tangram.health")


class HealthServer:
    """/healthz (process alive), /readyz (the service says it is ready), /metrics (Prometheus), and
    /state: what the service holds, as JSON, once it sets `state` (the allocator: its ledger)."""

    def __init__(self, host: str, port: int, ready: Callable[[], bool]) -> None:
        self._host = host
        self._port = port
        self._ready = ready
        self._runner: web.AppRunner | None = None
        self.port = port
        self.state: Callable[[], object] | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/state", self._state)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        ready = self._ready()
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        response = web.Response(body=generate_latest())
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return response

    async def _state(self, _: web.Request) -> web.Response:
        if self.state is None:
            return web.json_response({"error": "this service publishes no state"}, status=404)
        return web.json_response(self.state())
