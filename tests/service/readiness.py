"""A service's /readyz, read until it answers a status."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp


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
