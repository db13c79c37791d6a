"""/readyz answers 503 with the reason while a service cannot work, and 200 again once it can."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tangram.natsserver import NatsServer
from tangram.service import ServiceContext
from tangram.service.runner import serve
from tangram.service.settings import ServiceSettings


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as response:
        body: dict[str, Any] = await response.json()
        return response.status, body


async def until_readyz(port: int, status: int, timeout: float = 20.0) -> dict[str, Any]:
    """The first /readyz body with `status`; the service's own state changes drive the wait."""

    async def poll() -> dict[str, Any]:
        while True:
            code, body = await readyz(port)
            if code == status:
                return body
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(poll(), timeout)


async def run_service(settings: ServiceSettings, body: Callable[[ServiceContext], Awaitable[None]]) -> int:
    async def main(ctx: ServiceContext) -> None:
        try:
            await body(ctx)
        finally:
            ctx.stop.set()

    return await serve("probe", "probe@test", settings, main)


async def test_nats_unreachable_makes_the_service_unready_until_it_is_back(nats_server: NatsServer) -> None:
    settings = ServiceSettings(nats_urls=(nats_server.url,))

    async def body(ctx: ServiceContext) -> None:
        status, answer = await readyz(ctx.health_port)
        assert (status, answer) == (503, {"ready": False, "reasons": ["service is starting"]})
        ctx.ready.set()
        assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}
        await asyncio.to_thread(nats_server.stop)
        down = await until_readyz(ctx.health_port, 503)
        assert down == {"ready": False, "reasons": ["NATS is unreachable (reconnecting)"]}
        await asyncio.to_thread(nats_server.start)  # the same port: the client reconnects by itself
        assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}

    assert await run_service(settings, body) == 0


async def test_a_services_own_check_names_its_reason(nats_server: NatsServer) -> None:
    settings = ServiceSettings(nats_urls=(nats_server.url,))
    problem: list[str] = ["kubelet refused the plugin registration: wrong version"]

    async def body(ctx: ServiceContext) -> None:
        ctx.readiness.append(lambda: problem[0] if problem else None)
        ctx.ready.set()
        down = await until_readyz(ctx.health_port, 503)
        assert down["reasons"] == ["kubelet refused the plugin registration: wrong version"]
        problem.clear()
        assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}

    assert await run_service(settings, body) == 0
