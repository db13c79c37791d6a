"""The health endpoint and Prometheus metrics of a service, on one small HTTP server."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("tangram.health")

# Why the service cannot do its work right now (shown in /readyz), or None when it can.
ReadinessCheck = Callable[[], str | None]
STARTING = "service is starting"


class HealthServer:
    """/healthz (process alive), /readyz (started and every readiness check passes), /metrics,
    and /state: what the service holds, as JSON, once it sets `state` (the allocator: its ledger).

    `checks` is read at each request, so checks a service adds after start count at once.
    """

    def __init__(
        self, host: str, port: int, ready: Callable[[], bool], checks: Sequence[ReadinessCheck] = ()
    ) -> None:
        self._host = host
        self._port = port
        self._ready = ready
        self._checks = checks
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

    def not_ready_reasons(self) -> list[str]:
        reasons = [] if self._ready() else [STARTING]
        for check in self._checks:
            try:
                reason = check()
            except Exception as error:  # a broken check must say so, not take the endpoint down
                log.exception("readiness check failed")
                reason = f"readiness check failed: {error}"
            if reason:
                reasons.append(reason)
        return reasons

    async def _readyz(self, _: web.Request) -> web.Response:
        reasons = self.not_ready_reasons()
        return web.json_response({"ready": not reasons, "reasons": reasons}, status=503 if reasons else 200)

    async def _metrics(self, _: web.Request) -> web.Response:
        response = web.Response(body=generate_latest())
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return response

    async def _state(self, _: web.Request) -> web.Response:
        if self.state is None:
            return web.json_response({"error": "this service publishes no state"}, status=404)
        return web.json_response(self.state())
