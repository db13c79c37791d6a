"""A local API server per test, a kubernetes_asyncio client for it, and slices of simulated machines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tangram.kubernetes.api import connect
from tests.kubernetes.api.apiserver import LocalApiServer


@pytest.fixture
async def apiserver() -> AsyncIterator[LocalApiServer]:
    server = LocalApiServer(k8s_version="1.36")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def kube_api(apiserver: LocalApiServer) -> AsyncIterator[Any]:
    client = await connect(host=apiserver.url)
    try:
        yield client
    finally:
        await client.close()
